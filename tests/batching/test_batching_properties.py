"""Invariants of the batcher under arbitrary interleavings of arrivals, time and completions.

Every submitted request ends exactly once (served in a batch, rejected at admission, dropped
with a reason, or handed back by ``drain``); batches are EDF-ordered within a lane; bulk work
ages into the fast lane; the next wake-up is never within a tick; the plan never dispatches a
batch it predicts late while it still has a choice.
"""

from __future__ import annotations

from collections import Counter

from batching_helpers import exact_model
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from gateway.batching import (
    Accepted,
    BatcherConfig,
    DeadlineBatcher,
    Lane,
    Objective,
    OnlineCostModel,
    Rejected,
    ReplicaSlots,
)

submit_op = st.tuples(
    st.just("submit"),
    st.integers(1, 3000),  # tokens
    st.floats(0.001, 2.0),  # relative deadline (s)
    st.sampled_from([Lane.INTERACTIVE, Lane.INTERACTIVE, Lane.BULK]),
)
advance_op = st.tuples(st.just("advance"), st.floats(0.0, 0.08))
complete_op = st.tuples(st.just("complete"), st.floats(0.5, 1.6))  # measured / predicted
other_op = st.sampled_from([("take",), ("poll",), ("fail",), ("wake",)])
ops = st.lists(st.one_of(submit_op, submit_op, advance_op, complete_op, other_op), max_size=120)


@settings(max_examples=120, deadline=None)
@given(
    ops,
    st.sampled_from(list(Objective)),
    st.integers(1, 2),
    st.sampled_from([None, 0.03, 0.2]),
)
def test_every_request_ends_exactly_once_and_order_holds(
    operations: list[tuple[object, ...]],
    objective: Objective,
    slots: int,
    horizon: float | None,
) -> None:
    clock = ManualClock(10.0)
    config = BatcherConfig(objective=objective, horizon_s=horizon, max_queue=40)
    batcher: DeadlineBatcher[int] = DeadlineBatcher(clock, config)
    batcher.add_replica(ReplicaSlots("a", slots=slots), cost_model=exact_model())
    batcher.add_replica(ReplicaSlots("b"), cost_model=OnlineCostModel(0.02, 0.0002))
    outcomes: Counter[int] = Counter()
    submitted = 0
    in_flight = []

    def pump() -> None:
        for replica in batcher.free_replicas():
            batch = batcher.take_batch(replica)
            if batch is None:
                continue
            assert batch.items, "a batch is never empty"
            interactive = [i.deadline for i in batch.items if i.lane is Lane.INTERACTIVE]
            assert interactive == sorted(interactive), "EDF within the interactive lane"
            for item in batch.items:
                outcomes[item.payload] += 1
            in_flight.append(batch)
        for dropped in batcher.take_dropped():
            assert dropped.at <= clock.now()
            outcomes[dropped.item.payload] += 1

    for op in operations:
        kind = op[0]
        if kind == "submit":
            _, tokens, budget, lane = op
            assert isinstance(tokens, int) and isinstance(budget, float)
            assert isinstance(lane, Lane)
            submitted += 1
            result = batcher.submit(
                submitted, tokens=tokens, deadline=clock.now() + budget, lane=lane
            )
            if isinstance(result, Rejected):
                outcomes[submitted] += 1
            else:
                assert isinstance(result, Accepted) and result.item.payload == submitted
        elif kind == "advance":
            assert isinstance(op[1], float)
            clock.advance(op[1])
        elif kind == "complete" and in_flight:
            batch = in_flight.pop(0)
            assert isinstance(op[1], float)
            batcher.complete(batch, batch.predicted_seconds * op[1])
        elif kind == "fail" and in_flight:
            batch = in_flight.pop(0)
            requeue = batch.batch_id % 2 == 0
            handed_back = batcher.fail(batch, requeue=requeue)
            if requeue:
                assert handed_back == []
                for item in batch.items:
                    outcomes[item.payload] -= 1  # back in the queue: not finished yet
            else:
                # Not re-queued: the caller answers them (they stay counted, once).
                assert [i.payload for i in handed_back] == batch.payloads
        elif kind == "wake":
            wake = batcher.next_wakeup()
            if wake is not None:
                clock.set(wake)
                batcher.poll()
        elif kind == "poll":
            batcher.poll()
        pump()
        now = clock.now()
        wake = batcher.next_wakeup()
        assert wake is None or wake >= now + config.tick_s - 1e-9, "no busy-spin"
        queued = batcher.queued_items()
        fast = [i.deadline for i in queued if i.lane is Lane.INTERACTIVE or i.promoted]
        slow = [i.deadline for i in queued if i.lane is Lane.BULK and not i.promoted]
        assert fast == sorted(fast) and slow == sorted(slow), "each lane stays EDF"

    for item in batcher.drain():
        outcomes[item.payload] += 1
    pump()
    assert set(outcomes) <= set(range(1, submitted + 1))
    for payload in range(1, submitted + 1):
        assert outcomes[payload] == 1, f"request {payload} ended {outcomes[payload]} times"
    assert batcher.depth == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 0.1), min_size=1, max_size=30), st.floats(0.05, 0.5))
def test_bulk_work_ages_into_the_fast_lane(gaps: list[float], aging: float) -> None:
    clock = ManualClock(0.0)
    batcher: DeadlineBatcher[int] = DeadlineBatcher(
        clock, BatcherConfig(bulk_aging_s=aging, horizon_s=0.03)
    )
    batcher.add_replica(ReplicaSlots("a"), cost_model=exact_model())
    # Keep the replica busy so nothing is dispatched while bulk work waits.
    batcher.submit(0, tokens=4000, deadline=clock.now() + 0.4105)
    assert batcher.take_batch("a") is not None
    for i, gap in enumerate(gaps, start=1):
        clock.advance(gap)
        batcher.submit(i, tokens=10, deadline=clock.now() + 100.0, lane=Lane.BULK)
        batcher.poll()
        for item in batcher.queued_items():
            waited = clock.now() - item.arrival
            if waited >= aging:
                assert item.promoted, "bulk waited past aging without being promoted"
