"""``halcyon loadtest``: drive real load at a running gateway and report what users would see.

Closed loop (``--clients N``): each client sends its next request as soon as the previous one
is answered, like a pool of interactive users. Open loop (``--rate R``): Poisson arrivals at R
req/s regardless of how fast answers come back, so a slow server cannot hide its tail latency
by slowing the load down (coordinated omission).

A request (one logical call, however many attempts) ends *successful* (OK), *rejected* (any
other Halcyon status: an ``ErrorInfo`` in the ``halcyon.dev`` domain) or *lost* (no Halcyon
answer); it is *on time* if it succeeded within its deadline from its first attempt. Answered,
successful and on-time rates are reported apart because a gateway that answers 3,500 req/s of
``QUOTA_EXCEEDED`` is not serving 3,500 req/s. ``--slo p99=200ms,success=99.9%`` prints PASS or
FAIL per objective and exits 1 if any failed, so the command can gate a pipeline.

This module is the command line (:func:`configure`, :func:`run`) and the place existing code
imports from; the parts live in sibling modules, one job each, and are re-exported here:

* :mod:`halcyon.tools.loadtest_mix` — the request mix and options: :class:`SloClass`,
  :func:`parse_mix`, :func:`parse_range`, the request pool, :class:`LoadOptions`.
* :mod:`halcyon.tools.loadtest_slo` — the ``--slo`` objectives: :func:`parse_slo`,
  :class:`Objective`, :class:`Verdict`, :func:`judge`, :func:`verdict_line`.
* :mod:`halcyon.tools.loadtest_tally` — what a run measured: :class:`Tally`, :class:`ClassTally`.
* :mod:`halcyon.tools.loadtest_report` — the report and result: :func:`summarize`, :func:`render`,
  the gateway's and workers' /metrics counters, :class:`LoadResult`, :class:`ClassResult`.
* :mod:`halcyon.tools.loadtest_driver` — the driver: :class:`LoadGenerator` (clients, open loop,
  retries, balancing) and :func:`run_loadtest`.

As a library: :func:`run_loadtest` takes :class:`LoadOptions` (the flags' fields, with the
flags' defaults) and returns a :class:`LoadResult` (every figure, per class too, and the
``--json`` report); it raises ``ConnectionError`` when no gateway answers and ``ValueError``
for options the command line would refuse.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from halcyon.tools.loadtest_driver import (
    ADMITTED_FAILURES,
    INFER_METHOD,
    LOAD_REJECTIONS,
    LoadGenerator,
    _Request,
    _RetryTimer,
    _warn,
    balancing_service_config,
    channel_options,
    is_halcyon_answer,
    run_loadtest,
)
from halcyon.tools.loadtest_mix import (
    _WORDS,
    DEFAULT_MAX_TOKENS,
    MAX_INPUT_BYTES,
    LoadOptions,
    SloClass,
    _prompt,
    _request_pool,
    parse_mix,
    parse_range,
)
from halcyon.tools.loadtest_report import (
    ClassResult,
    GatewayCounters,
    LoadResult,
    _class_report,
    _counts,
    _timeline,
    read_gateway_counters,
    read_process_cpu,
    read_workers_cpu,
    render,
    summarize,
)
from halcyon.tools.loadtest_slo import (
    _DURATION_UNITS_MS,
    SLO_QUANTILES,
    SLO_RATES,
    Objective,
    Verdict,
    _exact,
    judge,
    parse_slo,
    verdict_line,
)
from halcyon.tools.loadtest_tally import ClassTally, Tally, _quantile

__all__ = [
    "ADMITTED_FAILURES",
    "DEFAULT_MAX_TOKENS",
    "INFER_METHOD",
    "LOAD_REJECTIONS",
    "MAX_INPUT_BYTES",
    "SLO_QUANTILES",
    "SLO_RATES",
    "_DURATION_UNITS_MS",
    "_WORDS",
    "ClassResult",
    "ClassTally",
    "GatewayCounters",
    "LoadGenerator",
    "LoadOptions",
    "LoadResult",
    "Objective",
    "SloClass",
    "Tally",
    "Verdict",
    "_Request",
    "_RetryTimer",
    "_class_report",
    "_counts",
    "_exact",
    "_prompt",
    "_quantile",
    "_request_pool",
    "_timeline",
    "_warn",
    "balancing_service_config",
    "channel_options",
    "configure",
    "is_halcyon_answer",
    "judge",
    "parse_mix",
    "parse_range",
    "parse_slo",
    "read_gateway_counters",
    "read_process_cpu",
    "read_workers_cpu",
    "render",
    "run",
    "run_loadtest",
    "summarize",
    "verdict_line",
]


def _slo_arg(text: str) -> list[Objective]:
    try:
        return parse_slo(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _mix_arg(text: str) -> tuple[SloClass, ...]:
    try:
        return parse_mix(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _range_arg(text: str) -> tuple[int, int]:
    try:
        return parse_range(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _addresses_arg(text: str) -> tuple[str, ...]:
    addresses = tuple(a.strip() for a in text.split(",") if a.strip())
    if not addresses:
        raise argparse.ArgumentTypeError(f"not HOST:PORT[,HOST:PORT...]: {text!r}")
    return addresses


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Drive a running gateway with closed-loop clients (--clients) or open-loop Poisson "
        "arrivals (--rate) and report answered, successful and on-time rates, lost requests, "
        "latency quantiles, the latency added on top of device time, batch sizes, outcomes "
        "and rejections by reason, hedge rate and version split."
    )
    parser.add_argument(
        "--target",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="gateway address; A,B for several gateways, each on its own channel, clients "
        "spread over them round robin and the report counting requests per gateway; or a "
        "gRPC target naming several (ipv4:A,B or dns:///NAME:PORT) that gRPC balances itself "
        "(see --health-check) (default 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--api-key", default="demo-key-premium", help="tenant API key (default demo-key-premium)"
    )
    parser.add_argument("--model", default="llama-3-8b", help="model to call (default llama-3-8b)")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients (default 32)")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="open loop: Poisson arrivals per second; overrides --clients "
        "(default 0 = closed loop)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="run length (default 20)")
    parser.add_argument(
        "--deadline-ms",
        type=float,
        default=2000.0,
        help="per-attempt deadline, and the on-time bound from a request's first attempt "
        "(default 2000; ignored with --mix)",
    )
    parser.add_argument(
        "--mix",
        type=_mix_arg,
        metavar="NAME:SHARE:DEADLINE_MS[,...]",
        help="SLO classes, e.g. urgent:0.3:800,relaxed:0.7:6000: each request draws its class "
        "by share from the seeded RNG and carries the class's deadline (as --deadline-ms does); "
        "the report gives offered, succeeded and on-time requests per class (default: one "
        "class, 'default', with --deadline-ms)",
    )
    parser.add_argument(
        "--slo",
        type=_slo_arg,
        metavar="METRIC=TARGET[,...]",
        help="objectives the run must meet, e.g. p99=200ms,success=99.9%%: p50, p90, p95, "
        "p99, p999 at most a duration (us, ms, s; successful requests), success and goodput "
        "(answered OK, and OK within the deadline) at least a percentage of the requests; "
        "prints PASS or FAIL for each and exits 1 if any fails (default: none, exit 0)",
    )
    parser.add_argument(
        "--max-tokens",
        type=_range_arg,
        metavar="LO:HI",
        help="max output tokens of each request, uniform in [LO, HI] (default 64:255)",
    )
    parser.add_argument(
        "--input-bytes",
        type=_range_arg,
        metavar="LO:HI",
        help=f"prompt size in bytes, uniform in [LO, HI] (at most {MAX_INPUT_BYTES}; the "
        "gateway counts 4 bytes a token) (default: 4 to 16 words, about 15-110 bytes)",
    )
    parser.add_argument(
        "--max-inflight",
        type=int,
        default=4096,
        help="open loop: cap on outstanding requests; arrivals over it are dropped by the "
        "client (default 4096)",
    )
    parser.add_argument("--seed", type=int, default=1, help="seed for the request mix (default 1)")
    retry = parser.add_mutually_exclusive_group()
    retry.add_argument(
        "--honor-retry-info",
        action="store_true",
        help="after a rejection with retry advice (RetryInfo / grpc-retry-pushback-ms), wait "
        "that long and resend the same request (default: no retries)",
    )
    retry.add_argument(
        "--retry-immediately",
        action="store_true",
        help="resend at once after every load rejection (UNAVAILABLE, RESOURCE_EXHAUSTED, "
        "DEADLINE_EXCEEDED, ABORTED): a retry storm (default: no retries)",
    )
    parser.add_argument(
        "--health-check",
        metavar="SERVICE",
        help="balance over every address of --target (e.g. ipv4:A,B or a dns:/// name) with "
        "round_robin, sending only to servers whose grpc.health.v1 status for SERVICE is "
        "SERVING (client-side health checking): 'readiness' moves load off a Halcyon gateway "
        "as soon as it starts draining (default: off, gRPC's pick_first: one address at a "
        "time, no health checks)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up if the gateway does not accept a connection within this (default 10)",
    )
    parser.add_argument(
        "--gateway-metrics",
        metavar="HOST:PORT",
        help="gateway metrics address; reports the gateway's CPU time per request and the "
        "batches it dispatched (default: not read)",
    )
    parser.add_argument(
        "--worker-metrics",
        type=_addresses_arg,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="workers' metrics addresses; reports their process CPU time over the run, summed, "
        "per request (default: not read)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object, with a per-second timeline of outcomes",
    )
    parser.add_argument("--progress", action="store_true", help="live progress even off a TTY")


def run(args: argparse.Namespace) -> int:
    options = LoadOptions.from_args(args)
    problem = options.problem()
    if problem is not None:
        print(f"loadtest: {problem}", file=sys.stderr)
        return 2
    try:
        result = run_loadtest(options)
    except ConnectionError as err:
        print(f"loadtest: {err}", file=sys.stderr)
        return 1
    objectives = list(options.slo or ())
    verdicts = judge(objectives, result.latencies_ms, result.report)
    if options.json:
        extra = {"slo": [_verdict_json(v) for v in verdicts]} if objectives else {}
        print(json.dumps({"mode": result.mode, **result.report, **extra}))
    else:
        print(f"halcyon loadtest — {result.mode}, {options.seconds:g} s against {options.target}")
        print(render(result.report))
    if not objectives:
        return 0
    # With --json the verdicts are in the object; the lines go to stderr, stdout stays JSON.
    out = sys.stderr if options.json else sys.stdout
    for v in verdicts:
        print(verdict_line(v), file=out)
    failed = [v.objective.text for v in verdicts if not v.passed]
    if failed:
        print(f"loadtest: missed {len(failed)} of {len(verdicts)} objectives: "
              + ", ".join(failed), file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _verdict_json(v: Verdict) -> dict[str, Any]:
    o = v.objective
    return {
        "objective": o.text,
        "metric": o.metric,
        "target": float(o.target),
        "unit": "ms" if o.is_latency else "%",
        "measured": v.measured,
        "passed": v.passed,
    }
