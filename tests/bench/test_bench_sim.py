"""The simulator drives the gateway's own batcher, reproduces the baselines, and ranks them."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import bench
import gateway.batching
from bench.baselines import FixedBatchScheduler
from bench.runner import Cell, Workload, run_cell
from bench.sim import DeviceModel, DeviceState, simulate
from bench.strategies import HALCYON_TOKENS, STRATEGIES, GatewayBatcherScheduler
from bench.workload import WorkloadSpec, build_trace
from gateway.batching import BatcherConfig, DeadlineBatcher

BY_NAME = {s.name: s for s in STRATEGIES}
HALCYON = BY_NAME["halcyon"]


def run(strategy_name: str, rate: float, duration_s: float = 120.0, **spec: object):  # type: ignore[no-untyped-def]
    strategy = HALCYON_TOKENS if strategy_name == HALCYON_TOKENS.name else BY_NAME[strategy_name]
    workload = Workload(spec=WorkloadSpec(rate=rate, duration_s=duration_s, **spec))  # type: ignore[arg-type]
    return run_cell(Cell(workload, strategy, DeviceModel()))


def test_halcyon_row_is_the_gateway_batcher_itself() -> None:
    scheduler = HALCYON.build(DeviceModel(), DeviceState())
    assert isinstance(scheduler, GatewayBatcherScheduler)
    assert type(scheduler.batcher) is gateway.batching.DeadlineBatcher
    assert type(scheduler.batcher).take_batch is DeadlineBatcher.take_batch
    assert type(scheduler.batcher).__module__ == "gateway.batching.batcher"


def test_bench_defines_no_batcher_of_its_own_for_halcyon() -> None:
    bench_dir = Path(inspect.getfile(bench)).parent
    for path in bench_dir.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b) for b in node.bases}
                assert not bases & {"DeadlineBatcher", "gateway.batching.DeadlineBatcher"}, path
            if isinstance(node, ast.FunctionDef):
                assert node.name not in {"plan_batches", "choose_horizon"}, path
    # The adapter only translates units: no scheduling decision lives in it.
    source = inspect.getsource(GatewayBatcherScheduler)
    for word in ("deadline <", "sort(", "heapq", "tokens >"):
        assert word not in source


def test_fixed_batch_reproduces_the_published_row() -> None:
    # Published 155.7 (200) and 5.2 (260) from a 1 ms loop; exact event-driven ~157.0 and 5.3.
    at_200 = run("fixed batch (32 / 25ms, queue 512)", 200)
    at_260 = run("fixed batch (32 / 25ms, queue 512)", 260)
    assert at_200.goodput_per_s == pytest.approx(155.7, rel=0.02)
    assert at_260.goodput_per_s == pytest.approx(5.3, abs=0.5)
    assert at_200.offered == 23_901


def test_original_algorithm_lands_near_its_published_row() -> None:
    result = run("original deadline-aware (seed)", 200)
    assert result.goodput_per_s == pytest.approx(163.6, rel=0.02)
    assert result.urgent_slo == pytest.approx(0.41, abs=0.03)
    assert result.late > 1000  # its optimistic feasibility serves thousands late


def test_halcyon_beats_fixed_batching_at_overload_on_a_short_trace() -> None:
    halcyon = run("halcyon", 260, duration_s=10)
    fixed = run("fixed batch (32 / 25ms, queue 512)", 260, duration_s=10)
    fifo64 = run("fixed batch (32 / 25ms, queue 64)", 260, duration_s=10)
    assert halcyon.goodput_per_s > 1.3 * max(fixed.goodput_per_s, fifo64.goodput_per_s)
    assert halcyon.urgent_slo > 0.8
    assert halcyon.late <= 2  # conservative predictions: late work is rare
    assert halcyon.on_time + halcyon.late + halcyon.shed == halcyon.offered


def test_on_time_tokens_objective_sheds_fewer_large_requests() -> None:
    by_count = run("halcyon", 260, duration_s=10)
    by_tokens = run(HALCYON_TOKENS.name, 260, duration_s=10)
    assert by_count.goodput_per_s > by_tokens.goodput_per_s


def test_simulation_is_deterministic_and_scores_every_request() -> None:
    trace = build_trace(WorkloadSpec(rate=90, duration_s=5))
    results = []
    for _ in range(2):
        scheduler = GatewayBatcherScheduler(DeviceModel(), BatcherConfig())
        results.append(
            simulate(
                scheduler,
                trace,
                strategy="halcyon",
                rate=90,
                device=DeviceModel(),
                device_seed=0xBEEF + 4,
                duration_s=5,
            ).as_json()
        )
    assert results[0] == results[1]
    assert set(results[0]) == {
        "strategy", "rate", "goodput_per_s", "p50_ms", "p95_ms", "p99_ms", "urgent_slo",
        "relaxed_slo", "utilisation", "mean_batch", "shed", "late",
    }  # fmt: skip


def test_a_scheduler_asking_for_a_busy_spin_is_caught() -> None:
    class Spinner(FixedBatchScheduler):
        def next_wakeup(self, now: float, device_free: bool) -> float | None:
            return now

    trace = build_trace(WorkloadSpec(rate=40, duration_s=1))
    with pytest.raises(RuntimeError, match="woken"):
        simulate(
            Spinner(max_items=4, linger_ms=5, max_queue=8),
            trace,
            strategy="spin",
            rate=40,
            device=DeviceModel(),
            device_seed=1,
            duration_s=1,
        )


def test_published_workload_figures() -> None:
    """The issue's bar, on the published traces (one run each, ~1 s)."""
    at_200 = run("halcyon", 200)
    at_260 = run("halcyon", 260)
    assert at_200.goodput_per_s >= 193.0
    assert at_260.goodput_per_s >= 235.0
    assert min(at_200.urgent_slo, at_260.urgent_slo) >= 0.85
    assert at_200.late + at_260.late <= 5
