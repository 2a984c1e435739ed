"""Flush reasons, waiting without busy-spin, feasibility at admission, eviction and shutdown."""

from __future__ import annotations

import pytest
from batching_helpers import INTERCEPT, SLOPE, exact_model, make_batcher

from common.clock import ManualClock
from gateway.batching import (
    Accepted,
    BatcherConfig,
    DeadlineBatcher,
    Dropped,
    DropReason,
    FlushReason,
    Lane,
    Objective,
    OnlineCostModel,
    Rejected,
    ReplicaSlots,
)


def occupy(batcher: DeadlineBatcher[str], clock: ManualClock, tokens: int) -> None:
    """Puts a batch of ``tokens`` on the (single) replica's only slot, starting now (its
    deadline leaves under a tick of slack, so it cannot wait)."""
    cost = INTERCEPT + SLOPE * tokens
    batcher.submit("busy", tokens=tokens, deadline=clock.now() + cost + 0.0005)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.payloads == ["busy"]


def test_capacity_flush_when_a_slot_frees_with_work_waiting(clock: ManualClock) -> None:
    batcher = make_batcher(clock, BatcherConfig(horizon_s=10.0, linger_s=1.0))
    occupy(batcher, clock, 100)
    batcher.submit("a", tokens=100, deadline=clock.now() + 5.0)
    assert batcher.take_batch("r1") is None  # no free slot
    clock.advance(0.02)
    batcher.complete(1, 0.02)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.reason is FlushReason.CAPACITY and batch.payloads == ["a"]


def test_linger_flush_after_the_ceiling(clock: ManualClock) -> None:
    batcher = make_batcher(clock, BatcherConfig(horizon_s=10.0, linger_s=0.005))
    batcher.submit("a", tokens=100, deadline=clock.now() + 5.0)
    assert batcher.take_batch("r1") is None
    wake = batcher.next_wakeup()
    assert wake == pytest.approx(clock.now() + 0.005)
    clock.advance(0.004)
    assert batcher.take_batch("r1") is None
    clock.advance(0.001)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.reason is FlushReason.LINGER


def test_deadline_flush_when_waiting_one_more_tick_would_breach(clock: ManualClock) -> None:
    batcher = make_batcher(clock, BatcherConfig(horizon_s=10.0, linger_s=10.0, tick_s=0.001))
    deadline = clock.now() + 0.050
    batcher.submit("a", tokens=100, deadline=deadline)  # costs 20 ms: 30 ms of slack
    assert batcher.take_batch("r1") is None
    wake = batcher.next_wakeup()
    assert wake is not None
    assert wake == pytest.approx(deadline - (INTERCEPT + SLOPE * 100) - 0.001)
    clock.set(wake)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.reason is FlushReason.DEADLINE
    assert clock.now() + batch.predicted_seconds <= deadline


def test_full_flush_when_nothing_more_can_join(clock: ManualClock) -> None:
    # A 30 ms horizon holds two 100-token requests (10 + 2 x 10 ms), not three.
    batcher = make_batcher(clock, BatcherConfig(horizon_s=0.030, linger_s=10.0))
    for name in "abc":
        batcher.submit(name, tokens=100, deadline=clock.now() + 5.0)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.reason is FlushReason.FULL
    assert batch.payloads == ["a", "b"]


def test_no_busy_spin_when_slack_is_below_a_tick(clock: ManualClock) -> None:
    batcher = make_batcher(clock, BatcherConfig(horizon_s=10.0, linger_s=10.0, tick_s=0.001))
    occupy(batcher, clock, 100)  # busy until +20 ms
    batcher.submit("a", tokens=100, deadline=clock.now() + 0.0405)
    for _ in range(50):
        now = clock.now()
        wake = batcher.next_wakeup()
        assert wake is None or wake >= now + 0.001 - 1e-12
        clock.advance(0.0003)
        batcher.poll()
    # Once the device is free the batch leaves at once: slack is under a tick.
    batcher.complete(1, 0.02)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.payloads == ["a"]


