"""``halcyon bench``: the seeded, reproducible benchmarks, as a command.

What it decides: which scenario runs and how its results are shown. ``--scenario batching``
(the default) runs every batching strategy on the same traces and prints one table (or JSON
lines, or a plot); ``fleet`` and ``herd`` hand over to the routing benchmarks in
``bench.fleet``; ``rollout`` replays seeded canary rollouts through the real judge and its
rivals, each swept over its knobs, and reports blast radius against A/A false-rollback rate
(``bench.rollout_curves``, ``bench.rollout_report``); ``quotas`` enforces tenants' fleet-wide
quotas on a churning fleet of gateways, per gateway in full, split statically, and by the
controller's leases (``bench.quota_report``). Every workload parameter of the batching
benchmark is a flag, so the claim "Halcyon beats the alternatives" can be tested on anyone's
own traffic shape, or on a recorded trace (``--trace``).

Output on stdout is deterministic (same flags, same bytes); timing and progress go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from bench.command_frame import run_subcommand
from bench.markdown import markdown_table
from bench.runner import Cell, Workload, run_cells
from bench.sim import DeviceModel, SimResult
from bench.strategies import HALCYON_TOKENS, STRATEGIES, Strategy
from bench.workload import WorkloadSpec
from common.argtypes import non_negative, positive, probability
from gateway.batching import Objective

# The one-line help of `halcyon bench` (halcyon.tools.cli.SUBCOMMANDS names it too, so that
# `halcyon --help` need not import this module; tests/tools/test_halcyon_cli.py keeps them equal).
SUMMARY = "seeded discrete-event benchmarks (batching, fleet, herd, rollout, quotas)"
DEFAULT_RATES = (40.0, 90.0, 200.0, 260.0)
DEFAULT_SEED = 0xC0FFEE


def _int_auto(text: str) -> int:
    try:
        return int(text, 0)  # accepts 0xC0FFEE as well as 12648430
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an integer (e.g. 7 or 0xC0FFEE)"
        ) from None


def _objective_flag(text: str) -> str:
    """``requests`` / ``tokens`` / ``both``; the gateway's older spellings are accepted too."""
    try:
        return Objective.parse(text).flag
    except ValueError:
        return text  # "both", or an unknown value that argparse's choices check names


