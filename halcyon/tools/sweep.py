"""``halcyon sweep``: the seed's batching claims, run live — offered rates × batching strategies.

What it decides: how the live comparison of batching strategies is run so that it is fair and
reproducible on one machine.

* **Same fleet, fresh processes.** Every (strategy, rate) point gets its own stack — a
  controller, the same workers (``--runtime onnx``: the same generated decoder, same threads),
  a gateway started with ``--batching STRATEGY`` — so no point inherits a learned cost model,
  a limiter level or a warm queue from the one before.
* **Rates relative to the unbatched capacity.** The fleet's capacity *without batching* is
  measured live first: a closed loop of one client per worker slot against ``--batching
  none`` (requests with a generous deadline), successes per second. Rates given as ``1.5x``
  are multiples of it, so "below, at and past saturation" means the same on any machine.
* **SLO classes scaled to the model.** Unless ``--mix`` is given, the seed's mix — 30 %
  urgent, 70 % relaxed, deadlines 120 ms and 900 ms against an unbatched service time of
  ~21 ms — is scaled to the model: urgent = 6×, relaxed = 45× the unbatched p50 latency
  the probe measured.
* **Open loop.** Poisson arrivals at the offered rate, so a slow strategy cannot hide its tail
  by slowing the load down (``halcyon loadtest --rate``).

It reports, per strategy and rate, goodput (on-time successes per second of the arrival
window), p50/p95/p99 of successes, on-time share per class, CPU per request (gateway and
workers), mean batch size, and requests admitted then late; ``--out DIR`` writes the table
(``sweep.md``), the figures (``sweep.json``) and a plot (``sweep.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from halcyon.tools import stack as stack_cmd
from halcyon.tools.loadtest import LoadOptions, LoadResult, SloClass, parse_mix, run_loadtest

__all__ = ["configure", "run"]

STRATEGIES = ("halcyon", "fixed", "none")
DEFAULT_RATES = "0.5x,1x,2x,4x,6x,8x"
# The seed's SLO mix, as multiples of its unbatched service time (~21 ms for a 150-token
# request at 18 ms + 0.022 ms/token): urgent 120 ms (~6x), relaxed 900 ms (~45x).
URGENT_SHARE, URGENT_X = 0.3, 6.0
RELAXED_SHARE, RELAXED_X = 0.7, 45.0
PROBE_SECONDS = 8.0
PROBE_DEADLINE_MS = 60_000.0


@dataclass(frozen=True)
class Point:
    """One measured (strategy, offered rate)."""

    strategy: str
    offered_rps: float
    goodput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    on_time: dict[str, float]  # class -> on-time share of offered
    gateway_cpu_ms: float | None
    worker_cpu_ms: float | None
    mean_batch: float
    admitted_late_share: float
    succeeded: int
    offered: int


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stack_args(args: argparse.Namespace, strategy: str, state_dir: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    stack_cmd.configure(parser)
    argv = [
        "--runtime", args.runtime,
        "--batching", strategy,
        "--gateway-listen", "127.0.0.1:0",
        "--gateway-metrics-listen", "127.0.0.1:0",
        "--controller-listen", "127.0.0.1:0",
        "--state-dir", str(state_dir),
    ]  # fmt: skip
    return parser.parse_args(argv)


def _fleet(args: argparse.Namespace) -> list[stack_cmd.ReplicaSpec]:
    return [
        stack_cmd.ReplicaSpec(
            f"replica-{chr(ord('a') + i)}", "v1", f"cpu-{args.threads}t", 1.0, args.threads
        )
        for i in range(args.workers)
    ]


@contextmanager
def running_stack(args: argparse.Namespace, strategy: str) -> Iterator[stack_cmd.Stack]:
    """A stack with the sweep's fleet and ``--batching strategy``, stopped on exit."""
    state_dir = Path(tempfile.mkdtemp(prefix=stack_cmd.STATE_PREFIX))
    (state_dir / stack_cmd.PID_FILE).write_text("0\n")
    sargs = _stack_args(args, strategy, state_dir)
    env = stack_cmd._child_env(sargs)
    stack = stack_cmd.Stack(sargs, state_dir, env, fleet=_fleet(args))
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


def _addresses(stack: stack_cmd.Stack) -> tuple[str, str, list[str]]:
    assert stack.gateway is not None and stack.gateway.ready is not None
    gateway = str(stack.gateway.ready["grpc"])
    metrics = str(stack.gateway.ready["metrics"])
    workers = [str(w.ready["metrics"]) for w in stack.workers if w.ready and w.ready.get("metrics")]
    return gateway, metrics, workers


