"""The console's traffic history: per-second slots in a fixed ring, sealed when past."""

from __future__ import annotations

import pytest

from common.clock import ManualClock
from controller.console.history import GatewayGauge, LoadGauge, TrafficHistory
from halcyon.v1 import control_pb2

OK = control_pb2.REQUEST_OUTCOME_KIND_OK
ERROR = control_pb2.REQUEST_OUTCOME_KIND_ERROR
SHED = control_pb2.REQUEST_OUTCOME_KIND_SHED
LATE = control_pb2.REQUEST_OUTCOME_KIND_LATE


def test_counts_land_in_the_slot_of_their_second_and_only_past_slots_are_read() -> None:
    clock = ManualClock(100.0)
    history = TrafficHistory(clock, horizon_s=10)
    for _ in range(3):
        history.record("m", "v1", OK, 0.010)
    history.record("m", "v1", SHED, 0.0)
    history.record("m", "v2", ERROR, 0.0)
    assert history.points() == []  # the current second is not complete yet
    clock.advance(1.0)
    history.record("m", "v1", LATE, 0.500)
    [point] = history.points()
    assert point["t"] == 100.0
    assert point["models"]["m"] == {
        "offered": 5, "ok": 3, "error": 1, "shed": 1, "late": 0,
        "p50_ms": pytest.approx(10.0, rel=0.03), "p95_ms": pytest.approx(10.0, rel=0.03),
        "p99_ms": pytest.approx(10.0, rel=0.03),
    }  # fmt: skip
    assert point["versions"]["m/v1"]["offered"] == 4
    assert point["versions"]["m/v2"] == {"offered": 1, "ok": 0, "error": 1, "shed": 0, "late": 0}


def test_latency_counts_answered_requests_only() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=5)
    history.record("m", "v1", OK, 0.010)
    for _ in range(50):
        history.record("m", "v1", ERROR, 9.0)  # a failure has no meaningful latency
        history.record("m", "v1", SHED, 9.0)
    history.record("m", "v1", LATE, 0.100)
    clock.advance(1.0)
    [point] = history.points()
    assert point["models"]["m"]["p99_ms"] == pytest.approx(100.0, rel=0.03)
    assert point["models"]["m"]["p50_ms"] == pytest.approx(10.0, rel=0.03)


def test_the_ring_keeps_the_horizon_and_nothing_older() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=5, slot_s=1)
    for _ in range(12):
        history.record("m", "v1", OK, 0.01)
        clock.advance(1.0)
    points = history.points()
    # 5 slots in the ring, one of them the current (empty, not read): the 4 newest past ones.
    assert [p["t"] for p in points] == [8.0, 9.0, 10.0, 11.0]
    assert history.slots == 5
    clock.advance(60.0)
    assert history.points() == [] and len(history) == 0


def test_a_slot_reused_by_a_later_second_starts_empty() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=3)
    for _ in range(7):
        history.record("m", "v1", OK, 0.01)
    clock.advance(3.0)  # same ring index as second 0
    history.record("m", "v1", OK, 0.01)
    clock.advance(1.0)
    [point] = history.points()
    assert (point["t"], point["models"]["m"]["offered"]) == (3.0, 1)


def test_sealing_drops_the_sketch_but_keeps_the_quantiles() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=5)
    history.record("m", "v1", OK, 0.02)
    clock.advance(1.0)
    first = history.points()
    slot = history._ring[0]
    assert slot is not None and slot.sketches is None
    assert history.points() == first  # reading again gives the same numbers


def test_series_are_bounded_per_slot_and_the_excess_is_counted() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=5, max_series=2)
    for model in ("a", "b", "c", "d"):
        history.record(model, "v1", OK, 0.01)
    history.record("a", "v2", OK, 0.01)  # a known model, but a third (model, version)
    history.sample(
        [(f"gw-{i}", GatewayGauge(limit=10, inflight=1)) for i in range(3)],
        [("a", LoadGauge(busy=1, slots=2))],
    )
    clock.advance(1.0)
    [point] = history.points()
    assert sorted(point["models"]) == ["a", "b"]
    assert sorted(point["versions"]) == ["a/v1", "b/v1"]
    assert sorted(point["gateways"]) == ["gw-0", "gw-1"]
    assert history.dropped == 2 + 1 + 1


def test_gauges_a_later_sample_in_the_same_second_wins() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=5)
    history.sample([("gw", GatewayGauge(limit=10, inflight=9))], [("m", LoadGauge(2, 4))])
    clock.advance(0.5)
    history.sample([("gw", GatewayGauge(limit=12, inflight=3))], [("m", LoadGauge(1, 4))])
    clock.advance(0.5)
    [point] = history.points()
    assert point["gateways"] == {"gw": {"limit": 12, "inflight": 3}}
    assert point["load"] == {"m": {"busy": 1, "slots": 4}}


def test_failed_batches_are_counted_and_since_filters() -> None:
    clock = ManualClock(10.0)
    history = TrafficHistory(clock, horizon_s=10)
    history.record_batch("m", "v1", 8, False)
    history.record_batch("m", "v1", 8, True)
    clock.advance(1.0)
    history.record("m", "v1", OK, 0.01)
    clock.advance(1.0)
    assert [p["failed_batches"] for p in history.points()] == [1, 0]
    assert [p["t"] for p in history.points(since=11.0)] == [11.0]


@pytest.mark.parametrize(
    ("horizon", "slot", "series"), [(0.5, 1.0, 8), (10, 0, 8), (10, 1, 0), (float("inf"), 1, 8)]
)
def test_nonsense_bounds_are_refused(horizon: float, slot: float, series: int) -> None:
    with pytest.raises(ValueError):
        TrafficHistory(ManualClock(), horizon_s=horizon, slot_s=slot, max_series=series)
