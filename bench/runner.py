"""Runs the batching benchmark's (strategy, workload) cells, in parallel, deterministically.

What it decides: how cells are spread over worker processes and in which order results come
back (always the table's order, whatever order they finish in). Each cell is independent and
fully seeded, so the numbers do not depend on the number of workers — only the wall time does.
Workers rebuild a workload's trace from its spec (cheaper than shipping 30,000 requests between
processes) and keep it for the next cell of the same workload.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.sim import DEVICE_SEED, DeviceModel, DeviceState, SimResult, simulate
from bench.strategies import Strategy
from bench.workload import TraceRequest, WorkloadSpec, build_trace, load_trace


@dataclass(frozen=True, slots=True)
class Workload:
    """Where a cell's trace comes from: a synthetic spec, or a recorded trace file."""

    spec: WorkloadSpec | None = None
    trace_file: str | None = None
    duration_s: float | None = None  # for a trace file; defaults to its span

    def label_rate(self, trace: Sequence[TraceRequest]) -> float:
        if self.spec is not None:
            return self.spec.rate
        return round(len(trace) / self.scoring_duration(trace), 3)

    def scoring_duration(self, trace: Sequence[TraceRequest]) -> float:
        if self.spec is not None:
            return self.spec.duration_s
        if self.duration_s is not None:
            return self.duration_s
        span_ms = trace[-1].arrival_ms if trace else 0.0
        return max(span_ms / 1000.0, 1e-3)


@dataclass(frozen=True, slots=True)
class Cell:
    workload: Workload
    strategy: Strategy
    device: DeviceModel


_TRACES: dict[Workload, list[TraceRequest]] = {}


def trace_for(workload: Workload) -> list[TraceRequest]:
    """The workload's trace, built (or read) once per process."""
    trace = _TRACES.get(workload)
    if trace is None:
        if workload.spec is not None:
            trace = build_trace(workload.spec)
        elif workload.trace_file is not None:
            trace = load_trace(Path(workload.trace_file))
        else:
            raise ValueError("a workload needs a spec or a trace file")
        _TRACES[workload] = trace
    return trace


def run_cell(cell: Cell) -> SimResult:
    trace = trace_for(cell.workload)
    state = DeviceState()
    scheduler = cell.strategy.build(cell.device, state)
    return simulate(
        scheduler,
        trace,
        strategy=cell.strategy.name,
        rate=cell.workload.label_rate(trace),
        device=cell.device,
        device_seed=DEVICE_SEED + cell.strategy.index,
        duration_s=cell.workload.scoring_duration(trace),
        device_state=state,
    )


def run_cells(
    cells: Sequence[Cell],
    *,
    workers: int,
    on_result: Callable[[int, int, SimResult], None] | None = None,
) -> list[SimResult]:
    """Runs every cell and returns results in ``cells`` order.

    ``on_result(done, total, result)`` is called as each finishes (for a progress line).
    Cells of the same workload go to the same worker where possible so traces are reused.
    """
    total = len(cells)
    results: list[SimResult | None] = [None] * total
    workers = max(1, min(workers, total, os.cpu_count() or 1))
    if workers == 1:
        for i, cell in enumerate(cells):
            results[i] = run_cell(cell)
            if on_result is not None:
                on_result(i + 1, total, results[i])  # type: ignore[arg-type]
        return [r for r in results if r is not None]
    # Heaviest workloads first, so the longest cells start early and the tail is short.
    groups: dict[Workload, list[int]] = {}
    for i, cell in enumerate(cells):
        groups.setdefault(cell.workload, []).append(i)
    order = sorted(groups.values(), key=lambda idx: -_weight(cells[idx[0]].workload))
    jobs = [(i, cells[i]) for idx in order for i in idx]
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    with context.Pool(workers) as pool:
        for done, (i, result) in enumerate(
            pool.imap_unordered(_indexed, jobs, chunksize=1), start=1
        ):
            results[i] = result
            if on_result is not None:
                on_result(done, total, result)
    return [r for r in results if r is not None]


def _indexed(job: tuple[int, Cell]) -> tuple[int, SimResult]:
    i, cell = job
    return i, run_cell(cell)


def _weight(workload: Workload) -> float:
    if workload.spec is not None:
        return workload.spec.rate * workload.spec.duration_s
    return float("inf")
