"""The sweep: Wilson intervals, matched-rate selection, determinism over jobs, the CLI."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from bench import cli
from bench.rollout_curves import (
    BadCase,
    CurvePoint,
    SweepConfig,
    matched,
    run_sweep,
    sweep_settings,
    wilson,
)
from bench.rollout_judges import JudgeSetting
from bench.rollout_report import report
from bench.rollout_sim import SimConfig
from controller.canary import JudgePolicy


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_wilson_interval_matches_the_textbook_values() -> None:
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(10, 1000) == pytest.approx((0.00544, 0.01831), abs=1e-4)
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


def point(
    judge: str, params: tuple[tuple[str, float], ...], rollbacks: int, blast: float
) -> CurvePoint:
    return CurvePoint(
        evidence="m",
        setting=JudgeSetting(judge, params),
        aa_seeds=1000,
        aa_rollbacks=rollbacks,
        aa_reasons={},
        bad={"errors": BadCase(200, 1.0, 0.0, blast, 2 * blast)},
        good={},
    )


def test_matched_rate_picks_the_rivals_best_setting_no_less_careful_than_halcyon() -> None:
    halcyon = point("halcyon", (), 8, 100.0)  # 0.8 %, Wilson upper ~1.6 %
    rivals = [
        point("flagger", (("threshold", 0.5),), 400, 5.0),  # reckless: past USABLE_FRR
        point("flagger", (("threshold", 1.0),), 40, 50.0),  # fast but careless: excluded
        point("flagger", (("threshold", 2.0),), 12, 150.0),  # <= the upper bound only
        point("flagger", (("threshold", 5.0),), 8, 400.0),  # as careful: matched
        point("flagger", (("threshold", 10.0),), 0, 900.0),
        point("argo", (("failure_limit", 0.0),), 30, 10.0),  # no setting that careful
        point("halcyon", (("false_alarm_rate", 0.05),), 30, 20.0),
    ]
    rows = {m.rival: m for m in matched([halcyon, *rivals])}
    flagger = rows["flagger"]
    assert flagger.best is not None and flagger.best.setting.params == (("threshold", 5.0),)
    assert flagger.ratio(flagger.best) == pytest.approx(0.25)
    assert flagger.best_at_hi is not None
    assert flagger.best_at_hi.setting.params == (("threshold", 2.0),)
    # Halcyon's points at 0.8 % and 3 % beat thresholds 1, 2 and 5 at equal or lower rates;
    # nothing of Halcyon's is as careful as threshold 10 (0 %). The careless threshold 0.5 (40 %
    # of healthy canaries rolled back) is faster than any Halcyon point, and past USABLE_FRR.
    assert (flagger.dominated, flagger.settings) == (3, 5)
    assert (flagger.dominated_usable, flagger.usable) == (3, 4)
    assert (flagger.dominated_target, flagger.at_target) == (1, 2)  # threshold 5 and 10
    # At the 1 %: Halcyon's best is its default (the 3 % point is past it), the rival's
    # best at <= 1 % is threshold 5.
    assert flagger.curve_halcyon is not None and flagger.curve_halcyon.setting.params == ()
    assert flagger.curve_rival is not None
    assert flagger.curve_rival.setting.params == (("threshold", 5.0),)
    assert flagger.curve_ratio() == pytest.approx(0.25)
    argo = rows["argo"]
    assert argo.best is None and argo.best_at_hi is None and argo.dominated == 0
    assert argo.curve_rival is None and argo.curve_ratio() is None
    assert (argo.dominated_usable, argo.usable) == (0, 1)


def test_halcyons_curve_is_its_best_point_at_the_target_rate() -> None:
    halcyon = point("halcyon", (), 5, 100.0)  # 0.5 %
    looser = point("halcyon", (("false_alarm_rate", 0.5),), 2, 40.0)  # 0.2 %: on the curve
    careless = point("halcyon", (("false_alarm_rate", 0.9),), 20, 10.0)  # 2 %: past 1 %
    rival = point("original", (("unhealthy", 3.0),), 9, 120.0)  # 0.9 %
    (row,) = matched([halcyon, looser, careless, rival])
    assert row.curve_halcyon is looser and row.curve_rival is rival
    assert row.curve_ratio() == pytest.approx(40.0 / 120.0)
    # At the default's own 0.5 % no original setting is as careful; along the curve, one is.
    assert row.best is None and row.ratio(row.best) is None
    assert (row.dominated, row.dominated_usable, row.usable) == (1, 1, 1)


def test_a_halcyon_setting_that_lets_bad_canaries_through_is_not_on_its_curve() -> None:
    halcyon = point("halcyon", (), 0, 100.0)
    leaky = point("halcyon", (("healthy", 1.0),), 0, 10.0)
    leaky.bad["errors"] = BadCase(200, 0.9, 0.1, 10.0, 20.0)  # lets 10 % through
    rival = point("original", (("unhealthy", 3.0),), 0, 50.0)
    (row,) = matched([halcyon, leaky, rival])
    assert row.curve_halcyon is halcyon and row.curve_ratio() == pytest.approx(2.0)
    assert (row.dominated, row.dominated_target) == (0, 0)


def small(jobs: int) -> SweepConfig:
    sim = SimConfig(
        seeds=2, first_seed=7, evidence=("independent",), policy=JudgePolicy(max_duration_s=600.0)
    )
    settings = (
        JudgeSetting("halcyon"),
        JudgeSetting("flagger", (("threshold", 1.0),)),
        JudgeSetting("argo", (("failure_limit", 0.0),)),
        JudgeSetting("fixed-interval", (("interval_s", 30.0),)),
    )
    return SweepConfig(sim=sim, settings=settings, aa_seeds=3, jobs=jobs)


def test_the_sweep_is_the_same_whatever_the_job_count() -> None:
    one, two = small(1), small(2)
    points_one, points_two = run_sweep(one), run_sweep(two)
    assert points_one == points_two
    assert report(one, points_one) == report(two, points_two)
    halcyon = points_one[0]
    assert halcyon.judge == "halcyon" and halcyon.aa_seeds == 3
    assert all(p.aa_seeds == 2 for p in points_one[1:])  # rivals: the bad cases' seeds
    assert set(halcyon.bad) == {c.name for c in one.sim.cases if c.bad}
    for p in points_one:
        for bad in p.bad.values():
            assert bad.seeds == 2 and bad.caught + bad.promoted == pytest.approx(1.0)


def test_sweep_settings_stay_within_a_dozen_per_rival() -> None:
    settings = sweep_settings()
    assert settings[0] == JudgeSetting("halcyon")
    judges = [s.judge for s in settings]
    assert judges.count("halcyon") == 8
    for rival in ("flagger", "argo", "original", "fixed-interval"):
        assert 1 <= judges.count(rival) <= 12
    with_p99 = sweep_settings(quick=True, rival_thresholds=(("max_p99_s", 1.0),))
    assert all(("max_p99_s", 1.0) in s.params for s in with_p99 if s.judge in ("flagger", "argo"))


def test_cli_quick_run_reports_curves_and_matched_rows(tmp_path: Path) -> None:
    argv = ["--scenario", "rollout", "--quick", "--evidence", "independent", "--jobs", "1"]
    out, err = io.StringIO(), io.StringIO()
    assert cli.run_rollout(parse(*argv, "--json"), out, err) == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    points = [r for r in rows if r["kind"] == "point"]
    assert {r["judge"] for r in points} == {
        "halcyon", "flagger", "argo", "original", "fixed-interval"
    }  # fmt: skip
    assert points[0]["judge"] == "halcyon" and points[0]["aa_seeds"] == 6
    lo, hi = points[0]["aa_false_rollback_ci95"]
    assert lo <= points[0]["aa_false_rollback"] <= hi
    assert {r["rival"] for r in rows if r["kind"] == "matched"} == {
        "flagger", "argo", "original", "fixed-interval"
    }  # fmt: skip
    assert "in " in err.getvalue() and "s\n" in err.getvalue()  # timing on stderr only
    text, plot = io.StringIO(), tmp_path / "curves.png"
    assert cli.run_rollout(parse(*argv, "--plot", str(plot)), text, io.StringIO()) == 0
    body = text.getvalue()
    assert body.startswith("Rollout simulation — 3 seeds from 0xc0ffee")
    assert "## Evidence model: independent" in body and "### Matched false-rollback" in body
    assert "| flagger " in body and plot.stat().st_size > 0


def test_cli_rejects_unknown_evidence_models_and_bad_rival_thresholds() -> None:
    err = io.StringIO()
    args = parse("--scenario", "rollout", "--evidence", "telepathic", "--quick")
    assert cli.run_rollout(args, io.StringIO(), err) == 2
    assert "unknown evidence model 'telepathic'" in err.getvalue()
    with pytest.raises(SystemExit):
        parse("--scenario", "rollout", "--rival-success-rate", "100")
    with pytest.raises(SystemExit):
        parse("--scenario", "rollout", "--aa-seeds", "0")
    args = parse("--scenario", "rollout", "--rival-p99-ms", "900", "--jobs", "3")
    assert (args.rival_p99_ms, args.jobs, args.aa_seeds, args.seeds) == (900.0, 3, 1000, 200)


def test_cli_sweeps_chosen_judges_and_reports_tolerated_canaries() -> None:
    argv = ["--scenario", "rollout", "--quick", "--evidence", "independent", "--jobs", "1"]
    out = io.StringIO()
    args = parse(*argv, "--judges", "original", "--tolerated-error-points", "0.4", "--json")
    assert cli.run_rollout(args, out, io.StringIO()) == 0
    points = [json.loads(line) for line in out.getvalue().splitlines()]
    points = [p for p in points if p["kind"] == "point"]
    assert {p["judge"] for p in points} == {"halcyon", "original"}
    # The tolerated canary is a good case: scored as rolled back or not, never as caught.
    assert all("tolerated+0.4" in p["good_rolled_back"] for p in points)
    assert all("tolerated+0.4" not in p["bad"] for p in points)
    err = io.StringIO()
    assert cli.run_rollout(parse(*argv, "--judges", "kayenta"), io.StringIO(), err) == 2
    assert "unknown judge 'kayenta'" in err.getvalue()
    with pytest.raises(SystemExit):
        parse("--scenario", "rollout", "--tolerated-error-points", "0.5")  # at the tolerance
