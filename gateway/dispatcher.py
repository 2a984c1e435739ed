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
requests' deadlines alone; a request still waiting on a replica shortly before its deadline is
answered by the gateway itself (``DEADLINE_EXCEEDED / DEADLINE_MISSED``, ADR 0011). A replica's
cost model is seeded from its worker's warm-up when it first joins (:mod:`gateway.warmup`);
a call that ran out of time proves a lower bound on that batch's cost there
(:class:`~gateway.routing.CostFloor`).

Where each part lives (all importable from here, as before):

* this module — following membership (:meth:`VersionDispatcher.changed`, the owner's change
  events, :mod:`gateway.replicas`: the router holds each member's record, the batcher plans
  onto members neither draining nor with an open breaker), the cost models and floors it
  learns per member (kept while a breaker is open or a replica drains), admission, the
  scheduling loop and its timers, and launching each attempt
  (:meth:`VersionDispatcher._call`, with its CLIENT span);
* :mod:`gateway.dispatch_pending` — :class:`PendingRequest` (answered exactly once),
  :class:`InferResult` and :func:`rejection_error`;
* :mod:`gateway.dispatch_flight` — a batch on the wire (``_Flight``) and the outcome of each
  attempt (:class:`~gateway.dispatch_flight.FlightSettlement`, mixed in here): success,
  ``REPLICA_BUSY`` backpressure, TIMEOUT, fault, hedge loser; the give-up timer, the retry of
  a failed batch's requests elsewhere, and hedging.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from opentelemetry import trace
from opentelemetry.trace import Link

from common.clock import Clock
from common.errors import Reason, RichError
from common.grpc_metrics import UnaryClientRecorder
from common.tracing import inject_metadata, spans_recorded, start_client_span
from gateway.batching import (
    Batch,
    FlushReason,
    Lane,
    OnlineCostModel,
    Rejected,
    Seat,
)
from gateway.batching.fixed import BatchPolicy
from gateway.dispatch_flight import (
    _FLUSH,
    MAX_ATTEMPTS,
    FlightSettlement,
    _call_code,
    _Flight,
)
from gateway.dispatch_pending import InferResult, PendingRequest, rejection_error
from gateway.replicas import Change, Insert
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
)
from gateway.warmup import seeded_cost_model
from gateway.worker_pool import WorkerPool
from halcyon.v1 import worker_pb2

__all__ = [
    "EXECUTE_BATCH_METHOD",
    "MAX_ATTEMPTS",
    "_FLUSH",
    "FlightSettlement",
    "InferResult",
    "PendingRequest",
    "VersionDispatcher",
    "_Flight",
    "_call_code",
    "rejection_error",
]

log = logging.getLogger("halcyon.gateway.dispatcher")

EXECUTE_BATCH_METHOD = "/halcyon.v1.WorkerService/ExecuteBatch"


class VersionDispatcher(FlightSettlement):
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
        # Each member's learned cost, kept while the batcher does not plan for it (breaker
        # open, draining) so that it neither starts over nor reads as "unknown" meanwhile.
        self._models: dict[str, OnlineCostModel] = {}
        # What calls that ran out of time proved about each member's cost (kept likewise).
        self._floors: dict[str, CostFloor] = {}
        self._shunned: set[str] = set()  # breaker open: not offered to the batcher as capacity
        self._breakers_dirty = False  # a fault was recorded: a breaker may have opened

    # -- membership -------------------------------------------------------------------------

    def changed(self, change: Change) -> None:
        """One membership change of this (model, version), from the owner (gateway.replicas).

        A replica joins or takes its new record in the router first (which holds the record)
        and the batcher after it, which plans onto it unless it drains or its breaker is
        open; its warm-up seeds its cost model when it first joins, and only then: a known
        replica keeps what it learned. A replica that leaves is forgotten by both, with what
        was learned of it."""
        replica_id = change.replica.replica_id
        if isinstance(change, Insert):
            replica = change.replica
            if replica_id not in self._models:
                seeded = seeded_cost_model(replica.warmup)
                if seeded is not None:
                    self._models[replica_id] = seeded  # _plan_for hands it to the batcher
            self.router.upsert(replica, self._clock.now())
            if replica.draining:
                self.batcher.remove_replica(replica_id)  # its in-flight batches finish
            elif replica_id not in self._shunned:
                self._plan_for(replica)
        else:
            self.router.remove(replica_id)
            self.batcher.remove_replica(replica_id)
            self._shunned.discard(replica_id)
            self._models.pop(replica_id, None)
            self._floors.pop(replica_id, None)
        self.kick()

    def _plan_for(self, replica: Seat) -> None:
        """Offer a replica to the batcher as capacity, with the cost model it learned so far."""
        rid = replica.replica_id
        self.batcher.add_replica(replica, cost_model=self._models.get(rid))
        self._models[rid] = self.batcher.cost_model(rid)

    @property
    def replicas(self) -> list[str]:
        """The members' ids (draining ones included), in the order they joined."""
        return self.router.replica_ids()

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
        return len(self.router) > 0

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
                member = self.router.member(rid)
                if member is not None and not member.draining:
                    self._plan_for(member)

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