def _load(
    args: argparse.Namespace,
    stack: stack_cmd.Stack,
    *,
    rate: float,
    clients: int,
    seconds: float,
    mix: Sequence[SloClass] | None,
    deadline_ms: float,
) -> LoadResult:
    gateway, metrics, workers = _addresses(stack)
    options = LoadOptions(
        target=gateway,
        clients=clients,
        rate=rate,
        seconds=seconds,
        deadline_ms=deadline_ms,
        seed=args.seed,
        gateway_metrics=metrics,
        worker_metrics=workers,
        mix=mix,
        max_tokens=args.max_tokens,
    )
    return run_loadtest(options, warn=_say)


def probe_capacity(args: argparse.Namespace) -> tuple[float, float]:
    """The fleet's unbatched capacity (successes/s) and unbatched p50 latency (ms)."""
    _say("probing the unbatched capacity (--batching none, one client per worker) …")
    with running_stack(args, "none") as stack:
        result = _load(
            args,
            stack,
            rate=0.0,
            clients=args.workers,
            seconds=PROBE_SECONDS,
            mix=None,
            deadline_ms=PROBE_DEADLINE_MS,
        )
    capacity = result.succeeded / result.window_s if result.window_s > 0 else 0.0
    if capacity <= 0:
        raise RuntimeError("the capacity probe served nothing; see the stack's logs")
    _say(f"  unbatched capacity {capacity:.1f} req/s, p50 {result.p50_ms:.1f} ms")
    return capacity, result.p50_ms


def parse_rates(text: str, capacity: float | None) -> list[float]:
    """``40,80`` (req/s) or ``0.5x,1x`` (multiples of ``capacity``); raises ValueError."""
    rates: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        relative = part.endswith("x")
        value = float(part[:-1] if relative else part)
        if value <= 0:
            raise ValueError(f"--rates: {part!r} is not a positive rate")
        if relative:
            if capacity is None:
                raise ValueError("--rates given as multiples need the capacity probe")
            value *= capacity
        rates.append(value)
    if not rates:
        raise ValueError("--rates names no rate")
    return rates


def scaled_mix(unbatched_p50_ms: float) -> tuple[SloClass, ...]:
    """The seed's urgent/relaxed mix with deadlines scaled to the model's service time."""
    return (
        SloClass("urgent", URGENT_SHARE, round(URGENT_X * unbatched_p50_ms)),
        SloClass("relaxed", RELAXED_SHARE, round(RELAXED_X * unbatched_p50_ms)),
    )


def _point(strategy: str, rate: float, r: LoadResult) -> Point:
    return Point(
        strategy=strategy,
        offered_rps=rate,
        goodput_rps=r.goodput_rps,
        p50_ms=r.p50_ms,
        p95_ms=r.p95_ms,
        p99_ms=r.p99_ms,
        on_time={c.name: c.on_time_share for c in r.classes},
        gateway_cpu_ms=r.gateway_cpu_ms_per_request,
        worker_cpu_ms=r.worker_cpu_ms_per_request,
        mean_batch=r.mean_batch_size,
        admitted_late_share=r.admitted_late_share,
        succeeded=r.succeeded,
        offered=r.offered,
    )


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:.0f}"  # NaN: nothing succeeded


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(points: Sequence[Point], capacity: float, mix: Sequence[SloClass]) -> str:
    """The markdown table of a sweep."""
    names = [c.name for c in mix]
    head = (
        "| offered (req/s) | × unbatched | strategy | goodput/s | p50 ms | p95 ms | p99 ms | "
        + " | ".join(f"{n} on time" for n in names)
        + " | admitted then late | CPU ms/req (gateway + workers) | mean batch |"
    )
    rule = "|" + "---|" * (10 + len(names))
    rows = [head, rule]
    for p in points:
        shares = " | ".join(f"{100 * p.on_time.get(n, 0.0):.1f} %" for n in names)
        cpu = "-"
        if p.gateway_cpu_ms is not None or p.worker_cpu_ms is not None:
            cpu = f"{_cpu(p.gateway_cpu_ms)} + {_cpu(p.worker_cpu_ms)}"
        times = f"{p.offered_rps / capacity:.2f}" if capacity == capacity else "-"
        rows.append(
            f"| {p.offered_rps:.1f} | {times} | {p.strategy} | "
            f"{p.goodput_rps:.1f} | {_ms(p.p50_ms)} | {_ms(p.p95_ms)} | {_ms(p.p99_ms)} | "
            f"{shares} | {100 * p.admitted_late_share:.1f} % | {cpu} | {p.mean_batch:.1f} |"
        )
    return "\n".join(rows)


