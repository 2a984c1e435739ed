"""OutcomeAggregator: per-version counts and latencies over a rolling window; gateway status."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from common.durations import to_duration as duration
from controller.outcomes import OutcomeAggregator
from halcyon.v1 import control_pb2, fleet_pb2

K = control_pb2.RequestOutcomeKind


def outcome(
    kind: control_pb2.RequestOutcomeKind,
    latency_s: float = 0.05,
    model: str = "m",
    version: str = "v1",
) -> control_pb2.RequestOutcome:
    return control_pb2.RequestOutcome(
        model=model, version=version, replica_id="r1", kind=kind, latency=duration(latency_s)
    )


def report(
    *outcomes: control_pb2.RequestOutcome, gateway: str = "gw-1", **kw: object
) -> control_pb2.ReportOutcomesRequest:
    return control_pb2.ReportOutcomesRequest(
        gateway_id=gateway,
        requests=list(outcomes),
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def agg(clock: ManualClock) -> OutcomeAggregator:
    return OutcomeAggregator(clock, window_s=60.0, slots=6, gateway_ttl_s=30.0)


def test_counts_each_request_once_by_kind(agg: OutcomeAggregator) -> None:
    counted = agg.ingest(
        report(
            outcome(K.REQUEST_OUTCOME_KIND_OK, 0.010),
            outcome(K.REQUEST_OUTCOME_KIND_OK, 0.020),
            outcome(K.REQUEST_OUTCOME_KIND_LATE, 0.900),
            *[outcome(K.REQUEST_OUTCOME_KIND_ERROR, 0.001)] * 8,  # a failed batch of 8
            outcome(K.REQUEST_OUTCOME_KIND_SHED, 0.0),
        )
    )
    assert counted.counted == {"ok": 2, "late": 1, "error": 8, "shed": 1}
    assert counted.dropped == {} and counted.problem is None
    w = agg.window("m", "v1")
    assert (w.ok, w.late, w.error, w.shed, w.requests) == (2, 1, 8, 1, 12)
    assert w.error_rate == pytest.approx(9 / 12)
    # Only answered requests feed latency: errors and shed would make the arm look fast.
    assert w.latency.count == 3
    assert w.latency.min == pytest.approx(0.010, rel=0.02)
    assert agg.reports_total == 1


def test_versions_are_kept_apart(agg: OutcomeAggregator) -> None:
    agg.ingest(
        report(
            outcome(K.REQUEST_OUTCOME_KIND_OK, version="v1"),
            outcome(K.REQUEST_OUTCOME_KIND_ERROR, version="v2"),
        )
    )
    assert agg.window("m", "v1").ok == 1 and agg.window("m", "v1").error == 0
    assert agg.window("m", "v2").error == 1
    assert [(w.model, w.version) for w in agg.windows()] == [("m", "v1"), ("m", "v2")]
    assert agg.window("m", "v9").requests == 0


def test_batches_counted(agg: OutcomeAggregator) -> None:
    agg.ingest(
        report(
            batches=[
                control_pb2.BatchOutcome(model="m", version="v1", size=4, ok=True),
                control_pb2.BatchOutcome(model="m", version="v1", size=8, ok=False),
            ]
        )
    )
    w = agg.window("m", "v1")
    assert (w.batches, w.failed_batches) == (2, 1)


def test_window_rolls(clock: ManualClock, agg: OutcomeAggregator) -> None:
    agg.ingest(report(outcome(K.REQUEST_OUTCOME_KIND_OK)))
    clock.advance(30.0)
    agg.ingest(report(outcome(K.REQUEST_OUTCOME_KIND_ERROR)))
    assert agg.window("m", "v1").requests == 2
    clock.advance(35.0)  # the first report's slot has left the window
    w = agg.window("m", "v1")
    assert (w.ok, w.error) == (0, 1)
    clock.advance(60.0)
    assert agg.window("m", "v1").requests == 0
    assert agg.windows() == []


def test_reset_forgets_one_model(agg: OutcomeAggregator) -> None:
    agg.ingest(
        report(
            outcome(K.REQUEST_OUTCOME_KIND_OK, model="a"),
            outcome(K.REQUEST_OUTCOME_KIND_OK, model="b"),
        )
    )
    agg.reset("a")
    assert agg.window("a", "v1").requests == 0
    assert agg.window("b", "v1").requests == 1
    agg.reset()
    assert agg.windows() == []


def test_gateway_status_latest_and_forgotten_when_silent(
    clock: ManualClock, agg: OutcomeAggregator
) -> None:
    cost = fleet_pb2.CostModel(replica_id="r1", intercept=duration(0.018), samples=10)
    agg.ingest(report(gateway="gw-1", concurrency_limit=40, inflight=3, cost_models=[cost]))
    clock.advance(10.0)
    agg.ingest(report(gateway="gw-1", concurrency_limit=44, inflight=5, cost_models=[cost]))
    agg.ingest(report(gateway="gw-2", concurrency_limit=10))
    gws = agg.gateways()
    assert [g.gateway_id for g in gws] == ["gw-1", "gw-2"]
    assert (gws[0].concurrency_limit, gws[0].inflight, gws[0].reports) == (44, 5, 2)
    assert gws[0].last_report_at == pytest.approx(1010.0)
    assert gws[0].cost_models[0].replica_id == "r1"
    clock.advance(31.0)
    assert agg.gateways() == []


@pytest.mark.parametrize(
    ("bad", "reason", "field"),
    [
        (outcome(K.REQUEST_OUTCOME_KIND_OK, model=""), "missing_model", "requests[1].model"),
        (outcome(K.REQUEST_OUTCOME_KIND_OK, version=""), "missing_version", "requests[1].version"),
        (outcome(K.REQUEST_OUTCOME_KIND_UNSPECIFIED), "invalid_kind", "requests[1].kind"),
        (
            outcome(K.REQUEST_OUTCOME_KIND_OK, latency_s=-1.0),
            "invalid_latency",
            "requests[1].latency",
        ),
    ],
)
def test_a_malformed_outcome_is_dropped_and_the_rest_counted(
    agg: OutcomeAggregator, bad: control_pb2.RequestOutcome, reason: str, field: str
) -> None:
    good = outcome(K.REQUEST_OUTCOME_KIND_OK, 0.01)
    result = agg.ingest(
        report(good, bad, outcome(K.REQUEST_OUTCOME_KIND_ERROR, 0.0), concurrency_limit=9)
    )
    assert result.dropped == {reason: 1}
    assert result.problem is not None and result.problem.startswith(f"{field}:")
    assert result.counted == {"ok": 1, "late": 0, "error": 1, "shed": 0}
    w = agg.window("m", "v1")
    assert (w.ok, w.error) == (1, 1)
    assert [g.concurrency_limit for g in agg.gateways()] == [9]
    assert agg.reports_total == 1 and agg.dropped_outcomes == 1


def test_a_malformed_batch_is_dropped_and_the_rest_counted(agg: OutcomeAggregator) -> None:
    result = agg.ingest(
        report(
            outcome(K.REQUEST_OUTCOME_KIND_OK),
            batches=[
                control_pb2.BatchOutcome(model="m"),
                control_pb2.BatchOutcome(model="m", version="v1", size=3, ok=False),
            ],
        )
    )
    assert result.dropped == {"missing_version": 1}
    assert result.problem == "batches[0].version: must not be empty"
    w = agg.window("m", "v1")
    assert (w.ok, w.batches, w.failed_batches) == (1, 1, 1)


def test_a_report_without_gateway_id_still_counts_its_outcomes(agg: OutcomeAggregator) -> None:
    result = agg.ingest(report(outcome(K.REQUEST_OUTCOME_KIND_OK), gateway=""))
    assert result.counted["ok"] == 1 and result.dropped == {}
    assert agg.window("m", "v1").ok == 1
    assert agg.gateways() == []


class _Tap:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, int, float]] = []
        self.batches: list[tuple[str, str, int, bool]] = []

    def record(self, model: str, version: str, kind: int, latency_s: float) -> None:
        self.requests.append((model, version, kind, latency_s))

    def record_batch(self, model: str, version: str, size: int, ok: bool) -> None:
        self.batches.append((model, version, size, ok))


def test_the_tap_sees_every_valid_item_even_beyond_the_series_cap(clock: ManualClock) -> None:
    tap = _Tap()
    agg = OutcomeAggregator(clock, max_series=1, tap=tap)
    agg.ingest(
        report(
            outcome(K.REQUEST_OUTCOME_KIND_OK, 0.5, model="a"),
            outcome(K.REQUEST_OUTCOME_KIND_OK, model=""),
            outcome(K.REQUEST_OUTCOME_KIND_SHED, 0.0, model="b"),
            batches=[control_pb2.BatchOutcome(model="b", version="v1", size=4, ok=False)],
        )
    )
    assert tap.requests == [
        ("a", "v1", K.REQUEST_OUTCOME_KIND_OK, pytest.approx(0.5)),
        ("b", "v1", K.REQUEST_OUTCOME_KIND_SHED, 0.0),
    ]
    assert tap.batches == [("b", "v1", 4, False)]
    assert [w.model for w in agg.windows()] == ["a"]


def test_series_are_capped(clock: ManualClock) -> None:
    agg = OutcomeAggregator(clock, max_series=2)
    agg.ingest(report(*(outcome(K.REQUEST_OUTCOME_KIND_OK, model=f"m{i}") for i in range(4))))
    assert len(agg.windows()) == 2
    assert agg.dropped_outcomes == 2


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 50.0),  # time offset within the window
            st.sampled_from(
                [
                    K.REQUEST_OUTCOME_KIND_OK,
                    K.REQUEST_OUTCOME_KIND_ERROR,
                    K.REQUEST_OUTCOME_KIND_SHED,
                    K.REQUEST_OUTCOME_KIND_LATE,
                ]
            ),
            st.sampled_from(["v1", "v2"]),
        ),
        max_size=40,
    )
)
def test_window_totals_equal_what_was_reported(
    events: list[tuple[float, control_pb2.RequestOutcomeKind, str]],
) -> None:
    clock = ManualClock(0.0)
    agg = OutcomeAggregator(clock, window_s=60.0, slots=6)
    expected: dict[str, dict[control_pb2.RequestOutcomeKind, int]] = {"v1": {}, "v2": {}}
    for at, kind, version in sorted(events):
        clock.set(at)
        agg.ingest(report(outcome(kind, version=version)))
        expected[version][kind] = expected[version].get(kind, 0) + 1
    # Everything happened within 50 s of t=0 and we read at t=50: all in the window.
    for version, by_kind in expected.items():
        w = agg.window("m", version)
        assert w.ok == by_kind.get(K.REQUEST_OUTCOME_KIND_OK, 0)
        assert w.error == by_kind.get(K.REQUEST_OUTCOME_KIND_ERROR, 0)
        assert w.shed == by_kind.get(K.REQUEST_OUTCOME_KIND_SHED, 0)
        assert w.late == by_kind.get(K.REQUEST_OUTCOME_KIND_LATE, 0)
        assert w.latency.count == w.ok + w.late