def test_admission_rejects_what_the_device_makes_unreachable(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    occupy(batcher, clock, 900)  # 100 ms on the device
    result = batcher.submit("late", tokens=100, deadline=clock.now() + 0.05)
    assert isinstance(result, Rejected)
    assert result.reason is DropReason.DEADLINE_UNREACHABLE
    assert result.predicted_completion is not None
    assert result.predicted_completion >= clock.now() + 0.100 + 0.020 - 1e-9
    assert result.retry_after is not None and result.retry_after > 0


def test_admission_counts_work_queued_ahead_and_sharing_the_batch(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    t0 = clock.now()
    occupy(batcher, clock, 400)  # busy until t0 + 50 ms
    for name in "abcd":  # 4 x 200 tokens due at +200 ms: one 90 ms batch, done at +140 ms
        assert isinstance(batcher.submit(name, tokens=200, deadline=t0 + 0.200), Accepted)
    # Alone after the device it would finish at +160 ms. Sharing the batch ahead would make
    # that batch late (+240 ms > +200 ms), so it must follow it: +140 + 110 = +250 ms.
    result = batcher.submit("x", tokens=1000, deadline=t0 + 0.205)
    assert isinstance(result, Rejected) and result.reason is DropReason.DEADLINE_UNREACHABLE
    assert result.predicted_completion == pytest.approx(t0 + 0.140 + 0.110)


def test_queued_work_is_evicted_before_its_deadline(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    occupy(batcher, clock, 400)  # predicted to free at +50 ms ... but it will overrun
    deadline = clock.now() + 0.090
    assert isinstance(batcher.submit("y", tokens=100, deadline=deadline), Accepted)
    dropped: list[Dropped[str]] = []
    while not dropped and clock.now() < deadline:
        wake = batcher.next_wakeup()
        assert wake is not None
        clock.set(min(wake, deadline))
        batcher.poll()
        dropped = batcher.take_dropped()
    assert [d.item.payload for d in dropped] == ["y"]
    assert dropped[0].reason is DropReason.DEADLINE_MISSED
    # Evicted once it could no longer finish (deadline minus its own cost), not at the deadline.
    assert dropped[0].at <= deadline - (INTERCEPT + SLOPE * 100) + 0.001


def test_largest_request_is_shed_for_goodput(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    t0 = clock.now()
    occupy(batcher, clock, 400)  # free at +50 ms
    assert isinstance(batcher.submit("big", tokens=2000, deadline=t0 + 0.29), Accepted)
    results = [batcher.submit(f"s{i}", tokens=100, deadline=t0 + 0.30) for i in range(10)]
    assert all(isinstance(r, Accepted) for r in results)
    dropped = batcher.take_dropped()
    assert [(d.item.payload, d.reason) for d in dropped] == [("big", DropReason.SHED_FOR_GOODPUT)]
    assert batcher.snapshot().drops["shed_for_goodput"] == 1


def test_on_time_tokens_objective_keeps_the_large_request(clock: ManualClock) -> None:
    config = BatcherConfig(horizon_s=10.0, objective=Objective.ON_TIME_TOKENS)
    batcher = make_batcher(clock, config)
    t0 = clock.now()
    occupy(batcher, clock, 400)
    batcher.submit("big", tokens=2000, deadline=t0 + 0.29)
    results = [batcher.submit(f"s{i}", tokens=100, deadline=t0 + 0.30) for i in range(10)]
    assert not batcher.take_dropped()
    assert sum(isinstance(r, Rejected) for r in results) >= 1
    assert "big" in [item.payload for item in batcher.queued_items()]


def test_close_refuses_new_work_and_drain_returns_everything(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    occupy(batcher, clock, 100)
    for name in "abc":
        batcher.submit(name, tokens=50, deadline=clock.now() + 5.0)
    batcher.submit("bulk", tokens=50, deadline=clock.now() + 5.0, lane=Lane.BULK)
    batcher.close()
    refused = batcher.submit("late", tokens=50, deadline=clock.now() + 5.0)
    assert isinstance(refused, Rejected) and refused.reason is DropReason.CLOSED
    # Closing does not strand queued work: it still dispatches ...
    batcher.complete(1, 0.02)
    batch = batcher.take_batch("r1")
    assert batch is not None
    served = set(batch.payloads)
    # ... and whatever is left is handed back, not dropped.
    drained = {item.payload for item in batcher.drain()}
    assert served | drained == {"a", "b", "c", "bulk"} and not served & drained
    assert batcher.depth == 0 and batcher.next_wakeup() is None


def test_queue_full_and_no_capacity(clock: ManualClock) -> None:
    batcher = make_batcher(clock, BatcherConfig(horizon_s=10.0, max_queue=2))
    occupy(batcher, clock, 100)
    batcher.submit("a", tokens=10, deadline=clock.now() + 5)
    batcher.submit("b", tokens=10, deadline=clock.now() + 5)
    full = batcher.submit("c", tokens=10, deadline=clock.now() + 5)
    assert isinstance(full, Rejected) and full.reason is DropReason.QUEUE_FULL
    assert full.retry_after is not None and full.retry_after > 0
    empty: DeadlineBatcher[str] = DeadlineBatcher(clock)
    none = empty.submit("x", tokens=10, deadline=clock.now() + 5)
    assert isinstance(none, Rejected) and none.reason is DropReason.NO_CAPACITY


def test_each_replica_learns_its_own_cost(clock: ManualClock) -> None:
    batcher: DeadlineBatcher[str] = DeadlineBatcher(clock, BatcherConfig(horizon_s=10.0))
    batcher.add_replica(ReplicaSlots("fast"), cost_model=exact_model())
    batcher.add_replica(ReplicaSlots("slow"), cost_model=exact_model())
    before = batcher.cost_model("fast").predict(1000)
    for i in range(30):
        batcher.submit(f"q{i}", tokens=500 + 40 * i, deadline=clock.now() + 5.0)
        clock.advance(0.005)  # the linger ceiling
        batch = batcher.take_batch("slow")
        assert batch is not None
        clock.advance(0.001)
        batcher.complete(batch, batch.predicted_seconds / 0.6)  # a 0.6x straggler
    assert batcher.cost_model("fast").predict(1000) == before
    assert batcher.cost_model("slow").predict(1000) > 1.4 * before
    assert set(batcher.snapshot().cost_models) == {"fast", "slow"}


def test_failed_batches_free_the_slot_and_can_requeue(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    batcher.submit("a", tokens=100, deadline=clock.now() + 5.0)
    batcher.submit("b", tokens=100, deadline=clock.now() + 5.0)
    clock.advance(0.01)
    batch = batcher.take_batch("r1")
    assert batch is not None
    model_before = batcher.cost_model("r1").predict(200)
    assert batcher.fail(batch, requeue=True) == []
    assert batcher.cost_model("r1").predict(200) == model_before
    again = batcher.take_batch("r1")
    assert again is not None and sorted(again.payloads) == ["a", "b"]
    assert [item.payload for item in batcher.fail(again)] == again.payloads
    with pytest.raises(KeyError):
        batcher.complete(again, 0.01)


def test_removed_replica_gets_no_new_work_but_reports_back(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    batcher.add_replica(ReplicaSlots("r2"), cost_model=exact_model())
    batcher.submit("a", tokens=100, deadline=clock.now() + 5.0)
    clock.advance(0.01)
    batch = batcher.take_batch("r2")
    assert batch is not None
    batcher.remove_replica("r2")
    assert batcher.replica_ids() == ["r1"]
    assert batcher.take_batch("r2") is None
    batcher.complete(batch, 0.02)  # still accepted
    assert "r2" not in batcher.snapshot().cost_models


def test_bulk_waits_for_interactive_work_then_ages_in(clock: ManualClock) -> None:
    config = BatcherConfig(horizon_s=0.030, linger_s=10.0, bulk_aging_s=0.25)
    batcher = make_batcher(clock, config)
    occupy(batcher, clock, 100)
    batcher.submit("bulk", tokens=100, deadline=clock.now() + 0.6, lane=Lane.BULK)
    batcher.submit("i1", tokens=100, deadline=clock.now() + 0.9)
    batcher.submit("i2", tokens=100, deadline=clock.now() + 0.9)
    assert [item.payload for item in batcher.queued_items()] == ["i1", "i2", "bulk"]
    clock.advance(0.25)
    batcher.poll()
    bulk = next(item for item in batcher.queued_items() if item.payload == "bulk")
    assert bulk.promoted
    # Promoted, it competes by deadline and goes first.
    assert [item.payload for item in batcher.queued_items()] == ["bulk", "i1", "i2"]


def test_a_fleet_of_replicas_with_several_slots(clock: ManualClock) -> None:
    """The gateway's shape: several replicas, several slots, one queue; every slot fills."""
    batcher: DeadlineBatcher[str] = DeadlineBatcher(clock, BatcherConfig(linger_s=0.002))
    batcher.add_replica(ReplicaSlots("a", slots=2), cost_model=exact_model())
    batcher.add_replica(ReplicaSlots("b", slots=1), cost_model=exact_model())
    for i in range(40):
        batcher.submit(f"q{i}", tokens=100, deadline=clock.now() + 0.5 + 0.01 * i)
    clock.advance(0.002)
    running = []
    for replica in batcher.free_replicas() * 2:
        batch = batcher.take_batch(replica)
        if batch is not None:
            running.append(batch)
    assert sorted(b.replica_id for b in running) == ["a", "a", "b"]
    assert batcher.free_replicas() == []
    served = {p for b in running for p in b.payloads}
    assert len(served) == sum(len(b.items) for b in running)  # no request in two batches
    for batch in running:
        clock.advance(0.001)
        batcher.complete(batch, batch.predicted_seconds)
    assert batcher.snapshot().completed_batches == 3


def test_without_linger_an_idle_replica_takes_work_at_once_as_capacity(
    clock: ManualClock,
) -> None:
    batcher = make_batcher(clock, BatcherConfig(horizon_s=10.0, linger_s=0.0))
    batcher.submit("a", tokens=100, deadline=clock.now() + 5.0)
    batch = batcher.take_batch("r1")
    assert batch is not None and batch.payloads == ["a"]
    assert batch.reason is FlushReason.CAPACITY  # nothing lingered: the replica was free


def test_a_straggler_that_frees_first_takes_only_what_it_finishes_as_soon_as_the_fast_one(
    clock: ManualClock,
) -> None:
    """Heterogeneous fleet: the 0.5x replica frees first; it must not take the whole queue."""
    batcher: DeadlineBatcher[str] = DeadlineBatcher(
        clock, BatcherConfig(horizon_s=10.0, linger_s=0.0)
    )
    batcher.add_replica(ReplicaSlots("fast", slots=1), cost_model=exact_model())
    slow = OnlineCostModel(2 * INTERCEPT, 2 * SLOPE, initial_spread=0.0)
    batcher.add_replica(ReplicaSlots("slow", slots=1), cost_model=slow)
    batcher.submit("busy", tokens=100, deadline=clock.now() + 5.0)
    occupied = batcher.take_batch("fast")
    assert occupied is not None
    for i in range(20):
        batcher.submit(f"q{i}", tokens=100, deadline=clock.now() + 5.0)
    batch = batcher.take_batch("slow")
    assert batch is not None
    whole_queue_on_fast = INTERCEPT + SLOPE * 20 * 100
    assert 0 < len(batch.items) < 20
    assert batch.predicted_seconds <= whole_queue_on_fast + 1e-9
    # The fastest replica is never held back by its own speed: it takes the rest at once.
    batcher.complete(occupied, 0.02)
    rest = batcher.take_batch("fast")
    assert rest is not None and len(rest.items) == 20 - len(batch.items)
