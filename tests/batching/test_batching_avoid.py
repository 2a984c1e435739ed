"""Retries avoid the replicas they failed on, per request (ADR 0011): a replica that failed one
request's batch keeps taking everyone else's work, and the retry goes elsewhere while it can."""

from __future__ import annotations

from batching_helpers import exact_model
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from gateway.batching import BatcherConfig, DeadlineBatcher, Lane, ReplicaSlots

CONFIG = BatcherConfig(horizon_s=10.0, linger_s=0.0)


def two_replicas(clock: ManualClock) -> DeadlineBatcher[str]:
    batcher: DeadlineBatcher[str] = DeadlineBatcher(clock, CONFIG)
    batcher.add_replica(ReplicaSlots("a", slots=1), cost_model=exact_model())
    batcher.add_replica(ReplicaSlots("b", slots=1), cost_model=exact_model())
    return batcher


def test_a_retry_is_held_out_of_the_replica_it_failed_on_and_no_one_else_is(
    clock: ManualClock,
) -> None:
    batcher = two_replicas(clock)
    # The retry has the earliest deadline: in EDF order it would lead a's next batch.
    batcher.submit("retry", tokens=10, deadline=clock.now() + 1.0, avoid=frozenset({"a"}))
    for i in range(3):
        batcher.submit(f"other-{i}", tokens=10, deadline=clock.now() + 2.0)
    on_a = batcher.take_batch("a")
    assert on_a is not None and on_a.payloads  # "a" still serves the others...
    assert "retry" not in on_a.payloads  # ...but not the request that failed there
    assert batcher.withheld == 1
    on_b = batcher.take_batch("b")
    assert on_b is not None and on_b.payloads[0] == "retry"
    assert batcher.withheld == 0


def test_nothing_but_retries_for_that_replica_means_none_and_no_spin(
    clock: ManualClock,
) -> None:
    batcher = two_replicas(clock)
    batcher.submit("first", tokens=10, deadline=clock.now() + 1.0)
    busy = batcher.take_batch("b")
    assert busy is not None  # "b" is busy now; "a" is free
    batcher.submit("retry", tokens=10, deadline=clock.now() + 1.0, avoid=frozenset({"a"}))
    assert batcher.take_batch("a") is None
    assert batcher.withheld == 1
    assert batcher.depth == 1  # still queued, for "b"
    wake = batcher.next_wakeup(clock.now())
    # No wake-up at tick rate for the free "a": only "b" finishing (an event) can help now.
    assert wake is None or wake > clock.now() + 0.5
    clock.advance(0.02)
    batcher.complete(busy, 0.02)
    assert (b := batcher.take_batch("b")) is not None and b.payloads == ["retry"]


def test_with_no_other_replica_in_service_the_retry_goes_where_it_failed(
    clock: ManualClock,
) -> None:
    batcher = two_replicas(clock)
    batcher.remove_replica("b")  # breaker open or draining: not capacity
    batcher.submit("retry", tokens=10, deadline=clock.now() + 1.0, avoid=frozenset({"a"}))
    batch = batcher.take_batch("a")
    assert batch is not None and batch.payloads == ["retry"]
    assert batcher.withheld == 0


def test_a_retry_that_avoided_every_replica_still_runs(clock: ManualClock) -> None:
    batcher = two_replicas(clock)
    batcher.submit("retry", tokens=10, deadline=clock.now() + 1.0, avoid=frozenset({"a", "b"}))
    batch = batcher.take_batch("b")
    assert batch is not None and batch.payloads == ["retry"]


def test_a_withheld_bulk_retry_still_ages_into_the_fast_lane(clock: ManualClock) -> None:
    batcher = two_replicas(clock)
    batcher.submit(
        "bulk-retry", tokens=10, deadline=clock.now() + 5.0, lane=Lane.BULK, avoid=frozenset({"a"})
    )
    assert batcher.take_batch("a") is None
    clock.advance(CONFIG.bulk_aging_s + 0.01)
    batcher.poll()
    assert [i.payload for i in batcher.queued_items()] == ["bulk-retry"]
    assert batcher.queued_items()[0].promoted
    assert (b := batcher.take_batch("b")) is not None and b.payloads == ["bulk-retry"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "take-a", "take-b", "done-a", "done-b", "tick"]),
            st.sampled_from([frozenset(), frozenset({"a"}), frozenset({"b"})]),
            st.integers(1, 400),
        ),
        max_size=60,
    )
)
@settings(max_examples=150, deadline=None)
def test_no_request_is_ever_batched_onto_a_replica_it_avoids_while_another_serves(
    ops: list[tuple[str, frozenset[str], int]],
) -> None:
    clock = ManualClock(100.0)
    batcher = two_replicas(clock)
    avoids: dict[str, frozenset[str]] = {}
    in_flight: dict[str, list[int]] = {"a": [], "b": []}
    seen: set[str] = set()
    for n, (op, avoid, tokens) in enumerate(ops):
        if op == "submit":
            name = f"r{n}"
            verdict = batcher.submit(name, tokens=tokens, deadline=clock.now() + 5.0, avoid=avoid)
            if not hasattr(verdict, "reason"):
                avoids[name] = avoid
        elif op.startswith("take"):
            rid = op[-1]
            batch = batcher.take_batch(rid)
            if batch is not None:
                in_flight[rid].append(batch.batch_id)
                for name in batch.payloads:
                    assert rid not in avoids[name], f"{name} avoided {rid}"
                    assert name not in seen
                    seen.add(name)
        elif op.startswith("done"):
            rid = op[-1]
            if in_flight[rid]:
                batcher.complete(in_flight[rid].pop(0), 0.01)
        else:
            clock.advance(0.01)
            batcher.poll()
        for d in batcher.take_dropped():
            seen.add(d.item.payload)
    queued = {i.payload for i in batcher.queued_items()}
    assert queued.isdisjoint(seen)  # nothing is both queued and gone
    assert queued | seen == set(avoids)  # and nothing was lost
