"""The size layer of the unary pipeline: request messages above a method's limit, refused unread.

What it decides: the answer to a unary request larger than its method takes —
``RESOURCE_EXHAUSTED`` with ``ErrorInfo`` reason ``MESSAGE_TOO_LARGE`` and metadata
``size_bytes`` / ``limit_bytes`` (and a negative retry pushback: waiting does not help) — on
every transport. The limit is a per-method setting given when the host adds the method
(``ServiceHost.add_unary(..., max_request_bytes=...)``); gRPC core's own, larger receive limit
(``common.serving_options``) answers without a typed error.

Why before the credential check: huge bytes are refused whatever the credential, as gRPC
core's own limit refuses them, without spending anything on them.
"""

from __future__ import annotations

import grpc

from common.call import UnaryCall, Verdict
from common.errors import Reason, RichError
from common.pipeline import Layer

__all__ = ["SizeLimit", "message_too_large"]


def message_too_large(method: str, size: int, limit: int) -> RichError:
    """A request of ``size`` bytes to ``method``, which takes at most ``limit``."""
    return RichError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"the request is {size} bytes; {method} takes at most {limit}",
        reason=Reason.MESSAGE_TOO_LARGE,
        metadata={"size_bytes": str(size), "limit_bytes": str(limit)},
    )


class SizeLimit(Layer):
    """Refuses a method's requests above ``limit`` bytes."""

    def __init__(self, method: str, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"max_request_bytes must be positive, got {limit}")
        self._method = method
        self.limit = limit

    def admit(self, call: UnaryCall) -> Verdict:
        size = len(call.request)
        if size > self.limit:
            return message_too_large(self._method, size, self.limit)
        return None
