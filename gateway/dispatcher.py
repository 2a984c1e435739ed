"""Runs one (model, version): the batcher decides when and what, the router decides where.

What it decides: nothing of its own — it is the asyncio shell around the pure policies. It
turns events (a request queued, a batch answered, a timer) into calls on the
:class:`~gateway.batching.DeadlineBatcher` and the
:class:`~gateway.routing.PeakEwmaRouter`, sends each batch to a worker with
``ExecuteBatch`` (gRPC deadline = the latest deadline in the batch; when spans are recorded, a
``batch`` span linked to its requests' spans, and under it one CLIENT span per call, made as
the OpenTelemetry client interceptor would, whose W3C context goes in the metadata), races a
hedge when the hedge policy allows, and answers every request exactly once: with its result,
or with the typed reason the batcher or the fleet gave.

Each ``ExecuteBatch`` call has an *attempt timeout* derived from the cost model's prediction
for that batch on that replica (:class:`~gateway.routing.AttemptPolicy`), never from the
requests' deadlines alone: a frozen replica costs a request one attempt timeout, then it is
retried elsewhere. A request still waiting on a replica shortly before its deadline is answered
by the gateway itself (``DEADLINE_EXCEEDED / DEADLINE_MISSED``), so the client gets a reason
before its own deadline fires (ADR 0011).

The prediction exists from a replica's first batch on: when a replica first joins, its cost
model is seeded from the warm-up batches its worker measured before registering
(:mod:`gateway.warmup`), and the router's prior is their measured time. A replica with no
prediction at all (a worker without warm-up, before its first answer) has no attempt timeout
but its requests' answer-by. A call that ran out of time proves a lower bound on that batch's
cost there (:class:`~gateway.routing.CostFloor`); no prediction the dispatcher acts on is less,
and the next attempt may take twice the bound, so a replica slower than its model is given more
time next (a half-open probe included), not timed out for ever.

Outcome handling follows the design's distinctions:

* success — the router learns the latency, the batcher's per-replica cost model learns the
  batch time, the hedge histogram learns the latency, lower bounds it refutes are dropped;
* ``REPLICA_BUSY`` — backpressure, not a fault: the replica is skipped for its advertised
  retry delay, the batch goes back to the queue, the breaker is untouched;
* no answer within the attempt timeout — a TIMEOUT (a breaker failure and a latency lower
  bound; timeouts in a row open the breaker at once); requests are retried as for a failure;
  the batch's cost on the replica is more than the call waited, cut short or not;
* any other failure — a fault for the breaker; requests get one more try elsewhere if their
  deadline still allows, otherwise ``UNAVAILABLE / UPSTREAM_FAILURE``. The retry avoids the
  replicas *that request* failed on (the batcher holds it out of their batches); the replica
  stays open to everyone else's work — one request's failure costs only that request;
* a hedge loser — cancelled (the worker frees its device) and recorded as nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
from opentelemetry import trace
from opentelemetry.trace import Link

from common.clock import Clock
from common.cost_samples import CostSampleValue
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
from common.tracing import end_rpc_span, inject_metadata, spans_recorded, start_client_span
from gateway.batching import (
    Batch,
    Dropped,
    DropReason,
    FlushReason,
    Lane,
    OnlineCostModel,
    Rejected,
)
from gateway.batching.fixed import BatchPolicy
from gateway.rejections import unreachable_error
from gateway.routing import (
    AttemptPolicy,
    BreakerState,
    CostFloor,
    HedgePolicy,
    HedgeRace,
    Lease,
    NoCapacity,
    Outcome,
    PeakEwmaRouter,
    RaceVerdict,
    ReplicaSpec,
)
from gateway.validation import ValidRequest
from gateway.warmup import prior_latency_s, seeded_cost_model
from gateway.worker_pool import WorkerPool
from halcyon.v1 import infer_pb2, worker_pb2

log = logging.getLogger("halcyon.gateway.dispatcher")

EXECUTE_BATCH_METHOD = "/halcyon.v1.WorkerService/ExecuteBatch"
MAX_ATTEMPTS = 2  # a request is tried on at most this many batches after a fault
# Nominal device time for a typical batch at speed 1.0, the router's prior before any sample.
NOMINAL_BATCH_S = 0.05

_FLUSH = {
    FlushReason.DEADLINE: infer_pb2.FLUSH_REASON_DEADLINE,
    FlushReason.FULL: infer_pb2.FLUSH_REASON_FULL,
    FlushReason.LINGER: infer_pb2.FLUSH_REASON_LINGER,
    FlushReason.CAPACITY: infer_pb2.FLUSH_REASON_CAPACITY,
}


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


class VersionDispatcher:
    """Batches and routes the requests of one (model, version)."""

    def __init__(
        self,
        model: str,
        version: str,
        *,
        clock: Clock,
        batcher: BatchPolicy[PendingRequest],  # a DeadlineBatcher, or a --batching baseline
        router: PeakEwmaRouter,
        hedging: HedgePolicy,
        pool: WorkerPool,
        fleet_metadata: tuple[tuple[str, str], ...],
        call_metrics: UnaryClientRecorder | None = None,
        on_batch: Callable[[str, str, Batch[PendingRequest], str, float, bool], None],
        on_flush: Callable[[FlushReason], None],
        on_hedge: Callable[[str], None],
        on_busy: Callable[[], None],
        attempts: AttemptPolicy | None = None,
    ) -> None:
        self.model = model
        self.version = version
        self._clock = clock
        self.batcher = batcher
        self.router = router
        self._hedging = hedging
        self._pool = pool
        self._call_metrics = call_metrics
        self._fleet_md = fleet_metadata
        self._on_batch = on_batch
        self._on_flush = on_flush
        self._on_hedge = on_hedge
        self._on_busy = on_busy
        self._attempts = attempts or AttemptPolicy()
        self._tracer = trace.get_tracer("halcyon.gateway")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_handle: asyncio.Handle | None = None
        self._stopped = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._flights: dict[int, _Flight] = {}
        self._busy_until: dict[str, float] = {}
        self.replicas: dict[str, str] = {}  # replica id -> address
        # Each member's learned cost, kept while the batcher does not plan for it (breaker
        # open, draining) so that it neither starts over nor reads as "unknown" meanwhile.
        self._models: dict[str, OnlineCostModel] = {}
        # What calls that ran out of time proved about each member's cost (kept likewise).
        self._floors: dict[str, CostFloor] = {}
        self._slots: dict[str, int] = {}
        self._draining: set[str] = set()
        self._shunned: set[str] = set()  # breaker open: not offered to the batcher as capacity
        self._breakers_dirty = False  # a fault was recorded: a breaker may have opened

    # -- membership -------------------------------------------------------------------------

    def upsert_replica(
        self,
        replica_id: str,
        address: str,
        slots: int,
        speed: float,
        *,
        warmup: Sequence[CostSampleValue] = (),
    ) -> None:
        """Add a replica or update one; ``warmup`` (the batches its worker measured) seeds
        its cost model when it first joins, and only then: a known replica keeps what it
        learned."""
        now = self._clock.now()
        self._pool.open(replica_id, address)
        if replica_id not in self._models:
            seeded = seeded_cost_model(warmup)
            if seeded is not None:
                self._models[replica_id] = seeded  # _plan_for hands it to the batcher
        prior = prior_latency_s(warmup)
        self.router.upsert(
            ReplicaSpec(
                replica_id,
                slots=slots,
                prior_latency_s=prior if prior is not None else NOMINAL_BATCH_S / speed,
            ),
            now,
        )
        self.router.set_draining(replica_id, False)
        self._draining.discard(replica_id)
        self._slots[replica_id] = slots
        if replica_id not in self._shunned:
            self._plan_for(replica_id)
        self.replicas[replica_id] = address
        self.kick()

    def _plan_for(self, replica_id: str) -> None:
        """Offer a replica to the batcher as capacity, with the cost model it learned so far."""
        self.batcher.add_replica(
            replica_id, slots=self._slots[replica_id], cost_model=self._models.get(replica_id)
        )
        self._models[replica_id] = self.batcher.cost_model(replica_id)

    def drain_replica(self, replica_id: str) -> None:
        """A draining replica takes no new batches; its in-flight ones finish."""
        self.router.set_draining(replica_id, True)
        self._draining.add(replica_id)
        self.batcher.remove_replica(replica_id)
        self.kick()

    def remove_replica(self, replica_id: str) -> None:
        self.router.remove(replica_id)
        self.batcher.remove_replica(replica_id)
        self._pool.close(replica_id)
        self.replicas.pop(replica_id, None)
        self._slots.pop(replica_id, None)
        self._draining.discard(replica_id)
        self._shunned.discard(replica_id)
        self._models.pop(replica_id, None)
        self._floors.pop(replica_id, None)
        self.kick()

    def cost_model(self, replica_id: str) -> OnlineCostModel | None:
        """The replica's learned batch cost (kept while its breaker is open or it drains), or
        None for a replica that is not a member."""
        return self._models.get(replica_id)

    def _predicted(self, replica_id: str, tokens: int, longest: int = 0) -> float | None:
        """A conservative prediction of a batch's duration on a replica, from its cost model
        (seeded by its warm-up); None while the replica has neither measured nor completed a
        batch (a prior is not a prediction)."""
        model = self._models.get(replica_id)
        if model is None or model.observations == 0:
            return None
        return model.upper(tokens, longest)

    def _proven(self, replica_id: str, tokens: int) -> float:
        """What calls out of time proved a batch of ``tokens`` costs on a replica (0: nothing);
        no prediction the dispatcher acts on is less."""
        floor = self._floors.get(replica_id)
        return floor.at(tokens) if floor is not None else 0.0

    @property
    def has_replicas(self) -> bool:
        return bool(self.replicas)

    # -- requests ---------------------------------------------------------------------------

    def submit(self, pending: PendingRequest) -> None:
        """Queue a request or raise its typed rejection at once (microseconds, no I/O)."""
        v = pending.valid
        pending.answer_by = self._attempts.answer_by(pending.received_at, pending.deadline)
        if self._shunned:
            # A shunned replica may have gone half-open since the last step: offer it again
            # before judging capacity, or a fleet of one would refuse work forever.
            self._sync_breakers(self._clock.now())
        verdict = self.batcher.submit(
            pending,
            tokens=v.work_tokens,
            deadline=pending.deadline,
            lane=Lane.BULK if v.bulk else Lane.INTERACTIVE,
            output_tokens=v.max_output_tokens,
        )
        if isinstance(verdict, Rejected):
            raise rejection_error(verdict, self._clock.now())
        self.kick()

    def kick(self) -> None:
        """Something changed: take the next scheduling step soon (coalesced per loop turn)."""
        if self._step_handle is None and not self._stopped and self._loop is not None:
            # A plain callback rather than a task woken by an event: one loop turn less per
            # wake-up, on the path of every request at light load.
            self._step_handle = self._loop.call_soon(self._run_step)

    # -- the scheduling loop ----------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.kick()

    def _run_step(self) -> None:
        self._step_handle = None
        try:
            self._step()
        except Exception:
            # A bug must neither stop dispatching nor leave callers waiting for a deadline:
            # what is queued gets a typed INTERNAL answer now, and the loop goes on.
            log.exception("dispatcher step failed", extra={"model": self.model})
            for item in self.batcher.drain():
                item.payload.reject(
                    RichError(
                        grpc.StatusCode.INTERNAL,
                        "internal error in the gateway's scheduler",
                        reason=Reason.INTERNAL,
                    )
                )

    def _sync_breakers(self, now: float) -> None:
        """A replica whose breaker is open is not capacity: the batcher must not plan batches
        for it (they would be sized for a fleet that is not there). Half-open counts again, so
        its probe can be planned."""
        self._breakers_dirty = False
        for view in self.router.views(now):
            rid = view.replica_id
            is_open = view.breaker is BreakerState.OPEN
            if is_open and rid not in self._shunned:
                self._shunned.add(rid)
                self.batcher.remove_replica(rid)
            elif not is_open and rid in self._shunned:
                self._shunned.discard(rid)
                if rid not in self._draining and rid in self._slots:
                    self._plan_for(rid)

    def _step(self) -> None:
        batcher = self.batcher
        if self._breakers_dirty or self._shunned:
            # Breakers open only on a fault and close again only with time: check them then.
            self._sync_breakers(self._clock.now())
        batcher.poll()
        self._answer_dropped()
        now = self._clock.now()
        for rid in [r for r, until in self._busy_until.items() if until <= now]:
            del self._busy_until[rid]
        busy = list(self._busy_until)
        skip = busy  # replicas not to offer work to in this step
        retry_at: float | None = None  # when the router expects a replica to take work
        while batcher.depth and batcher.free_replicas():
            lease = self.router.pick(now, exclude=skip)
            if isinstance(lease, NoCapacity):
                if skip is busy:  # not merely out of replicas this step has offered work to
                    retry_at = now + lease.retry_after_s
                break
            batch = batcher.take_batch(lease.replica_id)
            if batch is None:
                # The batcher prefers to wait (or has no slot there): give the lease back.
                self.router.complete(lease, Outcome.CANCELLED, None, now)
                if batcher.withheld:
                    # It held back retries that avoid this replica: another may take them.
                    skip = [*skip, lease.replica_id]
                    continue
                break
            self._launch(batch, lease, now)
        self._answer_dropped()
        wake = batcher.next_wakeup(now)
        if retry_at is not None and batcher.depth:
            wake = retry_at if wake is None else min(wake, retry_at)
        if busy and batcher.depth:
            # Replicas that pushed back become eligible again at their advertised time.
            soonest = min(self._busy_until[rid] for rid in busy)
            wake = soonest if wake is None else min(wake, soonest)
        self._arm_timer(wake, now)

    def _arm_timer(self, wake: float | None, now: float) -> None:
        if wake is None:
            return
        if self._timer is not None and self._timer_at is not None and now < self._timer_at <= wake:
            return  # an earlier wake-up is already set; it will re-evaluate
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        self._timer = asyncio.get_running_loop().call_later(max(0.0, wake - now), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        self.kick()

    def _answer_dropped(self) -> None:
        dropped = self.batcher.take_dropped()
        if not dropped:
            return
        now = self._clock.now()
        for d in dropped:
            d.item.payload.reject(rejection_error(d, now))

    # -- one batch on the wire --------------------------------------------------------------

    def _launch(self, batch: Batch[PendingRequest], lease: Lease, now: float) -> None:
        if spans_recorded():
            links = [Link(p.span_context) for p in batch.payloads if p.span_context is not None]
            span = self._tracer.start_span(
                "batch",
                links=links,
                attributes={
                    "halcyon.model": self.model,
                    "halcyon.version": self.version,
                    "halcyon.batch.size": len(batch.items),
                    "halcyon.batch.tokens": batch.tokens,
                    "halcyon.batch.flush_reason": batch.reason.value,
                },
            )
        else:  # nothing would record it: no span, no traceparent to the worker
            span = trace.INVALID_SPAN
        flight = _Flight(batch, HedgeRace(lease), span)
        self._flights[batch.batch_id] = flight
        self._hedging.record_dispatch()
        self._on_flush(batch.reason)
        self._call(flight, lease)
        delay = self._hedging.hedge_delay(now)
        if delay is not None:
            flight.hedge_timer = asyncio.get_running_loop().call_later(
                delay, self._maybe_hedge, flight
            )

    def _request(self, batch: Batch[PendingRequest]) -> worker_pb2.ExecuteBatchRequest:
        return worker_pb2.ExecuteBatchRequest(
            batch_id=f"{self.model}/{self.version}/{batch.batch_id}",
            model=self.model,
            version=self.version,
            items=[
                worker_pb2.BatchItem(
                    id=p.request_id,
                    input=p.valid.input,
                    input_tokens=p.valid.input_tokens,
                    max_output_tokens=p.valid.max_output_tokens,
                )
                for p in batch.payloads
            ],
        )

    def _call(self, flight: _Flight, lease: Lease) -> None:
        stub = self._pool.stub(lease.replica_id)
        batch = flight.batch
        flight.tried.add(lease.replica_id)
        if stub is None:  # the replica left between pick and call
            self._settle(flight, lease, None, RichError(grpc.StatusCode.UNAVAILABLE, "gone"))
            return
        now = self._clock.now()
        # No prediction and nothing proven (a worker without warm-up, before its first answer):
        # no attempt timeout but the requests' answer-by. A half-open probe is timed like any
        # attempt: the timeouts that opened the breaker proved a floor, so it is given twice
        # that, and a replica that became slower than its model answers a probe after a few.
        predicted = self._predicted(lease.replica_id, batch.tokens, batch.longest)
        proven = self._proven(lease.replica_id, batch.tokens)
        flight.predicted[lease.lease_id] = (
            max(predicted, proven) if predicted is not None else (proven or None)
        )
        last_answer_by = max(p.answer_by for p in batch.payloads)
        timeout = self._attempts.call_timeout(
            now, predicted, last_answer_by, self._hedging.hedge_delay(now), proven
        )
        if now + timeout > flight.ends_by:
            flight.ends_by = now + timeout
        metadata = self._fleet_md
        span: trace.Span | None = None
        if flight.span is not trace.INVALID_SPAN:
            span = start_client_span(
                self._tracer, EXECUTE_BATCH_METHOD, trace.set_span_in_context(flight.span)
            )
            if lease.hedge:
                span.set_attribute("halcyon.hedge", True)
            metadata += tuple(inject_metadata(trace.set_span_in_context(span)))
        started = self._call_metrics.start() if self._call_metrics is not None else 0.0
        task = asyncio.ensure_future(
            stub.ExecuteBatch(self._request(batch), timeout=timeout, metadata=metadata)
        )
        flight.calls[lease.lease_id] = task
        task.add_done_callback(lambda t: self._on_call_done(flight, lease, t, started, span))
        self._arm_give_up(flight, now)

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
            if lease.replica_id in self._slots:
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

    # -- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop admitting; queued work keeps being dispatched."""
        self.batcher.close()
        self.kick()

    @property
    def busy(self) -> bool:
        return bool(self.batcher.depth or self._flights)

    def abandon(self, err: RichError) -> int:
        """Answer everything still queued or on the wire with ``err`` (end of a drain's grace
        period), and cancel the calls so workers free their devices."""
        items = self.batcher.drain()
        for item in items:
            item.payload.reject(err)
        answered = len(items)
        for flight in list(self._flights.values()):
            for pending in flight.batch.payloads:
                if not pending.answered:
                    pending.reject(err)
                    answered += 1
            for call in flight.calls.values():
                call.cancel()
        return answered

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for flight in list(self._flights.values()):
            for call in flight.calls.values():
                call.cancel()
        self._stopped = True
        if self._step_handle is not None:
            self._step_handle.cancel()
            self._step_handle = None
