"""A request's life in the dispatcher: admitted, waiting, answered exactly once.

What it decides: how a request is answered (a result, a typed error, or cancelled when the
client left first) and that it is answered once only, calling back whoever waits for it
synchronously; and which typed error a batcher refusal or drop becomes
(:func:`rejection_error`), retry advice included. Kept apart from
:mod:`gateway.dispatcher` because the gateway's front end and the batcher's payloads use these
without the asyncio shell around them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace

from common.errors import Reason, RichError, deadline_missed, unavailable
from gateway.batching import Dropped, DropReason, Rejected
from gateway.rejections import unreachable_error
from gateway.validation import ValidRequest

log = logging.getLogger("halcyon.gateway.dispatcher")

__all__ = ["InferResult", "PendingRequest", "rejection_error"]


@dataclass(slots=True)
class InferResult:
    """What a served request learns about how it was served."""

    output: str
    replica_id: str
    hedged: bool
    dispatched_at: float
    execution_s: float
    batch_size: int
    batch_tokens: int
    flush_reason: int
    output_tokens: int


@dataclass(slots=True, eq=False)
class PendingRequest:
    """A request from admission until it is answered; the batcher's payload.

    It is answered exactly once — a result, a typed error, or cancelled when the client left
    first — and whoever waits for it (:meth:`when_answered`) is called back synchronously, from
    the code that answered it: no future, no task and no extra loop turn per request.
    """

    request_id: str
    valid: ValidRequest
    received_at: float
    deadline: float
    span_context: trace.SpanContext | None = None
    attempts: int = 0
    # Replicas this request's batches already failed on: its retry goes elsewhere if it can.
    avoid: frozenset[str] = frozenset()
    # When the gateway answers it itself if no replica has (set on submit; AttemptPolicy).
    answer_by: float = math.inf
    answered: bool = False
    cancelled: bool = False
    result: InferResult | None = None
    error: BaseException | None = None
    _waiter: Callable[[PendingRequest], None] | None = None

    def answer(self, result: InferResult) -> None:
        if not self.answered:
            self.answered = True
            self.result = result
            self._notify()

    def reject(self, err: BaseException) -> None:
        if not self.answered:
            self.answered = True
            self.error = err
            self._notify()

    def cancel(self) -> None:
        """The client went away: whatever is still to come for it is dropped."""
        if not self.answered:
            self.answered = True
            self.cancelled = True
            self._notify()

    def when_answered(self, waiter: Callable[[PendingRequest], None]) -> None:
        """Call ``waiter`` once answered (now, if it already is)."""
        if self.answered:
            waiter(self)
        else:
            self._waiter = waiter

    def _notify(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        try:
            waiter(self)
        except Exception:
            # The answering code (a batch's delivery loop) must go on to the next request.
            log.exception("answering a request failed", extra={"request_id": self.request_id})


def rejection_error(rejected: Rejected | Dropped[PendingRequest], now: float) -> RichError:
    """The typed error for a batcher refusal or drop, with computed retry advice."""
    reason = rejected.reason
    predicted = rejected.predicted_completion
    if reason is DropReason.DEADLINE_UNREACHABLE:
        return unreachable_error(
            rejected.parts if isinstance(rejected, Rejected) else None,
            None if predicted is None else max(0.0, predicted - now),
        )
    if reason is DropReason.DEADLINE_MISSED:
        return deadline_missed("evicted: the request can no longer finish before its deadline")
    retry = rejected.retry_after if isinstance(rejected, Rejected) else None
    if reason is DropReason.SHED_FOR_GOODPUT:
        err = unavailable(
            Reason.OVERLOADED,
            "shed under overload so that more requests finish within their deadlines",
            retry,
        )
        err.metadata["shed"] = "goodput"
        return err
    if reason is DropReason.QUEUE_FULL:
        return unavailable(Reason.QUEUE_FULL, "the batch queue is full", retry)
    if reason is DropReason.CLOSED:
        return unavailable(Reason.SHUTTING_DOWN, "the gateway is shutting down", None)
    return unavailable(Reason.NO_CAPACITY, "no replica can take this version now", retry)
