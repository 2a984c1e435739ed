"""``halcyon bench``: flags, JSON records, plots, trace replay and scenario dispatch."""

from __future__ import annotations

import argparse
import io
import json
import sys
import types
from pathlib import Path

import pytest

from bench import cli
from bench.workload import WorkloadSpec, build_trace, dump_trace


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def run_batching(*argv: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    assert cli.run_batching(parse(*argv), out, err) == 0
    return out.getvalue(), err.getvalue()


def test_defaults_are_the_published_workload() -> None:
    args = parse()
    assert args.scenario == "batching"
    assert args.rates == [40.0, 90.0, 200.0, 260.0]
    assert args.seed == 0xC0FFEE
    assert (args.urgent_share, args.urgent_slo_ms, args.relaxed_slo_ms) == (0.3, 120.0, 900.0)
    assert (args.intercept_ms, args.ms_per_token, args.jitter) == (18.0, 0.022, 0.08)
    assert parse("--seed", "0x10").seed == 16


def test_json_prints_one_record_per_strategy_and_rate() -> None:
    out, err = run_batching(
        "--json", "--rates", "60,150", "--duration", "3", "--workers", "1", "--arrivals", "bursty"
    )
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 2 * 5
    assert {r["rate"] for r in records} == {60.0, 150.0}
    assert records[-1]["strategy"] == "halcyon"
    assert set(records[0]) == {
        "strategy", "rate", "goodput_per_s", "p50_ms", "p95_ms", "p99_ms", "urgent_slo",
        "relaxed_slo", "utilisation", "mean_batch", "shed", "late",
    }  # fmt: skip
    assert "cells in" in err  # timing goes to stderr, never into the JSON stream


def test_table_and_workload_flags() -> None:
    out, _err = run_batching(
        "--rates", "120", "--duration", "2", "--workers", "1", "--urgent-share", "0.5",
        "--urgent-slo-ms", "200", "--size-mu", "5", "--size-sigma", "0.5", "--intercept-ms", "10",
        "--ms-per-token", "0.03", "--jitter", "0.02", "--objective", "both",
    )  # fmt: skip
    assert "50% urgent @ 200 ms" in out and "device 10 ms + 0.03 ms/token" in out
    assert "| halcyon (on-time tokens)" in out
    assert out.count("\n| ") == 1 + 6  # header and six rows (the divider starts "|-")


def test_trace_replay(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    dump_trace(build_trace(WorkloadSpec(rate=100, duration_s=2)), path)
    out, _err = run_batching("--trace", str(path), "--json", "--workers", "1")
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 5 and all(95 < r["rate"] < 105 for r in records)


def test_plot_is_written(tmp_path: Path) -> None:
    target = tmp_path / "bench.png"
    _out, err = run_batching(
        "--rates", "50,150", "--duration", "2", "--workers", "2", "--plot", str(target)
    )
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in err


def test_progress_only_when_asked_or_on_a_terminal() -> None:
    _out, err = run_batching("--rates", "50", "--duration", "1", "--workers", "1")
    assert "[1/" not in err
    _out, err = run_batching("--rates", "50", "--duration", "1", "--workers", "1", "--progress")
    assert "[5/5]" in err


def test_bad_flags_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse("--rates", "fast")
    assert cli.run(parse("--jitter", "2")) == 2


@pytest.mark.parametrize("scenario", ["fleet", "herd"])
def test_other_scenarios_dispatch_to_the_fleet_benchmarks(
    scenario: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[object, ...]] = []

    def fleet_main(seed: int, duration_s: float | None, as_json: bool, out: object) -> int:
        calls.append(("fleet", seed, duration_s, as_json))
        return 0

    def herd_main(seed: int, as_json: bool, out: object) -> int:
        calls.append(("herd", seed, as_json))
        return 0

    fake = types.ModuleType("bench.fleet")
    fake.fleet_main = fleet_main  # type: ignore[attr-defined]
    fake.herd_main = herd_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.fleet", fake)
    assert cli.run(parse("--scenario", scenario, "--seed", "7", "--json")) == 0
    expected = ("fleet", 7, None, True) if scenario == "fleet" else ("herd", 7, True)
    assert calls == [expected]
