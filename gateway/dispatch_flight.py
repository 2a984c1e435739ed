"""One batch on the wire after its launch: its race, its timers and how each attempt settles.

What it decides: what an attempt's end means (success, ``REPLICA_BUSY`` backpressure, a
TIMEOUT that proves a cost floor, any other fault, or a cancelled hedge loser) for the router,
the breaker, the cost models and the hedge histogram; when the gateway answers a request
itself before its deadline (the give-up timer, ADR 0011); how a failed batch's requests are
retried elsewhere or answered; and when a hedge is raced. Why apart: this is the outcome half
of :class:`~gateway.dispatcher.VersionDispatcher` (mixed in as :class:`FlightSettlement`),
separable from the scheduling loop and membership that decide what is sent where.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from opentelemetry import trace

from common.clock import Clock
from common.durations import to_seconds
from common.errors import (
    Reason,
    RichError,
    deadline_missed,
    internal,
    parse_rpc_error,
    unavailable,
)
from common.grpc_metrics import UnaryClientRecorder
from common.tracing import end_rpc_span
from gateway.batching import (
    Batch,
    FlushReason,
    OnlineCostModel,
    Rejected,
)
from gateway.batching.fixed import BatchPolicy
from gateway.dispatch_pending import InferResult, PendingRequest, rejection_error
from gateway.replicas import NOMINAL_BATCH_S
from gateway.routing import (
    AttemptPolicy,
    CostFloor,
    HedgePolicy,
    HedgeRace,
    Lease,
    NoCapacity,
    Outcome,
    PeakEwmaRouter,
    RaceVerdict,
)
from halcyon.v1 import infer_pb2, worker_pb2

__all__ = ["MAX_ATTEMPTS", "FlightSettlement"]

MAX_ATTEMPTS = 2  # a request is tried on at most this many batches after a fault

_FLUSH = {
    FlushReason.DEADLINE: infer_pb2.FLUSH_REASON_DEADLINE,
    FlushReason.FULL: infer_pb2.FLUSH_REASON_FULL,
    FlushReason.LINGER: infer_pb2.FLUSH_REASON_LINGER,
    FlushReason.CAPACITY: infer_pb2.FLUSH_REASON_CAPACITY,
}


def _call_code(task: asyncio.Task[worker_pb2.ExecuteBatchResponse]) -> grpc.StatusCode:
    if task.cancelled():
        return grpc.StatusCode.CANCELLED
    err = task.exception()
    if err is None:
        return grpc.StatusCode.OK
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code()
    return grpc.StatusCode.UNKNOWN


@dataclass(slots=True, eq=False)
class _Flight:
    """One batch on the wire: its race, its RPC tasks and how it is going."""

    batch: Batch[PendingRequest]
    race: HedgeRace[Lease]
    span: trace.Span
    calls: dict[int, asyncio.Task[worker_pb2.ExecuteBatchResponse]] = field(default_factory=dict)
    hedge_timer: asyncio.TimerHandle | None = None
    # Per attempt (lease id): the conservative prediction its timeout was derived from.
    predicted: dict[int, float | None] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)  # replicas an attempt went to
    ends_by: float = -math.inf  # every call on the wire has ended by then (its timeout)
    give_up_timer: asyncio.TimerHandle | None = None


class FlightSettlement:
    """The outcome half of :class:`~gateway.dispatcher.VersionDispatcher`: what the end of
    each attempt of a batch on the wire means, and the timers racing it."""

    # Set by VersionDispatcher.__init__.
    model: str
    version: str
    batcher: BatchPolicy[PendingRequest]
    router: PeakEwmaRouter
    _clock: Clock
    _hedging: HedgePolicy
    _call_metrics: UnaryClientRecorder | None
    _on_batch: Callable[[str, str, Batch[PendingRequest], str, float, bool], None]
    _on_hedge: Callable[[str], None]
    _on_busy: Callable[[], None]
    _attempts: AttemptPolicy
    _flights: dict[int, _Flight]
    _busy_until: dict[str, float]
    _models: dict[str, OnlineCostModel]
    _floors: dict[str, CostFloor]
    _breakers_dirty: bool

    if TYPE_CHECKING:  # defined by VersionDispatcher

        def kick(self) -> None: ...

        def _call(self, flight: _Flight, lease: Lease) -> None: ...

    # -- answering before the deadline ------------------------------------------------------

    def _arm_give_up(self, flight: _Flight, now: float) -> None:
        """Time the next answer-by of a request in the flight, if it comes before every call
        on the wire has ended (their own ends answer the requests otherwise)."""
        if flight.give_up_timer is not None or flight.race.settled:
            return
        due = math.inf
        for pending in flight.batch.payloads:
            if not pending.answered and pending.answer_by < due:
                due = pending.answer_by
        if due < flight.ends_by:
            flight.give_up_timer = asyncio.get_running_loop().call_later(
                max(0.0, due - now), self._give_up, flight
            )

    def _give_up(self, flight: _Flight) -> None:
        """Answer the flight's requests whose answer-by has come; the calls go on for the rest
        (and end by their own timeout)."""
        flight.give_up_timer = None
        if flight.race.settled:
            return
        now = self._clock.now()
        for pending in flight.batch.payloads:
            if not pending.answered and pending.answer_by <= now + 0.0005:
                pending.reject(
                    deadline_missed(
                        f"no answer from replica {'/'.join(sorted(flight.tried))} before the "
                        "deadline; answered now so that the reply reaches the client in time"
                    )
                )
        self._arm_give_up(flight, now)

    def _on_call_done(
        self,
        flight: _Flight,
        lease: Lease,
        task: asyncio.Task[worker_pb2.ExecuteBatchResponse],
        started: float,
        span: trace.Span | None = None,
    ) -> None:
        flight.calls.pop(lease.lease_id, None)
        if self._call_metrics is not None or span is not None:
            code = _call_code(task)
            if self._call_metrics is not None:
                self._call_metrics.finish(started, code)
            if span is not None:
                end_rpc_span(
                    span, code, "" if code is grpc.StatusCode.OK else code.name, server=False
                )
        if task.cancelled():
            # A hedge loser we cancelled: release quietly, it says nothing about the replica.
            self.router.complete(lease, Outcome.CANCELLED, None, self._clock.now())
            return
        err = task.exception()
        if err is None:
            self._settle(flight, lease, task.result(), None)
        elif isinstance(err, grpc.aio.AioRpcError):
            rich = parse_rpc_error(err)
            if rich.code is grpc.StatusCode.DEADLINE_EXCEEDED and not rich.reason:
                # The call's own timeout: the attempt got no answer in time.
                rich = RichError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"replica {lease.replica_id} did not answer within the attempt timeout",
                    reason=Reason.UPSTREAM_FAILURE,
                    metadata={"attempt": "timeout"},
                )
            self._settle(flight, lease, None, rich)
        else:
            self._settle(flight, lease, None, internal(str(err)))

    def _settle(
        self,
        flight: _Flight,
        lease: Lease,
        response: worker_pb2.ExecuteBatchResponse | None,
        err: RichError | None,
    ) -> None:
        now = self._clock.now()
        latency = now - lease.dispatched_at
        busy = err is not None and err.reason == Reason.REPLICA_BUSY
        # A hedge race already won (or lost) by another attempt: this one finished before its
        # cancellation landed. Its replica's outcome still counts; the batch is already done.
        late = flight.race.settled
        if response is not None:
            self.router.complete(lease, Outcome.SUCCESS, latency, now)
            self._hedging.record_latency(latency)
            floor = self._floors.get(lease.replica_id)
            if floor is not None:
                floor.answered(flight.batch.tokens, latency)
        elif busy:
            self.router.complete(lease, Outcome.BUSY, None, now)
            retry = err.retry_after_s if err is not None and err.retry_after_s else 0.001
            self._busy_until[lease.replica_id] = now + retry
            self._on_busy()
        elif err is not None and err.metadata.get("attempt") == "timeout":
            verdict = self._attempts.judge_expiry(latency, flight.predicted.get(lease.lease_id))
            self.router.complete(lease, verdict, latency, now)
            self._breakers_dirty = True
            # Overdue or cut at the deadline: either way the batch costs more than this there.
            if lease.replica_id in self.router:  # still a member
                floor = self._floors.setdefault(lease.replica_id, CostFloor())
                floor.ran_out(flight.batch.tokens, latency)
        else:
            self.router.complete(lease, Outcome.FAULT, None, now)
            self._breakers_dirty = True
        if late:
            return
        result = flight.race.settle(lease, response is not None)
        if result.verdict is RaceVerdict.PENDING:
            return
        if flight.hedge_timer is not None:
            flight.hedge_timer.cancel()
        if flight.give_up_timer is not None:
            flight.give_up_timer.cancel()
            flight.give_up_timer = None
        self._flights.pop(flight.batch.batch_id, None)
        for loser in result.cancel:
            call = flight.calls.get(loser.lease_id)
            if call is not None:
                call.cancel()  # the worker sees the cancellation and frees its device
        batch = flight.batch
        if result.verdict is RaceVerdict.WON and response is not None:
            if flight.race.hedged:
                self._on_hedge("won" if lease.hedge else "lost")
            self.batcher.complete(batch, latency)
            self._deliver(batch, lease, response, latency)
            flight.span.end()
            self._on_batch(self.model, self.version, batch, lease.replica_id, latency, True)
        else:
            self._recover(batch, err, busy, now, frozenset(flight.tried))
            flight.span.set_status(trace.StatusCode.ERROR, err.message if err else "failed")
            flight.span.end()
            if not busy:  # backpressure is not a failed batch; busy_retries counts it
                self._on_batch(self.model, self.version, batch, lease.replica_id, latency, False)
        self.kick()

    def _deliver(
        self,
        batch: Batch[PendingRequest],
        lease: Lease,
        response: worker_pb2.ExecuteBatchResponse,
        latency: float,
    ) -> None:
        results = {r.id: r for r in response.results}
        device = to_seconds(response.device_time) if response.device_time else latency
        flush = _FLUSH.get(batch.reason, infer_pb2.FLUSH_REASON_UNSPECIFIED)
        size = len(batch.items)
        for pending in batch.payloads:
            r = results.get(pending.request_id)
            if r is None:
                pending.reject(
                    RichError(
                        grpc.StatusCode.INTERNAL,
                        f"replica {lease.replica_id} returned no result for the request",
                        reason=Reason.UPSTREAM_FAILURE,
                    )
                )
                continue
            pending.answer(
                InferResult(
                    output=r.output,
                    replica_id=lease.replica_id,
                    hedged=lease.hedge,
                    dispatched_at=batch.dispatched_at,
                    execution_s=device,
                    batch_size=size,
                    batch_tokens=batch.tokens,
                    flush_reason=flush,
                    output_tokens=r.output_tokens,
                )
            )

    def _recover(
        self,
        batch: Batch[PendingRequest],
        err: RichError | None,
        busy: bool,
        now: float,
        tried: frozenset[str],
    ) -> None:
        """Give a failed batch's requests another chance, or answer them. A retry avoids the
        replicas this batch failed on — for its own requests only (see the batcher)."""
        items = self.batcher.fail(batch, requeue=False)
        for item in items:
            pending = item.payload
            if pending.answered:
                continue
            if now >= pending.answer_by:
                # Its answer is due (a call cut at the answer-by): a retry could only reach
                # the client after its own deadline, as a bare DEADLINE_EXCEEDED.
                pending.reject(
                    deadline_missed(
                        f"no answer from replica {'/'.join(sorted(tried))} before the deadline"
                        f" ({err.message if err else 'the replica failed'})"
                    )
                )
                continue
            if not busy:
                pending.attempts += 1
            if pending.attempts >= MAX_ATTEMPTS:
                detail = err.message if err else "the replica failed"
                pending.reject(
                    unavailable(
                        Reason.UPSTREAM_FAILURE,
                        f"the batch failed on the fleet ({detail})",
                        self._retry_hint(now),
                    )
                )
                continue
            if not busy:
                pending.avoid = pending.avoid | tried
            verdict = self.batcher.submit(
                pending,
                tokens=item.tokens,
                deadline=item.deadline,
                lane=item.lane,
                avoid=pending.avoid,
                output_tokens=item.output_tokens,
            )
            if isinstance(verdict, Rejected):
                pending.reject(rejection_error(verdict, now))

    def _retry_hint(self, now: float) -> float | None:
        """Seconds until another replica is predicted to take work, or None if none exists."""
        probe = self.router.pick(now)
        if isinstance(probe, NoCapacity):
            return probe.retry_after_s
        self.router.complete(probe, Outcome.CANCELLED, None, now)
        return 0.0

    # -- hedging ----------------------------------------------------------------------------

    def _maybe_hedge(self, flight: _Flight) -> None:
        flight.hedge_timer = None
        if flight.race.settled or flight.race.hedged:
            return
        now = self._clock.now()
        batch = flight.batch
        earliest = min(p.deadline for p in batch.payloads)

        def predicted(replica_id: str) -> float:
            model = self._models.get(replica_id)  # learned, or the prior for want of better
            if model is not None:
                return model.upper(batch.tokens, batch.longest)
            return self.router.latency_estimate(replica_id, now) or NOMINAL_BATCH_S

        hedge = self._hedging.may_hedge(
            now,
            self.router,
            flight.race.primary,
            earliest,
            predicted,
            waiting=self.batcher.depth,
        )
        if not isinstance(hedge, Lease):
            if hedge.wait_s:
                flight.hedge_timer = asyncio.get_running_loop().call_later(
                    hedge.wait_s, self._maybe_hedge, flight
                )
            else:
                self._on_hedge("declined")
            return
        self._on_hedge("fired")
        flight.race.add_hedge(hedge)
        self._call(flight, hedge)
