"""One unary server call as every policy layer sees it, whichever transport carries it.

What it decides: the shape of a call between a transport and the unary pipeline
(:mod:`common.pipeline`). A transport — the completion-queue endpoint (``common.raw_unary``) or
the ``grpc.aio`` binding (``common.aio_unary``) — builds one object per call that satisfies
:class:`UnaryCall`, hands it to the pipeline once its request bytes are in, and sends exactly
the one answer the pipeline or the handler gives it with :meth:`UnaryCall.reply` or
:meth:`UnaryCall.reject`. The layers read the call (method, metadata, peer, deadline, bytes)
and keep their per-call state in its slots (``started``, ``span``), so composing them costs
no allocation per layer per call.

Why a protocol: the transports differ in how they receive and send (completion-queue batches
versus a ``ServicerContext``), and nothing above them needs to know which one it runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Protocol

import grpc
from opentelemetry import trace

from common.errors import RichError

__all__ = ["HELD", "Held", "Metadata", "UnaryCall", "Verdict", "cancelled_code"]

Metadata = Sequence[tuple[str, str | bytes]]


class Held:
    """A layer took the call and will answer it later (the stop gate while closed)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HELD"


HELD: Final = Held()
# What a layer's ``admit`` says: None (go on), the rejection to send, or HELD.
Verdict = RichError | Held | None


class UnaryCall(Protocol):
    """A unary call in flight, between its transport and the pipeline."""

    method: str  # /pkg.Service/Method
    metadata: Metadata
    request: bytes  # the request message as received
    # The client's deadline, absolute in time.time() seconds; None when it set none.
    deadline: float | None
    started: float  # time.perf_counter() when the call arrived
    span: trace.Span  # its SERVER span (trace.INVALID_SPAN when none is made)
    # Run once if the call ends (client cancel, deadline, server stop) before it is answered.
    on_cancel: Callable[[], object] | None

    @property
    def open(self) -> bool:
        """Neither answered nor cancelled yet."""
        ...

    def peer(self) -> str: ...

    def time_remaining(self) -> float | None: ...

    def reply(self, payload: bytes) -> None:
        """Answer OK with the serialized response; dropped if the call already ended."""
        ...

    def reject(self, err: RichError) -> None:
        """Answer with a typed rejection and its rich details; dropped if ended."""
        ...


def cancelled_code(call: UnaryCall, now: float) -> grpc.StatusCode:
    """How a call that ended unanswered at ``now`` (time.time()) is recorded: DEADLINE_EXCEEDED
    when its deadline had passed, else CANCELLED."""
    deadline = call.deadline
    if deadline is not None and now >= deadline:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED
