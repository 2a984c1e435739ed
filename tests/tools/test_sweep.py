"""``halcyon sweep``: rates relative to the measured capacity, the seed's mix scaled to the
model, the table it prints — and one real sweep over a simulated fleet, end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from halcyon.tools.loadtest import SloClass
from halcyon.tools.sweep import Point, parse_rates, scaled_mix, table


def test_relative_rates_are_multiples_of_the_measured_capacity() -> None:
    assert parse_rates("0.5x,1x,2.5x", 40.0) == [20.0, 40.0, 100.0]
    assert parse_rates("10, 25", None) == [10.0, 25.0]


@pytest.mark.parametrize("text", ["", "0x", "-3", "1x,abc"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rates(text, 10.0)


def test_relative_rates_need_a_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        parse_rates("1x", None)


def test_the_seed_mix_is_scaled_to_the_unbatched_service_time() -> None:
    urgent, relaxed = scaled_mix(20.0)
    # The seed: 120 ms and 900 ms against ~21 ms of unbatched service.
    assert (urgent.name, urgent.share, urgent.deadline_ms) == ("urgent", 0.3, 120)
    assert (relaxed.name, relaxed.share, relaxed.deadline_ms) == ("relaxed", 0.7, 900)


def test_the_table_has_a_row_per_point_and_a_column_per_class() -> None:
    mix = (SloClass("urgent", 0.3, 100), SloClass("relaxed", 0.7, 900))
    point = Point(
        strategy="halcyon",
        offered_rps=30.0,
        goodput_rps=29.0,
        p50_ms=50.0,
        p95_ms=90.0,
        p99_ms=120.0,
        on_time={"urgent": 0.95, "relaxed": 1.0},
        gateway_cpu_ms=1.5,
        worker_cpu_ms=20.0,
        mean_batch=3.2,
        admitted_late_share=0.004,
        succeeded=600,
        offered=600,
    )
    lines = table([point, point], 20.0, mix).splitlines()
    assert len(lines) == 4
    assert "urgent on time" in lines[0] and "relaxed on time" in lines[0]
    row = "| 30.0 | 1.50 | halcyon | 29.0 | 50 | 90 | 120 | 95.0 % | 100.0 % | 0.4 % |"
    assert row in lines[2]


@pytest.mark.e2e
def test_a_sweep_over_a_simulated_fleet_reports_every_point(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable, "-m", "halcyon", "sweep", "--runtime", "simulated",
            "--strategies", "halcyon,none", "--rates", "1.5x", "--seconds", "2",
            "--out", str(out),
        ],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["capacity_rps"] > 0
    points = {p["strategy"]: p for p in doc["points"]}
    assert set(points) == {"halcyon", "none"}
    for p in points.values():
        assert p["offered"] > 0 and p["succeeded"] > 0
    assert points["none"]["mean_batch"] == pytest.approx(1.0)
    assert (out / "sweep.png").stat().st_size > 0
    assert "| halcyon |" in (out / "sweep.md").read_text()
