"""Typed JSON errors: how every refusal of the console's HTTP API is expressed.

What it decides: the one mapping between a refusal and its HTTP answer. Every error body is

    {"error": {"http_status": 409, "code": "FAILED_PRECONDITION",
               "reason": "NO_ACTIVE_ROLLOUT", "message": "...", "metadata": {...}}}

``code`` and ``reason`` mirror the gRPC status and its ``ErrorInfo.reason`` (domain
``halcyon.dev``) exactly: an action refused by the servicer (see
:mod:`controller.console.operations`) carries the status the same RPC would have sent, and
the console's own refusals use the reasons of :class:`common.errors.Reason` where one fits
(``MISSING_CREDENTIALS``, ``INVALID_CREDENTIALS``, ``WRONG_ROLE``) plus three of the console's
own for what has no gRPC counterpart (:data:`CROSS_ORIGIN`, :data:`CSRF_TOKEN_MISMATCH`,
:data:`HOST_NOT_ALLOWED`). A script can switch on ``reason`` as a gRPC client does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from common.errors import DETAILS_KEY, DOMAIN, Reason

__all__ = [
    "CROSS_ORIGIN",
    "CSRF_TOKEN_MISMATCH",
    "HOST_NOT_ALLOWED",
    "HTTP_STATUS",
    "ConsoleError",
    "from_status",
]

# A state-changing request whose Origin is not the console's own (a cross-site form or fetch).
CROSS_ORIGIN = "CROSS_ORIGIN"
# A state-changing request on a session cookie without that session's CSRF token.
CSRF_TOKEN_MISMATCH = "CSRF_TOKEN_MISMATCH"
# A Host header that is not a loopback name on a loopback console (DNS rebinding).
HOST_NOT_ALLOWED = "HOST_NOT_ALLOWED"

# gRPC code -> HTTP status (as Google's HTTP/JSON transcoding maps them).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


@dataclass(eq=False)
class ConsoleError(Exception):
    """A refusal with its gRPC-equivalent code and reason; :meth:`body` is the JSON answer."""

    code: grpc.StatusCode
    message: str
    reason: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    retry_after_s: float | None = None

    def __post_init__(self) -> None:
        Exception.__init__(self, self.code, self.message)

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "http_status": self.http_status,
            "code": self.code.name,
            "reason": self.reason or (Reason.INTERNAL if self.http_status == 500 else None),
            "domain": DOMAIN,
            "message": self.message,
            "metadata": dict(self.metadata),
        }
        if self.retry_after_s is not None:
            error["retry_after_s"] = self.retry_after_s
        return {"error": error}

    def text(self) -> str:
        return json.dumps(self.body())

    def headers(self) -> dict[str, str]:
        """``Retry-After`` (whole seconds, rounded up) when retrying later can work."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, -(-int(self.retry_after_s * 1000) // 1000)))}


def _code_of(value: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN


def from_status(
    code: grpc.StatusCode,
    message: str,
    trailers: Sequence[tuple[str, str | bytes]] | Mapping[str, str | bytes] | None,
) -> ConsoleError:
    """The console error for a status a servicer aborted with (its rich details unpacked)."""
    items = trailers.items() if isinstance(trailers, Mapping) else (trailers or ())
    error = ConsoleError(code if code != grpc.StatusCode.OK else grpc.StatusCode.UNKNOWN, message)
    for key, value in items:
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except DecodeError:
            continue
        error.code = _code_of(status.code)
        error.message = status.message or message
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            retry = error_details_pb2.RetryInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info):
                error.reason = info.reason
                error.metadata = dict(info.metadata)
            elif detail.Is(retry.DESCRIPTOR) and detail.Unpack(retry):
                error.retry_after_s = retry.retry_delay.ToNanoseconds() / 1e9
    return error
