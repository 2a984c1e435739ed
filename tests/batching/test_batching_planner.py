"""The batch plan: EDF batches bounded by deadlines and the horizon; Moore–Hodgson drops."""

from __future__ import annotations

import math

import pytest
from batching_helpers import exact_model

from bench.workload import WorkloadSpec, build_trace
from gateway.batching import BatchItem, DropReason, Lane, Objective
from gateway.batching.horizon import choose_horizon, deadline_classes, protecting_horizon
from gateway.batching.planner import (
    Plan,
    PlannedBatch,
    SlotView,
    overtake_delay,
    overtake_slope,
    plan_batches,
)


def item(name: str, tokens: int, deadline: float, lane: Lane = Lane.INTERACTIVE) -> BatchItem[str]:
    return BatchItem(name, tokens, deadline, lane, 0.0, 0)


def plan(
    items: list[BatchItem[str]],
    *,
    horizon: float = math.inf,
    objective: Objective = Objective.ON_TIME_REQUESTS,
) -> Plan[str]:
    slot = SlotView("r", exact_model(), 0.0, 0.0)
    interactive = [i for i in items if i.lane is Lane.INTERACTIVE]
    bulk = [i for i in items if i.lane is Lane.BULK]
    return plan_batches(
        (interactive, bulk),
        [slot],
        now=0.0,
        horizon=horizon,
        max_items=256,
        max_tokens=1 << 20,
        objective=objective,
    )


def names(batch: PlannedBatch[str]) -> list[str]:
    return [i.payload for i in batch.items]


def test_tight_work_gets_a_small_early_batch_and_patient_work_a_large_one() -> None:
    p = plan([item("u", 100, 0.025), *(item(f"r{k}", 100, 0.9) for k in range(5))])
    # 10 ms + 0.1 ms/token: "u" alone ends at 20 ms; with one more it would end at 30 > 25.
    assert [names(b) for b in p.batches] == [["u"], ["r0", "r1", "r2", "r3", "r4"]]
    assert p.first_full and not p.drops


def test_horizon_caps_a_batch_even_when_deadlines_would_allow_more() -> None:
    p = plan([item(f"r{k}", 100, 5.0) for k in range(6)], horizon=0.040)
    assert [len(b.items) for b in p.batches] == [3, 3]


def test_moore_hodgson_drops_the_largest_request_scheduled_so_far() -> None:
    p = plan([item("big", 2000, 0.24), *(item(f"s{k}", 100, 0.25) for k in range(10))])
    assert [(i.payload, r) for i, r, _ in p.drops] == [("big", DropReason.SHED_FOR_GOODPUT)]
    assert sum(len(b.items) for b in p.batches) == 10


def test_on_time_tokens_drops_the_smallest_request_that_repairs_the_overrun() -> None:
    p = plan(
        [item("big", 2000, 0.24), *(item(f"s{k}", 100, 0.25) for k in range(10))],
        objective=Objective.ON_TIME_TOKENS,
    )
    dropped = {i.payload for i, _r, _p in p.drops}
    assert "big" not in dropped and dropped and all(name.startswith("s") for name in dropped)


def test_bulk_work_is_shed_before_interactive_work() -> None:
    p = plan([item("i", 100, 0.05), item("b", 50, 0.032, Lane.BULK), item("i2", 100, 0.05)])
    # Bulk goes after interactive work and would be late; it is the one shed, though smaller.
    assert [i.payload for i, _r, _p in p.drops] == ["b"]
    q = plan([item("b", 3000, 5.0, Lane.BULK), item("i", 100, 0.2), item("i2", 1000, 0.25)])
    assert [i.payload for i, _r, _p in q.drops] == []  # bulk waits behind, nothing late


def test_hopeless_work_is_missed_not_shed() -> None:
    p = plan([item("x", 100, 0.015), item("y", 100, 0.5)])  # x needs 20 ms
    assert [(i.payload, r) for i, r, _ in p.drops] == [("x", DropReason.DEADLINE_MISSED)]
    # Only work still in the plan sets the next eviction check: y, alone, must start by 480 ms.
    assert p.earliest_hopeless == pytest.approx(0.5 - 0.020)


