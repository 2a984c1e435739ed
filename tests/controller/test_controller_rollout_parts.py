"""The small parts around the rollout shell: per-arm evidence, the decision feed, the
rate-limited drop log. Pure; no clock but a manual one."""

from __future__ import annotations

import logging

import pytest

from common.clock import ManualClock
from controller.decision_feed import DecisionFeed
from controller.drop_log import DropLog
from controller.rollout_evidence import RolloutEvidence
from controller.store import DecisionAction, DecisionRecord
from halcyon.v1 import control_pb2

K = control_pb2.RequestOutcomeKind


def test_evidence_counts_from_watch_and_takes_deltas() -> None:
    ev = RolloutEvidence()
    ev.record("m", "v1", K.REQUEST_OUTCOME_KIND_OK, 0.1)  # before the rollout: never seen
    ev.watch("m", "v1", "v2")
    for kind, latency in (
        (K.REQUEST_OUTCOME_KIND_OK, 0.02),
        (K.REQUEST_OUTCOME_KIND_LATE, 0.9),
        (K.REQUEST_OUTCOME_KIND_SHED, 0.0),
        (K.REQUEST_OUTCOME_KIND_ERROR, 0.0),
    ):
        ev.record("m", "v1", kind, latency)
    ev.record("m", "v3", K.REQUEST_OUTCOME_KIND_ERROR, 0.0)  # not an arm
    ev.record("other", "v1", K.REQUEST_OUTCOME_KIND_ERROR, 0.0)  # not this model
    baseline, canary = ev.take("m")
    assert (baseline.requests, baseline.errors, baseline.shed) == (4, 1, 1)
    assert list(baseline.latencies_s) == [0.02, 0.9]  # answered only
    assert canary.requests == 0
    again, _ = ev.take("m")
    assert again.requests == 0  # a delta: taken once
    ev.unwatch("m")
    assert ev.watching("m") is None
    with pytest.raises(KeyError):
        ev.take("m")


@pytest.mark.parametrize(
    ("failed_batch_items", "final_errors", "answered", "want_errors", "want_requests"),
    [
        (3, 0, 3, 3, 6),  # a batch of 3 failed, the retry answered all three
        (3, 3, 0, 3, 3),  # ... and failed again: each request's last attempt is one error
        (0, 2, 5, 2, 7),  # errors from no failed batch still count
        (4, 1, 3, 4, 7),  # mixed: per attempt
    ],
)
def test_faults_count_per_attempt(
    failed_batch_items: int, final_errors: int, answered: int, want_errors: int, want_requests: int
) -> None:
    ev = RolloutEvidence()
    ev.watch("m", "v1", "v2")
    ev.record_batch("m", "v2", failed_batch_items, False)
    ev.record_batch("m", "v2", 50, True)  # a good batch adds nothing here
    for _ in range(final_errors):
        ev.record("m", "v2", K.REQUEST_OUTCOME_KIND_ERROR, 0.0)
    for _ in range(answered):
        ev.record("m", "v2", K.REQUEST_OUTCOME_KIND_OK, 0.01)
    _, canary = ev.take("m")
    assert (canary.errors, canary.requests) == (want_errors, want_requests)


def test_evidence_keeps_counting_past_its_latency_cap() -> None:
    ev = RolloutEvidence(max_latencies=2)
    ev.watch("m", "v1", "v2")
    for _ in range(5):
        ev.record("m", "v2", K.REQUEST_OUTCOME_KIND_OK, 0.01)
    _, canary = ev.take("m")
    assert (canary.requests, len(canary.latencies_s)) == (5, 2)


def decision(i: int, model: str = "m") -> DecisionRecord:
    return DecisionRecord(
        id=i,
        rollout_id=1,
        model=model,
        action=DecisionAction.HOLD,
        reason="r",
        from_percent=1.0,
        to_percent=1.0,
        decided_at=float(i),
    )


async def test_feed_delivers_in_order_per_model_and_ends_on_close() -> None:
    feed = DecisionFeed()
    everything = feed.subscribe()
    only_m = feed.subscribe("m")
    feed.publish(decision(1))
    feed.publish(decision(2, model="other"))
    feed.close()
    assert [await everything.next() for _ in range(3)] == [decision(1), decision(2, "other"), None]
    assert [await only_m.next() for _ in range(2)] == [decision(1), None]
    late = feed.subscribe()
    assert await late.next() is None


async def test_a_watcher_that_stops_reading_is_ended_not_grown() -> None:
    feed = DecisionFeed(max_backlog=3)
    stalled = feed.subscribe()
    reader = feed.subscribe()
    for i in range(10):
        feed.publish(decision(i))
        assert await reader.next() == decision(i)
    assert stalled.overflowed and len(feed) == 1
    assert [await stalled.next() for _ in range(4)] == [decision(0), decision(1), decision(2), None]


def test_drop_log_is_rate_limited_and_summarises(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(0.0)
    log = DropLog(logging.getLogger("test.drops"), clock, interval_s=10.0)
    with caplog.at_level(logging.WARNING, logger="test.drops"):
        log.record("gw-1", {"missing_version": 1}, "requests[3].version: must not be empty")
        for _ in range(100):
            clock.advance(0.05)
            log.record("gw-1", {"invalid_kind": 2}, "requests[0].kind: …")
        log.record("gw-2", {}, None)  # nothing dropped: nothing to say
        clock.advance(6.0)
        log.record("gw-2", {"missing_model": 1}, "requests[9].model: must not be empty")
    assert log.lines == 2
    first, second = (r.__dict__ for r in caplog.records)
    assert first["dropped"] == {"missing_version": 1}
    assert first["example"] == "requests[3].version: must not be empty"
    # The second line carries everything dropped since the first, and its first example.
    assert second["dropped"] == {"invalid_kind": 200, "missing_model": 1}
    assert second["example"] == "requests[0].kind: …"


def test_an_arm_with_no_answered_request_converts_without_latency_quantiles() -> None:
    # Every request of the arm failed: the judge's p50/p95 are NaN. The decision must still
    # reach watchers (it once ended WatchRolloutDecisions with UNKNOWN).
    from controller.convert import arm_to_pb
    from controller.store import ArmSnapshot

    nan = float("nan")
    arm = ArmSnapshot("v2", requests=40, errors=40, shed=0, error_rate=1.0, p50_s=nan, p95_s=nan)
    pb = arm_to_pb(arm)
    assert (pb.requests, pb.errors, pb.HasField("p50"), pb.HasField("p95")) == (
        40,
        40,
        False,
        False,
    )
    ok = arm_to_pb(ArmSnapshot("v1", 10, 0, 0, 0.0, 0.05, 0.2))
    assert (ok.p50.nanos, ok.p95.nanos) == (50_000_000, 200_000_000)