def _positive_int(text: str) -> int:
    value = _int_auto(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of rates: {text!r}") from exc
    if not rates or any(rate <= 0 for rate in rates):
        raise argparse.ArgumentTypeError("rates must be positive numbers, e.g. 40,90,200,260")
    return rates


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _point_list(text: str, high: float, wanted: str) -> tuple[float, ...]:
    try:
        points = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        points = ()
    if not points or any(not 0.0 < p < high for p in points):
        raise argparse.ArgumentTypeError(f"must be {wanted}; got {text!r}")
    return points


def _error_points(text: str) -> tuple[float, ...]:
    return _point_list(text, 99.0, "error-point increases between 0 and 99, e.g. 2,10")


def _tolerated_points(text: str) -> tuple[float, ...]:
    return _point_list(
        text, 0.5, "error-point increases inside the default +0.5-point tolerance (0 < P < 0.5)"
    )


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of names, got {text!r}")
    return names


def _success_rate(text: str) -> float:
    value = _positive_float(text)
    if not value < 100.0:
        raise argparse.ArgumentTypeError(f"must be a percentage below 100, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's flags to ``parser`` (``halcyon bench`` and ``python -m bench``)."""
    parser.add_argument(
        "--scenario",
        choices=("batching", "fleet", "herd", "rollout", "quotas"),
        default="batching",
        help="batching strategies on one device, routing across a fleet, a herd of gateways, "
        "canary rollouts judged by Halcyon and its rivals, or fleet-wide tenant quotas "
        "(default %(default)s)",
    )
    wl = parser.add_argument_group("workload (batching)")
    wl.add_argument(
        "--rates",
        type=_rates,
        default=list(DEFAULT_RATES),
        help="offered loads in requests/s, comma-separated (default 40,90,200,260)",
    )
    wl.add_argument(
        "--duration",
        type=positive,
        default=None,
        metavar="SECONDS",
        help="seconds of arrivals (default 120; with --trace, the trace's span; "
        "herd always runs 5 s)",
    )
    wl.add_argument(
        "--seed",
        type=_int_auto,
        default=DEFAULT_SEED,
        help="trace seed, mulberry32 (default 0xC0FFEE, the published trace)",
    )
    wl.add_argument(
        "--urgent-share",
        type=probability,
        default=0.3,
        metavar="FRACTION",
        help="share of urgent requests (default %(default)s)",
    )
    wl.add_argument(
        "--urgent-slo-ms",
        type=positive,
        default=120.0,
        metavar="MS",
        help="urgent deadline after arrival (default %(default)s)",
    )
    wl.add_argument(
        "--relaxed-slo-ms",
        type=positive,
        default=900.0,
        metavar="MS",
        help="relaxed deadline after arrival (default %(default)s)",
    )
    wl.add_argument(
        "--size-mu",
        type=float,
        default=4.8,
        help="log-normal mu of request tokens (default %(default)s)",
    )
    wl.add_argument(
        "--size-sigma",
        type=non_negative,
        default=0.9,
        help="log-normal sigma of request tokens (default %(default)s)",
    )
    wl.add_argument(
        "--arrivals",
        choices=("poisson", "bursty"),
        default="poisson",
        help="Poisson, or on/off bursts (2 s at twice the rate, 2 s at none; same mean) "
        "(default %(default)s)",
    )
    wl.add_argument(
        "--trace",
        metavar="FILE",
        default=None,
        help='replay JSON lines {"arrival_ms", "tokens", "deadline_ms", "cohort"} '
        "instead of a synthetic trace (--rates and the shape flags are then ignored; "
        "default: synthetic)",
    )
    ro = parser.add_argument_group("rollout")
    ro.add_argument(
        "--seeds",
        type=_positive_int,
        default=200,
        help="rollouts per (evidence model, judge setting, bad case), seeds --seed, "
        "--seed+1, ... (default 200)",
    )
    ro.add_argument(
        "--aa-seeds",
        type=_positive_int,
        default=1000,
        help="A/A rollouts per evidence model for Halcyon's default policy (default 1000)",
    )
    ro.add_argument(
        "--rival-aa-seeds",
        type=_positive_int,
        default=None,
        metavar="N",
        help="A/A rollouts per (evidence model, setting) for every other setting "
        "(default: --seeds)",
    )
    ro.add_argument(
        "--evidence",
        type=_names,
        default=None,
        metavar="MODELS",
        help="evidence models to run, comma-separated (default: all of them)",
    )
    ro.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        help="processes to run seeds in (default: the CPU count); output does not depend on it",
    )
    ro.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 3 seeds, 6 A/A seeds, two settings per rival, Halcyon at its "
        "default only (explicit --seeds / --aa-seeds still win); with --scenario quotas, "
        "the same story in 120 s instead of 600 s",
    )
    ro.add_argument(
        "--rollout-rate",
        type=_positive_float,
        default=200.0,
        metavar="REQ_PER_S",
        help="requests per second across both arms (default 200)",
    )
    ro.add_argument(
        "--rival-p99-ms",
        type=_positive_float,
        default=500.0,
        metavar="MS",
        help="Flagger's and Argo's absolute p99 threshold (default 500, their docs' example)",
    )
    ro.add_argument(
        "--rival-success-rate",
        type=_success_rate,
        default=99.0,
        metavar="PERCENT",
        help="Flagger's and Argo's minimum success rate (default 99)",
    )
    ro.add_argument(
        "--extra-error-points",
        type=_error_points,
        default=(),
        metavar="POINTS",
        help="add a bad canary case 'errors+P' per listed error-point increase, e.g. 2,10 "
        "(default: none; the 'errors' case is +5)",
    )
    ro.add_argument(
        "--tolerated-error-points",
        type=_tolerated_points,
        default=(),
        metavar="POINTS",
        help="add a good canary case 'tolerated+P' per listed error-point increase inside the "
        "tolerance, e.g. 0.4, and report how often every setting rolls back a good canary "
        "(where a judge's false-alarm budget is spent; default: A/A only)",
    )
    ro.add_argument(
        "--judges",
        type=_names,
        default=None,
        metavar="NAMES",
        help="judges to sweep, comma-separated: halcyon (always included), flagger, argo, "
        "original, fixed-interval (default: all of them)",
    )
    dev = parser.add_argument_group("device")
    dev.add_argument(
        "--intercept-ms",
        type=float,
        default=18.0,
        metavar="MS",
        help="fixed cost per batch (default %(default)s)",
    )
    dev.add_argument(
        "--ms-per-token",
        type=float,
        default=0.022,
        metavar="MS",
        help="marginal cost per batch token (default %(default)s)",
    )
    dev.add_argument(
        "--jitter",
        type=float,
        default=0.08,
        metavar="FRACTION",
        help="uniform ± share of each batch's duration, in [0, 1) (default %(default)s)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--objective",
        type=_objective_flag,
        choices=(*(o.flag for o in Objective), "both"),
        default=Objective.ON_TIME_REQUESTS.flag,
        help="what Halcyon maximises under overload: on-time requests, on-time tokens (as "
        "'halcyon gateway --objective'), or both as separate rows (default %(default)s)",
    )
    out.add_argument("--json", action="store_true", help="one JSON object per (strategy, rate)")
    out.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="also draw a picture into this file: goodput and p99 against load (batching), or "
        "blast radius against A/A false-rollback rate per judge (rollout) (default: no plot)",
    )
    out.add_argument(
        "--progress", action="store_true", help="progress on stderr even when not a terminal"
    )
    out.add_argument(
        "--workers",
        type=_positive_int,
        default=2,
        help="processes to run cells in (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the chosen scenario; returns the process exit code."""
    if args.scenario == "fleet":
        from bench.fleet import fleet_main

        return fleet_main(args.seed, args.duration, args.json, sys.stdout)
    if args.scenario == "herd":
        from bench.fleet import herd_main

        return herd_main(args.seed, args.json, sys.stdout)
    if args.scenario == "rollout":
        return run_rollout(args, sys.stdout, sys.stderr)
    if args.scenario == "quotas":
        from bench.quota_report import quotas_main

        return quotas_main(args.seed, args.quick, sys.stdout)
    try:
        return run_batching(args, sys.stdout, sys.stderr)
    except ValueError as exc:
        print(f"halcyon bench: {exc}", file=sys.stderr)
        return 2


def run_rollout(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The rollout sweep with this command's seeds, traffic, rivals and output flags."""
    import os
    from dataclasses import replace

    from bench.rollout_curves import RIVALS, SweepConfig, sweep_settings
    from bench.rollout_report import curves_main
    from bench.rollout_sim import SimConfig, evidence_models
    from bench.rollout_traffic import CASES, error_case, tolerated_case

    known = evidence_models()
    evidence = args.evidence if args.evidence is not None else known
    unknown = [name for name in evidence if name not in known]
    if unknown:
        err.write(
            f"halcyon bench: unknown evidence model {unknown[0]!r}: choose from "
            f"{', '.join(known)}\n"
        )
        return 2
    seeds = args.seeds if args.seeds != 200 or not args.quick else 3
    aa_seeds = args.aa_seeds if args.aa_seeds != 1000 or not args.quick else 6
    sim = SimConfig(seeds=seeds, first_seed=args.seed, evidence=tuple(evidence))
    sim = replace(
        sim,
        traffic=replace(sim.traffic, rate=args.rollout_rate),
        cases=CASES
        + tuple(error_case(points) for points in args.extra_error_points)
        + tuple(tolerated_case(points) for points in args.tolerated_error_points),
    )
    judges = ("halcyon", *(args.judges or RIVALS))
    strangers = [name for name in judges if name not in ("halcyon", *RIVALS)]
    if strangers:
        err.write(
            f"halcyon bench: unknown judge {strangers[0]!r}: choose from "
            f"{', '.join(RIVALS)} (halcyon is always swept)\n"
        )
        return 2
    thresholds: list[tuple[str, float]] = []
    if args.rival_p99_ms != 500.0:
        thresholds.append(("max_p99_s", args.rival_p99_ms / 1000.0))
    if args.rival_success_rate != 99.0:
        thresholds.append(("min_success_rate", args.rival_success_rate / 100.0))
    config = SweepConfig(
        sim=sim,
        settings=tuple(
            setting
            for setting in sweep_settings(quick=args.quick, rival_thresholds=tuple(thresholds))
            if setting.judge in judges
        ),
        other_good=bool(args.tolerated_error_points),
        aa_seeds=aa_seeds,
        rival_aa_seeds=args.rival_aa_seeds or 0,
        jobs=args.jobs or os.cpu_count() or 1,
    )
    return curves_main(
        config,
        args.json,
        out,
        err,
        progress=args.progress or err.isatty(),
        plot=args.plot,
    )


def _strategies(objective: str) -> list[Strategy]:
    rows = list(STRATEGIES)
    if objective == "tokens":
        rows[-1] = HALCYON_TOKENS
    elif objective == "both":
        rows.append(HALCYON_TOKENS)
    return rows


def _workloads(args: argparse.Namespace) -> list[Workload]:
    if args.trace is not None:
        return [Workload(trace_file=args.trace, duration_s=args.duration)]
    return [
        Workload(
            spec=WorkloadSpec(
                rate=rate,
                duration_s=args.duration if args.duration is not None else 120.0,
                seed=args.seed,
                urgent_share=args.urgent_share,
                urgent_slo_ms=args.urgent_slo_ms,
                relaxed_slo_ms=args.relaxed_slo_ms,
                size_mu=args.size_mu,
                size_sigma=args.size_sigma,
                arrivals=args.arrivals,
            )
        )
        for rate in args.rates
    ]


def run_batching(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    device = DeviceModel(args.intercept_ms, args.ms_per_token, args.jitter)
    if device.intercept_ms < 0 or device.ms_per_token < 0 or not 0 <= device.jitter < 1:
        raise ValueError("device constants must be non-negative and jitter in [0, 1)")
    workloads = _workloads(args)
    strategies = _strategies(args.objective)
    cells = [Cell(w, s, device) for w in workloads for s in strategies]
    show_progress = args.progress or err.isatty()
    started = time.perf_counter()

    def progress(done: int, total: int, result: SimResult) -> None:
        if show_progress:
            err.write(
                f"\r  [{done}/{total}] {result.rate:g} req/s · {result.strategy}"
                f" ({result.wall_s:.2f} s)\x1b[K"
            )
            err.flush()

    results = run_cells(cells, workers=args.workers, on_result=progress)
    wall = time.perf_counter() - started
    if show_progress:
        err.write("\r\x1b[K")
    if args.json:
        for result in results:
            out.write(json.dumps(result.as_json()) + "\n")
    else:
        out.write(describe(args, device) + "\n\n")
        out.write(format_table(results) + "\n")
    err.write(f"{len(cells)} cells in {wall:.2f} s wall ({args.workers} workers)\n")
    if args.plot:
        from bench.plot import plot_results

        plot_results(results, args.plot, title=describe(args, device, short=True))
        err.write(f"plot written to {args.plot}\n")
    return 0


def describe(args: argparse.Namespace, device: DeviceModel, *, short: bool = False) -> str:
    """One line naming the workload and device, so a table never floats free of its inputs."""
    if args.trace is not None:
        work = f"trace {args.trace}"
    else:
        duration = args.duration if args.duration is not None else 120.0
        work = (
            f"{args.arrivals} arrivals, {duration:g} s, seed {args.seed:#x}; "
            f"{args.urgent_share:.0%} urgent @ {args.urgent_slo_ms:g} ms, "
            f"rest @ {args.relaxed_slo_ms:g} ms; tokens lognormal({args.size_mu:g}, "
            f"{args.size_sigma:g}) in [16, 4096]"
        )
    dev = (
        f"device {device.intercept_ms:g} ms + {device.ms_per_token:g} ms/token "
        f"± {device.jitter:.0%}"
    )
    if short:
        return f"{work}\n{dev}"
    return (
        f"Batching benchmark — {work}; {dev}. Goodput = requests finished by their "
        "deadline per second; shed and late requests count against attainment."
    )


_COLUMNS = (
    ("rate", "{:g}"),
    ("strategy", "{}"),
    ("goodput/s", "{:.1f}"),
    ("p50 ms", "{:.0f}"),
    ("p95 ms", "{:.0f}"),
    ("p99 ms", "{:.0f}"),
    ("urgent", "{:.1%}"),
    ("relaxed", "{:.1%}"),
    ("util", "{:.1%}"),
    ("batch", "{:.1f}"),
    ("shed", "{:d}"),
    ("late", "{:d}"),
)


def format_table(results: Sequence[SimResult]) -> str:
    """A Markdown table: one row per (rate, strategy)."""
    rows = [
        (
            r.rate,
            r.strategy,
            r.goodput_per_s,
            r.p50_ms,
            r.p95_ms,
            r.p99_ms,
            r.urgent_slo,
            r.relaxed_slo,
            r.utilisation,
            r.mean_batch,
            r.shed,
            r.late,
        )
        for r in results
    ]
    return markdown_table(_COLUMNS, rows, left={1})


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench``: exactly ``halcyon bench`` (same help, errors and exit codes)."""
    args = sys.argv[1:] if argv is None else argv
    return run_subcommand("bench", sys.modules[__name__], SUMMARY, args)