def test_overtaking_work_delays_later_batches_only() -> None:
    bounds, rates = [0.2], [2000.0]  # 2000 tokens/s with a budget under 200 ms
    slope = overtake_slope(0.010, 0.0001, math.inf, 1)
    assert overtake_delay(bounds, rates, slope, 0.5, 0.0) == 0.0  # starting now
    assert overtake_delay(bounds, rates, slope, 0.1, 0.3) == 0.0  # tighter than the bound
    delay = overtake_delay(bounds, rates, slope, 0.5, 0.3)
    assert delay == 0.2 * 0.3 / 0.8  # rho = 0.2: work progresses at 80 % speed
    # With batches capped at a horizon, overtaking work also costs extra intercepts.
    assert overtake_slope(0.010, 0.0001, 0.040, 1) == 0.0001 * 0.040 / 0.030


def test_horizon_protects_a_tight_class_only_when_that_pays() -> None:
    assert deadline_classes([0.12, 0.1199999, 0.9, 0.12]) == [(0.1199999, 0.12), (0.9, 0.9)]
    h = protecting_horizon(0.12, 11_000, intercept=0.018, slope=2.2e-5, spread_factor=1.09, slots=1)
    assert 0.06 <= h <= 0.12
    # The published mix (30 % at 120 ms, 70 % at 900 ms) at 200 requests/s: protect 120 ms.
    trace = build_trace(WorkloadSpec(rate=200, duration_s=5))
    window = [((r.deadline_ms - r.arrival_ms) / 1000, r.tokens) for r in trace]
    choice = choose_horizon(window, 5.0, intercept=0.018, slope=2.2e-5, spread_factor=1.09, slots=1)
    assert choice.budget == pytest.approx(0.12)
    assert choice.horizon == pytest.approx(
        protecting_horizon(
            0.12,
            choice.budget_token_rate,
            intercept=0.018,
            slope=2.2e-5,
            spread_factor=1.09,
            slots=1,
        )
    )
    assert 0.06 < choice.horizon < 0.09 and 100 < choice.size_cut < 4096
    # A 30 ms class on a 18 ms-intercept device would leave almost no capacity: don't.
    tight = [(0.03 if r < 0.5 else 0.9, t) for r, t in window]
    choice = choose_horizon(tight, 5.0, intercept=0.018, slope=2.2e-5, spread_factor=1.09, slots=1)
    assert choice.budget == 0.9
    assert (
        choose_horizon([], 1.0, intercept=0.018, slope=2.2e-5, spread_factor=1.0, slots=1).horizon
        == math.inf
    )


def test_unprotected_requests_ride_along_but_never_cut_a_batch_short() -> None:
    slot = SlotView("r", exact_model(), 0.0, 0.0)
    # "u" has a 50 ms budget in a class the horizon does not protect; "r*" are patient.
    u = BatchItem("u", 100, 0.05, Lane.INTERACTIVE, 0.0, 0)
    patient = [BatchItem(f"r{i}", 100, 0.9, Lane.INTERACTIVE, 0.0, 0) for i in range(5)]

    def run(opportunistic_below: float) -> Plan[str]:
        return plan_batches(
            ([u, *patient], []),
            [slot],
            now=0.0,
            horizon=math.inf,
            max_items=256,
            max_tokens=1 << 20,
            objective=Objective.ON_TIME_REQUESTS,
            opportunistic_below=opportunistic_below,
        )

    protected = run(0.0)  # u protected: the first batch stops at its deadline
    assert [names(b) for b in protected.batches] == [["u", "r0", "r1", "r2"], ["r3", "r4"]]
    riding = run(0.1)  # u unprotected: the batch grows and u, now late in it, is shed
    assert [names(b) for b in riding.batches] == [["r0", "r1", "r2", "r3", "r4"]]
    assert [(i.payload, r) for i, r, _ in riding.drops] == [("u", DropReason.SHED_FOR_GOODPUT)]
