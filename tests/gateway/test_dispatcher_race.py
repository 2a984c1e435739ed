"""A hedge race settles once: an attempt that finishes after the race is decided changes
nothing but its own replica's outcome (found under CPU stress: a loser that completed before
its cancellation landed used to complete the batch a second time)."""

from __future__ import annotations

from opentelemetry import trace

from common.clock import ManualClock
from common.rng import SeededRng
from gateway.batching import BatcherConfig, DeadlineBatcher, FlushReason, ReplicaSlots
from gateway.dispatcher import PendingRequest, VersionDispatcher, _Flight
from gateway.routing import HedgePolicy, HedgeRace, Lease, PeakEwmaRouter, ReplicaSpec
from gateway.validation import ValidRequest
from gateway.worker_pool import WorkerPool
from halcyon.v1 import worker_pb2


async def test_a_late_success_after_the_race_is_won_changes_nothing() -> None:
    clock = ManualClock(100.0)
    batcher: DeadlineBatcher[PendingRequest] = DeadlineBatcher(clock, BatcherConfig(linger_s=0.0))
    router = PeakEwmaRouter(SeededRng(1))
    batches: list[tuple[str, bool]] = []
    dispatcher = VersionDispatcher(
        "m",
        "v1",
        clock=clock,
        batcher=batcher,
        router=router,
        hedging=HedgePolicy(clock),
        pool=WorkerPool(),
        fleet_metadata=(),
        on_batch=lambda _m, _v, _b, replica, _lat, ok: batches.append((replica, ok)),
        on_flush=lambda _reason: None,
        on_hedge=lambda _result: None,
        on_busy=lambda: None,
    )
    for rid in ("a", "b"):
        router.upsert(ReplicaSpec(rid, slots=1, prior_latency_s=0.01), clock.now())
        batcher.add_replica(ReplicaSlots(rid, slots=1))
    pending = PendingRequest(
        request_id="r1",
        valid=ValidRequest("m", "hi", 1, 9, "", 0, False, 5.0),
        received_at=clock.now(),
        deadline=clock.now() + 5.0,
    )
    batcher.submit(pending, tokens=10, deadline=pending.deadline)
    primary = router.pick(clock.now())
    assert isinstance(primary, Lease)
    batch = batcher.take_batch(primary.replica_id)
    assert batch is not None and batch.reason is FlushReason.CAPACITY
    flight = _Flight(batch, HedgeRace(primary), trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT))
    hedge = router.pick(clock.now(), exclude={primary.replica_id}, hedge=True)
    assert isinstance(hedge, Lease)
    flight.race.add_hedge(hedge)
    clock.advance(0.02)
    answer = worker_pb2.ExecuteBatchResponse(
        results=[worker_pb2.ItemResult(id="r1", output="done", output_tokens=9)]
    )

    dispatcher._settle(flight, primary, answer, None)  # wins the race
    dispatcher._settle(flight, hedge, answer, None)  # finished before its cancellation

    assert batches == [(primary.replica_id, True)]  # one batch, completed once
    assert pending.result is not None and pending.result.output == "done"
    assert primary.released and hedge.released
    assert batcher.free_replicas() == ["a", "b"]
