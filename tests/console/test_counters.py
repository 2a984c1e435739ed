"""Increases from the gateways' cumulative counts: baseline, growth, restart, forgetting."""

from __future__ import annotations

from common.clock import ManualClock
from controller.console.counters import CumulativeDeltas
from controller.console.history import (
    OTHER_TENANTS,
    GatewayCounters,
    TrafficHistory,
)


def test_the_first_look_is_a_baseline_then_increases_are_differences() -> None:
    deltas: CumulativeDeltas[str] = CumulativeDeltas()
    assert deltas.update({"gw": {"quota": 100, "overloaded": 5}}) == {}
    assert deltas.update({"gw": {"quota": 103, "overloaded": 5}}) == {"quota": 3}
    # A counter seen for the first time grew from zero.
    assert deltas.update({"gw": {"quota": 103, "overloaded": 5, "queue_full": 2}}) == {
        "queue_full": 2
    }


def test_increases_are_summed_over_gateways() -> None:
    deltas: CumulativeDeltas[str] = CumulativeDeltas()
    deltas.update({"a": {"quota": 1}, "b": {"quota": 10}})
    assert deltas.update({"a": {"quota": 3}, "b": {"quota": 15}}) == {"quota": 7}


def test_a_gateway_whose_counts_went_down_restarted_and_counts_from_zero() -> None:
    deltas: CumulativeDeltas[str] = CumulativeDeltas()
    deltas.update({"gw": {"quota": 500, "overloaded": 40}})
    # quota went down: the process restarted, so both counters are new since the restart
    # (overloaded at 41 is not 1 more than 40, it is 41 since the restart).
    assert deltas.update({"gw": {"quota": 4, "overloaded": 41}}) == {"quota": 4, "overloaded": 41}
    assert deltas.resets == 1
    assert deltas.update({"gw": {"quota": 6, "overloaded": 41}}) == {"quota": 2}
    assert deltas.resets == 1


def test_a_gateway_no_longer_reported_is_forgotten_and_its_return_is_a_baseline() -> None:
    deltas: CumulativeDeltas[str] = CumulativeDeltas()
    deltas.update({"gw": {"quota": 5}})
    deltas.update({})
    assert deltas.update({"gw": {"quota": 9}}) == {}  # baseline again, not +4
    assert deltas.update({"gw": {"quota": 10}}) == {"quota": 1}


def test_history_keeps_shed_and_tenant_rates_per_slot_across_a_restart() -> None:
    clock = ManualClock(100.0)
    history = TrafficHistory(clock, horizon_s=10)

    def tick(quota: int, requests: int) -> None:
        counters = GatewayCounters(
            sheds={"quota_exceeded": quota, "overloaded": 0},
            tenants={"acme": {"requests": requests, "quota_refused": quota}},
        )
        history.sample([], [], [("gw", counters)])
        clock.advance(1.0)

    tick(50, 80)  # baseline: not traffic of this second
    tick(53, 90)
    tick(2, 4)  # the gateway restarted
    tick(2, 4)  # nothing happened
    first, second, third, fourth = history.points()
    assert (first["sheds"], first["tenants"]) == ({}, {})
    assert second["sheds"] == {"quota_exceeded": 3}
    assert second["tenants"]["acme"]["requests"] == 10
    assert second["tenants"]["acme"]["quota_refused"] == 3
    assert third["sheds"] == {"quota_exceeded": 2}
    assert third["tenants"]["acme"]["requests"] == 4
    assert (fourth["sheds"], fourth["tenants"]) == ({}, {})
    assert all(n >= 0 for p in history.points() for n in p["sheds"].values())


def test_tenants_beyond_the_bound_are_summed_as_other() -> None:
    clock = ManualClock(0.0)
    history = TrafficHistory(clock, horizon_s=5, max_tenants=3)

    def counts(n: int) -> list[tuple[str, GatewayCounters]]:
        tenants = {f"t{i}": {"requests": n} for i in range(5)}
        return [("gw", GatewayCounters(tenants=tenants))]

    history.sample([], [], counts(0))
    history.sample([], [], counts(2))
    clock.advance(1.0)
    [point] = history.points()
    assert sorted(point["tenants"]) == [OTHER_TENANTS, "t0", "t1"]
    assert point["tenants"][OTHER_TENANTS]["requests"] == 6  # t2, t3, t4
    assert sum(t["requests"] for t in point["tenants"].values()) == 10
