"""``halcyon loadtest --slo``: the objective parser, the verdicts, and the exit code a pipeline
gates on.

The parser and the judge are pure functions, tested by example and by property (exact targets
whatever binary floating point makes of them; the boundary passes). The command's output is
checked against a fixed result, so "byte-identical without --slo" is a real comparison; one
test drives a real gateway (the e2e launcher) with an objective it meets (exit 0) and one no
run can meet (``p50=1us``, exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from halcyon.tools import loadtest
from halcyon.tools.cli import main as halcyon_main
from halcyon.tools.loadtest import (
    SLO_QUANTILES,
    SLO_RATES,
    LoadResult,
    Objective,
    Tally,
    judge,
    parse_slo,
    render,
    summarize,
    verdict_line,
)
from tests.support import e2e

REPO = Path(__file__).resolve().parents[2]


# -- parse_slo ----------------------------------------------------------------------------------


def test_the_issue_example_parses_to_exact_targets() -> None:
    assert parse_slo("p99=200ms,success=99.9%") == [
        Objective("p99", Fraction(200), "p99=200ms"),
        Objective("success", Fraction(999, 10), "success=99.9%"),
    ]


@pytest.mark.parametrize(
    ("text", "metric", "target_ms"),
    [
        ("p50=1us", "p50", Fraction(1, 1000)),
        ("p90=250µs", "p90", Fraction(1, 4)),
        ("p95=12.5ms", "p95", Fraction(25, 2)),
        ("p999=1.5s", "p999", Fraction(1500)),
        ("p99=2s", "p99", Fraction(2000)),
    ],
)
def test_durations_are_converted_to_milliseconds(
    text: str, metric: str, target_ms: Fraction
) -> None:
    [objective] = parse_slo(text)
    assert (objective.metric, objective.target, objective.is_latency) == (metric, target_ms, True)


def test_spaces_around_terms_are_allowed_and_order_is_kept() -> None:
    objectives = parse_slo(" goodput = 95% , p50=10ms ,success=100%")
    assert [(o.metric, o.target) for o in objectives] == [
        ("goodput", Fraction(95)),
        ("p50", Fraction(10)),
        ("success", Fraction(100)),
    ]
    assert not objectives[0].is_latency


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("p99=200", "'p99=200'"),  # no unit
        ("p99=200m", "'p99=200m'"),  # not a unit
        ("p99=0ms", "'p99=0ms'"),
        ("p99=-5ms", "'p99=-5ms'"),
        ("p99=1e3ms", "'p99=1e3ms'"),
        ("p99=nanms", "'p99=nanms'"),
        ("p99=ms", "'p99=ms'"),
        ("p98=1ms", "unknown metric 'p98'"),
        ("P99=1ms", "unknown metric 'P99'"),
        ("success=99.9", "'success=99.9'"),  # no % sign: 0.999 or 99.9?
        ("success=0%", "'success=0%'"),
        ("goodput=100.1%", "'goodput=100.1%'"),
        ("success=%", "'success=%'"),
        ("p99=200ms,success", "'success'"),
        ("=5ms", "'=5ms'"),
        ("p99=200ms,,success=1%", "empty objective"),
        ("p99=200ms,", "empty objective"),
        ("", "empty objective"),
        ("p99=1ms,p99=2ms", "'p99=2ms': p99 given twice"),
    ],
)
def test_a_malformed_spec_names_the_bad_term(text: str, names: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_slo(text)
    assert names in str(caught.value)


def test_a_malformed_spec_is_a_usage_error_naming_the_term(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        halcyon_main(["loadtest", "--slo", "p99=200ms,succes=99%"])
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "argument --slo: 'succes=99%': unknown metric 'succes'" in err[0]
    assert "--help" in err[0]


_NUMBER = st.decimals(
    min_value="0.001", max_value="100000", places=3, allow_nan=False, allow_infinity=False
)
_PERCENT = st.decimals(min_value="0.001", max_value="100", places=3)


@st.composite
def _specs(draw: st.DrawFn) -> tuple[str, list[tuple[str, Fraction]]]:
    metrics = draw(st.lists(st.sampled_from([*SLO_QUANTILES, *SLO_RATES]), unique=True, min_size=1))
    terms, expected = [], []
    for metric in metrics:
        if metric in SLO_QUANTILES:
            number = draw(_NUMBER)
            unit, scale = draw(
                st.sampled_from(
                    [("us", Fraction(1, 1000)), ("ms", Fraction(1)), ("s", Fraction(1000))]
                )
            )
            terms.append(f"{metric}={number}{unit}")
            expected.append((metric, Fraction(number) * scale))
        else:
            number = draw(_PERCENT)
            terms.append(f"{metric}={number}%")
            expected.append((metric, Fraction(number)))
    return ",".join(terms), expected


@given(_specs())
def test_every_well_formed_spec_parses_exactly(
    spec: tuple[str, list[tuple[str, Fraction]]],
) -> None:
    text, expected = spec
    assert [(o.metric, o.target) for o in parse_slo(text)] == expected


@given(st.text(max_size=40))
def test_any_text_parses_or_is_refused_with_a_value_error(text: str) -> None:
    try:
        objectives = parse_slo(text)
    except ValueError as err:
        assert str(err)
    else:
        assert objectives
        assert all(o.target > 0 for o in objectives)
        assert len({o.metric for o in objectives}) == len(objectives)


# -- judge --------------------------------------------------------------------------------------


def _report(ok: int, on_time: int, requests: int) -> dict[str, Any]:
    return {"ok": ok, "on_time": on_time, "requests": requests}


def test_a_rate_exactly_at_its_target_passes_and_one_request_less_fails() -> None:
    [objective] = parse_slo("success=99.9%")
    # 0.999 is not a binary fraction: a float comparison could get either side wrong.
    assert judge([objective], [1.0], _report(999, 999, 1000))[0].passed
    assert not judge([objective], [1.0], _report(998, 998, 1000))[0].passed


def test_goodput_counts_on_time_successes_only() -> None:
    objectives = parse_slo("success=100%,goodput=90%")
    success, goodput = judge(objectives, [1.0] * 10, _report(10, 8, 10))
    assert success.passed and success.measured == 100.0 and success.count == (10, 10)
    assert not goodput.passed and goodput.measured == 80.0 and goodput.count == (8, 10)


def test_a_quantile_is_nearest_rank_like_the_report_and_the_target_itself_passes() -> None:
    latencies = [float(i) for i in range(1, 101)]  # 1 .. 100 ms, shuffled below
    latencies.reverse()
    p50, p99, p999 = judge(parse_slo("p50=50ms,p99=98ms,p999=100ms"), latencies, _report(1, 1, 1))
    assert (p50.measured, p50.passed) == (50.0, True)
    assert (p99.measured, p99.passed) == (99.0, False)
    assert (p999.measured, p999.passed) == (100.0, True)
    report = summarize(_tally(latencies), 1.0, None)
    assert p50.measured == report["p50_ms"]


def test_nothing_measured_fails_every_objective() -> None:
    verdicts = judge(parse_slo("p99=10s,success=1%"), [], _report(0, 0, 0))
    assert [(v.measured, v.passed) for v in verdicts] == [(None, False), (None, False)]
    assert "no successful request" in verdict_line(verdicts[0])
    assert "no request ended" in verdict_line(verdicts[1])


@given(
    st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False), min_size=1, max_size=60),
    st.sampled_from(sorted(SLO_QUANTILES)),
    st.floats(min_value=1e-3, max_value=1e5, allow_nan=False),
)
def test_a_quantile_passes_exactly_when_at_most_its_target(
    latencies: list[float], metric: str, target: float
) -> None:
    objective = Objective(metric, Fraction(target), f"{metric}={target}ms")
    [verdict] = judge([objective], latencies, _report(len(latencies), 0, len(latencies)))
    ordered = sorted(latencies)
    rank = max(1, math.ceil(SLO_QUANTILES[metric] * len(ordered)))
    assert verdict.measured == ordered[rank - 1]
    assert verdict.passed == (ordered[rank - 1] <= target)


@given(
    st.integers(min_value=1, max_value=10_000).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(min_value=0, max_value=n))
    ),
    _PERCENT,
)
def test_a_rate_passes_exactly_when_at_least_its_target(
    counts: tuple[int, int], percent: Any
) -> None:
    requests, ok = counts
    [objective] = parse_slo(f"success={percent}%")
    [verdict] = judge([objective], [], _report(ok, 0, requests))
    assert verdict.passed == (ok * 100 >= Fraction(percent) * requests)


# -- the command's output -----------------------------------------------------------------------


def _tally(latencies: list[float]) -> Tally:
    tally = Tally(latencies_ms=list(latencies), added_ms=[0.5] * len(latencies))
    tally.outcomes["OK"] = len(latencies)
    tally.on_time = len(latencies)
    tally.versions["v1"] = len(latencies)
    tally.batch_sizes = [1] * len(latencies)
    return tally


@pytest.fixture
def fixed_run(monkeypatch: pytest.MonkeyPatch) -> LoadResult:
    """``run_loadtest`` answers with a fixed result: 20 successes of 1..20 ms."""
    latencies = [float(i) for i in range(1, 21)]
    report = summarize(_tally(latencies), 2.0, None, window_s=2.0)
    result = LoadResult.from_report("2 clients", report, latencies)
    monkeypatch.setattr(loadtest, "run_loadtest", lambda options: result)
    return result


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loadtest.configure(parser)
    return parser.parse_args(["--clients", "2", "--seconds", "2", *argv])


def test_without_slo_the_output_is_what_it_always_was(
    fixed_run: LoadResult, capsys: pytest.CaptureFixture[str]
) -> None:
    assert loadtest.run(_args()) == 0
    out = capsys.readouterr()
    header = "halcyon loadtest — 2 clients, 2 s against 127.0.0.1:50051"
    assert out.out == f"{header}\n{render(fixed_run.report)}\n"
    assert out.err == ""
    assert loadtest.run(_args("--json")) == 0
    out = capsys.readouterr()
    assert out.out == json.dumps({"mode": "2 clients", **fixed_run.report}) + "\n"
    assert out.err == ""


def test_with_slo_a_line_per_objective_follows_and_a_miss_exits_1(
    fixed_run: LoadResult, capsys: pytest.CaptureFixture[str]
) -> None:
    assert loadtest.run(_args("--slo", "p99=20ms,success=100%")) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert out.out.startswith("halcyon loadtest — 2 clients, 2 s against 127.0.0.1:50051\n")
    assert lines[-2].split() == ["SLO", "p99", "<=", "20ms", "measured", "20.00", "ms", "PASS"]
    assert lines[-1].split()[-1] == "PASS" and "100.000% (20 of 20)" in lines[-1]
    assert out.err == ""

    assert loadtest.run(_args("--slo", "p50=1us,p99=1s")) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[-2].split()[-1] == "FAIL"
    assert out.out.splitlines()[-1].split()[-1] == "PASS"
    assert out.err == "loadtest: missed 1 of 2 objectives: p50=1us\n"


def test_with_slo_and_json_the_verdicts_are_in_the_object(
    fixed_run: LoadResult, capsys: pytest.CaptureFixture[str]
) -> None:
    assert loadtest.run(_args("--json", "--slo", "p50=1us")) == 1
    out = capsys.readouterr()
    obj = json.loads(out.out)  # stdout stays one JSON object
    assert obj["slo"] == [
        {"objective": "p50=1us", "metric": "p50", "target": 0.001, "unit": "ms",
         "measured": 10.0, "passed": False}
    ]  # fmt: skip
    assert {k: v for k, v in obj.items() if k != "slo"} == {"mode": "2 clients", **fixed_run.report}
    assert "FAIL" in out.err


# -- against a real gateway ---------------------------------------------------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    launcher = e2e.Launcher(tmp_path)
    try:
        yield launcher.fleet().gateway.grpc
    finally:
        launcher.close()


def _loadtest(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    return subprocess.run(
        [sys.executable, "-m", "halcyon", "loadtest", "--target", target, "--clients", "4",
         "--seconds", "1.5", *args],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


@pytest.mark.e2e
def test_a_real_run_passes_an_slo_it_meets_and_fails_one_it_cannot(gateway: str) -> None:
    met = _loadtest(gateway, "--slo", "p99=5s,success=90%,goodput=90%")
    assert met.returncode == 0, met.stdout + met.stderr
    slo_lines = [line for line in met.stdout.splitlines() if line.startswith("  SLO ")]
    assert [line.split()[1] for line in slo_lines] == ["p99", "success", "goodput"]
    assert all(line.endswith("PASS") for line in slo_lines), slo_lines

    missed = _loadtest(gateway, "--json", "--slo", "p50=1us,success=90%")
    assert missed.returncode == 1, missed.stdout + missed.stderr
    report = json.loads(missed.stdout)
    assert report["ok"] > 0
    assert [(v["metric"], v["passed"]) for v in report["slo"]] == [
        ("p50", False),
        ("success", True),
    ]
    assert report["slo"][0]["measured"] == report["p50_ms"]
    assert "missed 1 of 2 objectives: p50=1us" in missed.stderr
