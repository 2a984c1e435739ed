"""The published benchmark does not move with the three-term cost model.

The simulated device has no decode loop and the bench's adapter passes no output budgets, so
the batcher must reproduce the two-term model's decisions exactly. ``bench_expectation.json``
was produced by the code *before* the step term existed (commit 9e575ff, ``halcyon bench``
cells of 30 s): every number, at full float precision, must come out the same.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.runner import Cell, Workload, run_cell
from bench.sim import DeviceModel
from bench.strategies import HALCYON_TOKENS, STRATEGIES
from bench.workload import WorkloadSpec

EXPECTED = json.loads((Path(__file__).parent / "bench_expectation.json").read_text())
STRATEGY = {s.name: s for s in (*STRATEGIES, HALCYON_TOKENS)}


@pytest.mark.parametrize(
    "expected", EXPECTED, ids=[f"{e['strategy']}@{e['rate']:g}/{e['arrivals']}" for e in EXPECTED]
)
def test_bench_cell_is_byte_identical(expected: dict[str, object]) -> None:
    spec = WorkloadSpec(
        rate=float(expected["rate"]),  # type: ignore[arg-type]
        duration_s=30.0,
        arrivals=expected["arrivals"],  # type: ignore[arg-type]
    )
    result = run_cell(Cell(Workload(spec=spec), STRATEGY[str(expected["strategy"])], DeviceModel()))
    got = dataclasses.asdict(result)
    del got["wall_s"]
    got["arrivals"] = expected["arrivals"]
    assert got == expected