def plot(points: Sequence[Point], capacity: float, path: Path) -> None:
    """Goodput against offered load, one line per strategy (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=120)
    markers = {"halcyon": "o", "fixed": "s", "none": "^"}
    for strategy in dict.fromkeys(p.strategy for p in points):
        mine = sorted((p for p in points if p.strategy == strategy), key=lambda p: p.offered_rps)
        ax.plot(
            [p.offered_rps for p in mine],
            [p.goodput_rps for p in mine],
            marker=markers.get(strategy, "o"),
            label=strategy,
        )
    top = max(p.offered_rps for p in points)
    ax.plot([0, top], [0, top], color="0.7", linestyle=":", label="offered")
    ax.axvline(capacity, color="0.5", linestyle="--", linewidth=1)
    ax.annotate("unbatched capacity", (capacity, 0), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("offered load (req/s, Poisson)")
    ax.set_ylabel("goodput (on-time answers/s)")
    ax.set_title("Batching strategies on the real ONNX decoder")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The loadtest sweep: for each batching strategy (halcyon, fixed 32 / 25 ms, none) and "
        "each offered rate, start a fresh stack on loopback and drive it open loop; report "
        "goodput, latency quantiles, on-time share per SLO class, CPU per request, mean batch "
        "and requests admitted then late. Rates like 1.5x are multiples of the fleet's "
        "unbatched capacity, measured live first."
    )
    parser.add_argument(
        "--runtime",
        choices=("onnx", "simulated"),
        default="onnx",
        help="what the workers run (default %(default)s: the generated ONNX decoder)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="worker processes (default %(default)s)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="ONNX Runtime threads per worker (default %(default)s)",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="batching strategies to compare (default %(default)s)",
    )
    parser.add_argument(
        "--rates",
        default=DEFAULT_RATES,
        help="offered rates, req/s or multiples of the unbatched capacity (default %(default)s)",
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="arrival window per point (default 20)"
    )
    parser.add_argument(
        "--mix",
        type=parse_mix,
        help="SLO classes NAME:SHARE:DEADLINE_MS,... (default: the seed's 30 %% urgent / 70 %% "
        "relaxed, deadlines 6x and 45x the unbatched p50 the probe measures)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_token_range,
        default="64:255",
        metavar="LO:HI",
        help="max output tokens per request, uniform (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=1, help="request mix seed (default 1)")
    parser.add_argument(
        "--out",
        type=Path,
        help="write sweep.md, sweep.json and sweep.png here (default: print the table only)",
    )


def _token_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("expected LO:HI")
    low, high = int(lo), int(hi)
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError("expected 1 <= LO <= HI")
    return low, high


def run(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        print(f"sweep: unknown strategies {unknown}; choose from {STRATEGIES}", file=sys.stderr)
        return 2
    if args.workers < 1 or args.threads < 1:
        print("sweep: --workers and --threads must be at least 1", file=sys.stderr)
        return 2
    started = time.monotonic()
    needs_probe = args.mix is None or any(r.strip().endswith("x") for r in args.rates.split(","))
    capacity, p50 = probe_capacity(args) if needs_probe else (math.nan, math.nan)
    try:
        rates = parse_rates(args.rates, None if math.isnan(capacity) else capacity)
    except ValueError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    mix = tuple(args.mix) if args.mix else scaled_mix(p50)
    _say("mix: " + ", ".join(f"{c.name} {c.share:.0%} by {c.deadline_ms:.0f} ms" for c in mix))
    points: list[Point] = []
    total = len(rates) * len(strategies)
    for rate in rates:
        for strategy in strategies:
            _say(f"[{len(points) + 1}/{total}] {strategy} at {rate:.1f} req/s …")
            with running_stack(args, strategy) as stack:
                result = _load(
                    args,
                    stack,
                    rate=rate,
                    clients=1,
                    seconds=args.seconds,
                    mix=mix,
                    deadline_ms=max(c.deadline_ms for c in mix),
                )
            point = _point(strategy, rate, result)
            points.append(point)
            _say(
                f"  goodput {point.goodput_rps:.1f}/s, p99 {_ms(point.p99_ms)} ms, "
                f"mean batch {point.mean_batch:.1f}, "
                f"admitted then late {100 * point.admitted_late_share:.1f} %"
            )
    text = table(points, capacity, mix)
    header = (
        f"Unbatched capacity {capacity:.1f} req/s (p50 {p50:.0f} ms); "
        f"{args.workers} worker(s) x {args.threads} thread(s), runtime {args.runtime}; "
        f"{args.seconds:g} s per point; {time.monotonic() - started:.0f} s in all."
    )
    print(header)
    print()
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sweep.md").write_text(header + "\n\n" + text + "\n")
        doc: dict[str, Any] = {
            "capacity_rps": capacity,
            "unbatched_p50_ms": p50,
            "mix": [asdict(c) for c in mix],
            "workers": args.workers,
            "threads": args.threads,
            "runtime": args.runtime,
            "seconds": args.seconds,
            "points": [asdict(p) for p in points],
        }
        (args.out / "sweep.json").write_text(json.dumps(doc, indent=2) + "\n")
        plot(points, capacity, args.out / "sweep.png")
        _say(f"wrote {args.out}/sweep.md, sweep.json, sweep.png")
    return 0
