"""``halcyon loadtest``: drive real load at a running gateway and report what users would see.

Closed loop (``--clients N``): each client sends its next request as soon as the previous one
is answered, like a pool of interactive users. Open loop (``--rate R``): Poisson arrivals at R
req/s regardless of how fast answers come back, so a slow server cannot hide its tail latency
by slowing the load down (coordinated omission).

The request mix follows the original system's load test: max output tokens uniform in
[64, 255] (``--max-tokens LO:HI``), prompts of 4 to 16 words (``--input-bytes LO:HI``: a
uniform size in bytes instead), one session key per client, a 2 s deadline carried as the gRPC
deadline. Requests are serialized once up front so the load generator spends its CPU on calls,
not on protobuf.

SLO classes (``--mix urgent:0.3:800,relaxed:0.7:6000``): each request draws its class from the
seeded RNG by share, and carries its class's deadline as its gRPC deadline; the report then
gives, per class, the requests offered, succeeded and on time (succeeded within the class's
deadline). Without ``--mix`` there is one class, ``default``, with ``--deadline-ms``. Overall it
adds goodput over the arrival window (on-time successes ÷ ``--seconds``, the benchmark's
definition) and *admitted then late*: of the requests the gateway did not refuse (refused =
ended with a Halcyon rejection other than ``DEADLINE_MISSED``, ``UPSTREAM_FAILURE`` or
``INTERNAL``), the share answered after their deadline, or with ``DEADLINE_EXCEEDED`` (the
gateway's ``DEADLINE_MISSED``, or the client's own deadline firing first).

As a library: :func:`run_loadtest` takes :class:`LoadOptions` (the flags' fields, with the
flags' defaults) and returns a :class:`LoadResult` (every figure, per class too, and the
``--json`` report); it raises ``ConnectionError`` when no gateway answers and ``ValueError``
for options the command line would refuse.

What it counts, and why separately: a request (one logical call, however many attempts) ends
*successful* (OK), *rejected* (any other Halcyon status: an ``ErrorInfo`` in the
``halcyon.dev`` domain) or *lost* (no Halcyon answer: a client-side deadline the server never
answered, a broken connection, a status without Halcyon's ``ErrorInfo``). It is *on time* if it
succeeded within ``--deadline-ms`` of its first attempt. Answered, successful and on-time rates
are reported apart because a gateway that answers 3,500 req/s of ``QUOTA_EXCEEDED`` is not
serving 3,500 req/s.

Retries: by default none. ``--honor-retry-info`` makes a client wait what the server's
``RetryInfo`` (or ``grpc-retry-pushback-ms``) says and send the same request again, so a quota
test measures the quota rather than a retry storm; ``--retry-immediately`` resends at once on
every load rejection (``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, ``DEADLINE_EXCEEDED``,
``ABORTED``), which *is* a retry storm. Every attempt gets a fresh ``--deadline-ms``; no retry
is sent after the run's end. ``--json`` adds a per-second timeline of attempt outcomes.

Balancing: one channel for all clients, with gRPC's default ``pick_first`` (the first address
of ``--target`` that connects, until it goes away) unless ``--health-check SERVICE`` asks for
what the README tells clients to do: ``round_robin`` over every address with client-side health
checking on that ``grpc.health.v1`` service name, so a gateway whose ``readiness`` turns
NOT_SERVING (draining) gets no new calls.

Objectives (``--slo p99=200ms,success=99.9%``): after the run, one line per objective — its
target, what the run measured, PASS or FAIL — and exit 1 if any failed, so the command can gate
a pipeline, as k6 fails a run whose thresholds are crossed with a non-zero exit
(https://grafana.com/docs/k6/latest/using-k6/thresholds/). Latency quantiles (``p50``, ``p90``,
``p95``, ``p99``, ``p999`` at most a duration in ``us``, ``ms`` or ``s``) are over successful
requests from their first attempt, the report's own p50/p95/p99, nearest rank; ``success`` and
``goodput`` (at least a percentage) are the report's success rate and on-time rate (answered OK,
and answered OK within the deadline, of the requests that ended). A run without a successful
request fails every latency objective. :func:`parse_slo` reads the list, :func:`judge` decides;
without ``--slo`` nothing of the output changes.

With ``--gateway-metrics HOST:PORT`` it reads the gateway's ``process_cpu_seconds_total`` and
batch-size histogram before and after the run and reports the gateway's CPU time per request
and how many batches it dispatched for them; ``--worker-metrics HOST:PORT[,...]`` adds the
workers' ``process_cpu_seconds_total`` over the run, summed.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

import grpc

from common import keepalive
from common.errors import DOMAIN, RichError, parse_rpc_error
from halcyon.v1 import infer_pb2

INFER_METHOD = "/halcyon.v1.InferService/Infer"
# Rejections a retry-storm client (--retry-immediately) resends: the load-related ones. An
# invalid request or a bad key fails the same way every time, so not even a storm retries it.
LOAD_REJECTIONS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
    }
)


# Halcyon rejections a request can end with after the gateway admitted it (evicted from the
# queue, or failed on the fleet); every other Halcyon rejection is a refusal at admission.
ADMITTED_FAILURES = frozenset({"DEADLINE_MISSED", "UPSTREAM_FAILURE", "INTERNAL"})
DEFAULT_MAX_TOKENS = (64, 255)
MAX_INPUT_BYTES = 64 * 1024  # the gateway's limit on InferRequest.input


@dataclass(frozen=True)
class SloClass:
    """One class of the ``--mix``: its name, its share of requests, its deadline."""

    name: str
    share: float
    deadline_ms: float


def parse_mix(text: str) -> tuple[SloClass, ...]:
    """``NAME:SHARE:DEADLINE_MS[,...]`` (e.g. ``urgent:0.3:800,relaxed:0.7:6000``); shares are
    positive and normalised to sum to 1 (raises ValueError)."""
    classes: list[SloClass] = []
    for part in text.split(","):
        bits = part.strip().split(":")
        if len(bits) != 3 or not bits[0]:
            raise ValueError(f"not NAME:SHARE:DEADLINE_MS: {part.strip()!r}")
        name = bits[0]
        try:
            share, deadline_ms = float(bits[1]), float(bits[2])
        except ValueError:
            raise ValueError(f"not NAME:SHARE:DEADLINE_MS: {part.strip()!r}") from None
        if not (share > 0 and math.isfinite(share)):
            raise ValueError(f"class {name!r}: the share must be positive, got {bits[1]}")
        if not (deadline_ms > 0 and math.isfinite(deadline_ms)):
            raise ValueError(f"class {name!r}: the deadline must be positive, got {bits[2]}")
        if any(c.name == name for c in classes):
            raise ValueError(f"class {name!r} given twice")
        classes.append(SloClass(name, share, deadline_ms))
    total = sum(c.share for c in classes)
    return tuple(SloClass(c.name, c.share / total, c.deadline_ms) for c in classes)


def parse_range(text: str) -> tuple[int, int]:
    """``LO:HI`` as two integers with 1 <= LO <= HI (raises ValueError)."""
    lo_text, sep, hi_text = text.partition(":")
    try:
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        raise ValueError(f"not LO:HI: {text!r}") from None
    if not sep or lo < 1 or hi < lo:
        raise ValueError(f"not LO:HI with 1 <= LO <= HI: {text!r}")
    return lo, hi


# --slo: latency quantiles (at most a duration) and rates (at least a percentage).
SLO_QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SLO_RATES = {
    "success": "answered OK, of the requests that ended",
    "goodput": "answered OK within their deadline, of the requests that ended",
}
_DURATION_UNITS_MS = {
    "us": Fraction(1, 1000),
    "µs": Fraction(1, 1000),
    "ms": Fraction(1),
    "s": Fraction(1000),
}


@dataclass(frozen=True)
class Objective:
    """One term of ``--slo``: a latency quantile at most ``target`` ms, or a rate (``success``,
    ``goodput``) at least ``target`` percent. ``text`` is the term as given."""

    metric: str
    target: Fraction  # milliseconds for a quantile, percent for a rate
    text: str

    @property
    def is_latency(self) -> bool:
        return self.metric in SLO_QUANTILES


def _exact(number: str) -> Fraction | None:
    """A plain decimal number (digits, one optional point) exactly, or None."""
    if not number or number.strip() != number or not all(c.isdigit() or c == "." for c in number):
        return None
    try:
        value = Fraction(Decimal(number))
    except (InvalidOperation, ValueError):
        return None
    return value


def parse_slo(text: str) -> list[Objective]:
    """``METRIC=TARGET[,...]``: ``p50|p90|p95|p99|p999=<number>us|ms|s`` and
    ``success|goodput=<number>%`` (0 < percent <= 100), each metric at most once.

    Raises ValueError naming the term that is wrong and what was expected.
    """
    objectives: list[Objective] = []
    known = ", ".join([*SLO_QUANTILES, *SLO_RATES])
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            raise ValueError(f"empty objective in {text!r}; expected e.g. p99=200ms,success=99.9%")
        metric, sep, value = (part.strip() for part in term.partition("="))
        if not sep or not metric:
            raise ValueError(f"{term!r}: not METRIC=TARGET, e.g. p99=200ms or success=99.9%")
        if metric not in SLO_QUANTILES and metric not in SLO_RATES:
            raise ValueError(f"{term!r}: unknown metric {metric!r}; known: {known}")
        if any(o.metric == metric for o in objectives):
            raise ValueError(f"{term!r}: {metric} given twice")
        if metric in SLO_QUANTILES:
            unit = next((u for u in ("us", "µs", "ms", "s") if value.endswith(u)), None)
            number = _exact(value[: -len(unit)]) if unit else None
            if unit is None or number is None or number <= 0:
                raise ValueError(
                    f"{term!r}: {metric} needs a positive duration with a unit (us, ms or s), "
                    f"e.g. {metric}=200ms"
                )
            target = number * _DURATION_UNITS_MS[unit]
        else:
            number = _exact(value[:-1]) if value.endswith("%") else None
            if number is None or not 0 < number <= 100:
                raise ValueError(
                    f"{term!r}: {metric} needs a percentage in (0, 100] with a % sign, "
                    f"e.g. {metric}=99.9%"
                )
            target = number
        objectives.append(Objective(metric, target, term))
    return objectives


@dataclass(frozen=True)
class Verdict:
    """How one objective fared: ``measured`` in the objective's unit (ms or percent; None when
    nothing was measured: no successful request, or no request at all)."""

    objective: Objective
    measured: float | None
    passed: bool
    count: tuple[int, int] | None = None  # for a rate: (meeting it, requests)


def judge(
    objectives: Sequence[Objective], latencies_ms: Sequence[float], report: dict[str, Any]
) -> list[Verdict]:
    """Each objective against one run: ``latencies_ms`` are the successful requests' latencies
    (any order), ``report`` what :func:`summarize` returned. A quantile passes when it is at
    most its target, a rate when it is at least its target; both exactly at the target pass."""
    ordered = sorted(latencies_ms)
    requests = int(report["requests"])
    verdicts = []
    for o in objectives:
        if o.is_latency:
            value = _quantile(ordered, SLO_QUANTILES[o.metric]) if ordered else None
            verdicts.append(Verdict(o, value, value is not None and value <= o.target))
            continue
        meeting = int(report["ok"] if o.metric == "success" else report["on_time"])
        if not requests:
            verdicts.append(Verdict(o, None, False, (meeting, requests)))
            continue
        # Exact: 999 of 1000 meets 99.9%, whatever binary floating point makes of 99.9.
        passed = Fraction(meeting * 100, requests) >= o.target
        verdicts.append(Verdict(o, 100.0 * meeting / requests, passed, (meeting, requests)))
    return verdicts


def verdict_line(v: Verdict) -> str:
    """``  SLO p99 <= 200ms        measured 12.40 ms                     PASS``."""
    o = v.objective
    value = o.text.partition("=")[2].strip()
    if o.is_latency:
        goal = f"{o.metric} <= {value}"
        measured = "no successful request" if v.measured is None else f"{v.measured:.2f} ms"
    else:
        goal = f"{o.metric} >= {value}"
        meeting, requests = v.count or (0, 0)
        measured = (
            "no request ended"
            if v.measured is None
            else f"{v.measured:.3f}% ({meeting} of {requests})"
        )
    return f"  SLO {goal:<18s} measured {measured:<30s} {'PASS' if v.passed else 'FAIL'}"


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


@dataclass
class ClassTally:
    """One SLO class's requests: offered (begun, or dropped by the open-loop client), how
    they ended, and the latencies of its successes."""

    offered: int = 0
    ok: int = 0
    on_time: int = 0
    refused: int = 0  # ended with a Halcyon refusal: never admitted
    late: int = 0  # admitted, then answered after its deadline or DEADLINE_EXCEEDED
    lost: int = 0
    client_dropped: int = 0
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class Tally:
    """Everything measured during a run; one per process, merged at the end.

    ``outcomes`` has one entry per request (its final answer: ``OK``, ``CODE/REASON`` for a
    Halcyon rejection, the bare ``CODE`` for a lost one); ``rejected`` counts every rejected
    *attempt* by reason, so with retries it shows how often the server said no.
    """

    started: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    # End-to-end latency minus the device time the worker reported: what the serving path
    # (client hop, gateway, worker RPC) adds on top of the model itself.
    added_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    batch_sizes: list[int] = field(default_factory=list)
    hedged: int = 0
    sent: int = 0  # attempts, retries included
    client_dropped: int = 0
    on_time: int = 0
    lost: int = 0
    retries: int = 0
    unfinished: int = 0  # retry due after the end of the run: neither answered nor lost
    rejected: Counter[str] = field(default_factory=Counter)
    # timeline[s]: attempt outcomes in second s of the run ("ok", "on_time", "lost",
    # "rejected/REASON").
    timeline: list[Counter[str]] = field(default_factory=list)
    # Per SLO class (the --mix, in its order; empty when built by hand, e.g. in tests).
    classes: list[ClassTally] = field(default_factory=list)
    refused: int = 0  # requests that ended with a refusal at admission (see ADMITTED_FAILURES)
    admitted_late: int = 0

    @property
    def ok(self) -> int:
        return self.outcomes.get("OK", 0)

    @property
    def requests(self) -> int:
        """Requests that ended, however they ended."""
        return sum(self.outcomes.values())

    @property
    def answered(self) -> int:
        """Requests that ended with a Halcyon answer (OK or a Halcyon rejection)."""
        return self.requests - self.lost

    def mark(self, second: int, *labels: str) -> None:
        while len(self.timeline) <= second:
            self.timeline.append(Counter())
        bucket = self.timeline[second]
        for label in labels:
            bucket[label] += 1


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


_WORDS = ["summarise", "the", "quarterly", "report", "for", "our", "fleet", "please"]


def _prompt(rng: random.Random, input_bytes: tuple[int, int] | None) -> str:
    if input_bytes is None:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16)))
    size = rng.randint(*input_bytes)
    text = ""
    while len(text) < size:
        text += rng.choice(_WORDS) + " "
    return text[:size]


def _request_pool(
    model: str,
    session: str,
    rng: random.Random,
    size: int = 32,
    max_tokens: tuple[int, int] = DEFAULT_MAX_TOKENS,
    input_bytes: tuple[int, int] | None = None,
) -> list[bytes]:
    pool = []
    for _ in range(size):
        prompt = _prompt(rng, input_bytes)
        req = infer_pb2.InferRequest(
            model=model,
            input=prompt,
            max_output_tokens=rng.randint(*max_tokens),
            session_key=session,
        )
        pool.append(req.SerializeToString())
    return pool


def balancing_service_config(health_check: str) -> dict[str, Any]:
    """The gRPC service config of a client that balances over every address of its target
    (``round_robin``) and picks only those whose ``grpc.health.v1`` status for the service
    name ``health_check`` is SERVING (client-side health checking, gRFC A17)."""
    return {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": health_check},
    }


def channel_options(health_check: str | None) -> list[tuple[str, Any]]:
    """The load generator's channel options: the fleet's keepalive, and gRPC's default
    balancing (pick_first) unless ``health_check`` names a health service to balance on."""
    options: list[tuple[str, Any]] = [*keepalive.client_options()]
    if health_check is None:
        return options
    return [
        *options,
        ("grpc.service_config", json.dumps(balancing_service_config(health_check))),
    ]


def is_halcyon_answer(err: RichError) -> bool:
    """True if the status came from Halcyon (its ErrorInfo), not from the transport."""
    return err.reason is not None and err.domain == DOMAIN


@dataclass(slots=True)
class _Request:
    """One logical request: its payload, when it was first sent, what to do when it ends, and
    its SLO class (an index into the mix)."""

    payload: bytes
    first_sent: float
    then: Callable[[], None] | None
    slo: int = 0


class _RetryTimer:
    """One thread that sends delayed retries in due order (a heap), instead of a timer each."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="loadtest-retries", daemon=True)
        self._thread.start()

    def call_at(self, due: float, fn: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._seq), fn))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._heap:
                    if self._closed:
                        return
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.perf_counter()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                _, _, fn = heapq.heappop(self._heap)
            fn()


class LoadGenerator:
    """Sends pre-serialized Infer requests and records how each one ended.

    Calls are grpc callback futures: completions run on gRPC's own threads and immediately
    fire the client's next request (closed loop), so the generator spends little CPU per call
    and can drive a gateway past 3,000 req/s from one process.
    """

    def __init__(self, args: argparse.Namespace | LoadOptions) -> None:
        self.args = args
        self.classes: tuple[SloClass, ...] = tuple(getattr(args, "mix", None) or ()) or (
            SloClass("default", 1.0, args.deadline_ms),
        )
        self.tally = Tally(classes=[ClassTally() for _ in self.classes])
        self.rng = random.Random(args.seed)
        self.metadata = (("x-api-key", args.api_key),)
        self.deadline_s = args.deadline_ms / 1000.0
        self._deadlines_s = [c.deadline_ms / 1000.0 for c in self.classes]
        self._cum_shares = list(itertools.accumulate(c.share for c in self.classes))
        self._max_tokens: tuple[int, int] = getattr(args, "max_tokens", None) or DEFAULT_MAX_TOKENS
        self._input_bytes: tuple[int, int] | None = getattr(args, "input_bytes", None)
        self._lock = threading.Lock()
        self._outstanding = 0  # requests begun and not ended (waiting retries included)
        self._idle = threading.Condition(self._lock)
        self._t0 = 0.0
        self._stop_at = 0.0
        self._retry_timer: _RetryTimer | None = None
        self.channel = grpc.insecure_channel(
            args.target, options=channel_options(getattr(args, "health_check", None))
        )
        self.call = self.channel.unary_unary(
            INFER_METHOD,
            request_serializer=None,
            response_deserializer=infer_pb2.InferResponse.FromString,
        )

    def _retry_delay(self, err: RichError) -> float | None:
        """Seconds to wait before resending after this rejection; None = do not retry."""
        if getattr(self.args, "retry_immediately", False):
            return 0.0 if err.code in LOAD_REJECTIONS else None
        if getattr(self.args, "honor_retry_info", False):
            return err.retry_after_s  # None when the server gave no retry advice
        return None

    def _draw_class(self, rng: random.Random) -> int:
        """An SLO class by share (no draw with a single class: today's sequence unchanged)."""
        if len(self.classes) == 1:
            return 0
        u = rng.random()
        for index, upto in enumerate(self._cum_shares):
            if u < upto:
                return index
        return len(self.classes) - 1

    def _begin(self, payload: bytes, then: Callable[[], None] | None, slo: int = 0) -> None:
        request = _Request(payload, time.perf_counter(), then, slo)
        with self._lock:
            self._outstanding += 1
            self.tally.classes[slo].offered += 1
        self._attempt(request)

    def _attempt(self, request: _Request) -> None:
        with self._lock:
            self.tally.sent += 1
        t0 = time.perf_counter()
        future = self.call.future(
            request.payload, timeout=self._deadlines_s[request.slo], metadata=self.metadata
        )
        future.add_done_callback(lambda f: self._done(f, request, t0))

    def _done(self, future: grpc.Future, request: _Request, t0: float) -> None:
        now = time.perf_counter()
        err = future.exception()
        retry_after: float | None = None
        cut_off = False
        with self._lock:
            tally = self.tally
            slo = tally.classes[request.slo]
            deadline_s = self._deadlines_s[request.slo]
            second = int(now - self._t0)
            if err is None:
                resp = future.result()
                total_s = now - request.first_sent
                tally.latencies_ms.append(total_s * 1000.0)
                slo.latencies_ms.append(total_s * 1000.0)
                slo.ok += 1
                execution = resp.timings.execution
                tally.added_ms.append(
                    (now - t0) * 1000.0 - (execution.seconds * 1e3 + execution.nanos / 1e6)
                )
                tally.outcomes["OK"] += 1
                tally.versions[resp.version] += 1
                tally.batch_sizes.append(resp.batch.size)
                if resp.hedged:
                    tally.hedged += 1
                if total_s <= deadline_s:
                    tally.on_time += 1
                    slo.on_time += 1
                    tally.mark(second, "ok", "on_time")
                else:
                    tally.admitted_late += 1
                    slo.late += 1
                    tally.mark(second, "ok")
            else:
                assert isinstance(err, grpc.RpcError)
                rich = parse_rpc_error(err)
                name = rich.code.name
                past_deadline = rich.code is grpc.StatusCode.DEADLINE_EXCEEDED
                if not is_halcyon_answer(rich):
                    tally.lost += 1
                    slo.lost += 1
                    if past_deadline:  # the client's own deadline: admitted, never answered
                        tally.admitted_late += 1
                        slo.late += 1
                    tally.outcomes[name] += 1
                    tally.mark(second, "lost")
                else:
                    reason = str(rich.reason)
                    tally.rejected[reason] += 1
                    tally.mark(second, f"rejected/{reason}")
                    retry_after = self._retry_delay(rich)
                    if retry_after is None:
                        tally.outcomes[f"{name}/{reason}"] += 1
                        if reason not in ADMITTED_FAILURES:
                            tally.refused += 1
                            slo.refused += 1
                        elif past_deadline:
                            tally.admitted_late += 1
                            slo.late += 1
                    elif now + retry_after < self._stop_at:
                        tally.retries += 1
                    else:
                        # Its retry would fall after the run: the request has not ended, and
                        # its client (waiting past the end) sends nothing more.
                        tally.unfinished += 1
                        cut_off = True
            if retry_after is None or cut_off:
                self._outstanding -= 1
                if self._outstanding == 0:
                    self._idle.notify_all()
        if cut_off:
            return
        if retry_after is not None:
            if retry_after <= 0.0 or self._retry_timer is None:
                self._attempt(request)
            else:
                self._retry_timer.call_at(now + retry_after, lambda: self._attempt(request))
        elif request.then is not None and time.perf_counter() < self._stop_at:
            request.then()

    def _pool(self, session: str, rng: random.Random, size: int) -> list[bytes]:
        return _request_pool(
            self.args.model, session, rng, size, self._max_tokens, self._input_bytes
        )

    def _closed_loop(self) -> None:
        for i in range(self.args.clients):
            pool = self._pool(f"client-{i}", random.Random(self.args.seed + i), 32)
            counter = itertools.count()
            # Each client draws its requests' classes from its own seeded stream (completions
            # run on gRPC's threads, so one shared generator would not be reproducible).
            slo_rng = random.Random(f"slo-{self.args.seed}-{i}")

            def next_call(
                pool: list[bytes] = pool,
                counter: Iterator[int] = counter,
                slo_rng: random.Random = slo_rng,
            ) -> None:
                self._begin(pool[next(counter) % len(pool)], next_call, self._draw_class(slo_rng))

            next_call()

    def _open_loop(self) -> None:
        pools = [
            self._pool(f"session-{i}", random.Random(self.args.seed + i), 8) for i in range(256)
        ]
        next_at = time.perf_counter()
        while True:
            next_at += -math.log(1.0 - self.rng.random()) / self.args.rate
            if next_at >= self._stop_at:
                return
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            slo = self._draw_class(self.rng)
            if self._outstanding >= self.args.max_inflight:
                with self._lock:
                    self.tally.client_dropped += 1
                    self.tally.classes[slo].client_dropped += 1
                    self.tally.classes[slo].offered += 1
                continue
            pool = pools[self.rng.randrange(len(pools))]
            self._begin(pool[self.rng.randrange(len(pool))], None, slo)

    def _progress(self, stop: threading.Event) -> None:
        last_n, last_t = 0, time.perf_counter()
        while not stop.wait(1.0):
            now = time.perf_counter()
            with self._lock:
                n = self.tally.requests
                ok = self.tally.ok
                lost = self.tally.lost
                lat = sorted(self.tally.latencies_ms[-2000:])
            print(
                f"\r[{now - self._t0:5.1f}s] {n:7d} requests  "
                f"{(n - last_n) / (now - last_t):7.1f} req/s  "
                f"ok {100.0 * ok / max(1, n):6.2f}%  lost {lost}  "
                f"p99 {_quantile(lat, 0.99):6.1f} ms",
                end="",
                file=sys.stderr,
                flush=True,
            )
            last_n, last_t = n, now

    def run(self) -> Tally:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=self.args.connect_timeout)
        except grpc.FutureTimeoutError:
            raise ConnectionError(
                f"no gateway answered at {self.args.target} within "
                f"{self.args.connect_timeout:g} s; start one (make stack) or pass --target"
            ) from None
        self._t0 = self.tally.started = time.perf_counter()
        self._stop_at = self._t0 + self.args.seconds
        self._retry_timer = _RetryTimer()
        stop = threading.Event()
        show = self.args.progress or (sys.stderr.isatty() and not self.args.json)
        progress = threading.Thread(target=self._progress, args=(stop,), daemon=True)
        if show:
            progress.start()
        if self.args.rate:
            self._open_loop()
        else:
            self._closed_loop()
        with self._idle:
            while self._outstanding or time.perf_counter() < self._stop_at:
                self._idle.wait(timeout=max(0.01, self._stop_at - time.perf_counter()))
        elapsed = time.perf_counter() - self._t0
        self._retry_timer.close()
        stop.set()
        if show:
            progress.join()
            print(file=sys.stderr)
        self.channel.close()
        self.tally.started = elapsed  # reuse as the run's wall time
        return self.tally


@dataclass(frozen=True)
class GatewayCounters:
    """What the gateway's /metrics says about its own work, read before and after a run."""

    cpu_seconds: float
    batches: float | None = None  # halcyon_gateway_batch_size_count
    batched_requests: float | None = None  # halcyon_gateway_batch_size_sum

    def minus(self, before: GatewayCounters) -> GatewayCounters:
        def delta(now: float | None, then: float | None) -> float | None:
            return None if now is None or then is None else now - then

        return GatewayCounters(
            self.cpu_seconds - before.cpu_seconds,
            delta(self.batches, before.batches),
            delta(self.batched_requests, before.batched_requests),
        )


def read_gateway_counters(metrics_address: str) -> GatewayCounters | None:
    """The gateway's CPU seconds and dispatched batches, or None if /metrics cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    url = metrics_address if "://" in metrics_address else f"http://{metrics_address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    cpu: float | None = None
    batches: float | None = None
    batched: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_cpu_seconds_total":
                cpu = float(sample.value)
            elif sample.name == "halcyon_gateway_batch_size_count":
                batches = (batches or 0.0) + float(sample.value)
            elif sample.name == "halcyon_gateway_batch_size_sum":
                batched = (batched or 0.0) + float(sample.value)
    return None if cpu is None else GatewayCounters(cpu, batches, batched)


def read_process_cpu(metrics_address: str) -> float | None:
    """A process's ``process_cpu_seconds_total`` from its /metrics, or None if unreadable."""
    counters = read_gateway_counters(metrics_address)
    return None if counters is None else counters.cpu_seconds


def read_workers_cpu(addresses: Sequence[str]) -> dict[str, float]:
    """``process_cpu_seconds_total`` of every worker whose /metrics could be read."""
    readings = {}
    for address in addresses:
        cpu = read_process_cpu(address)
        if cpu is not None:
            readings[address] = cpu
    return readings


def _timeline(tally: Tally) -> list[dict[str, Any]]:
    """Per second since the start: ok, on time, lost and rejections by reason (attempts)."""
    rows = []
    for second, bucket in enumerate(tally.timeline):
        rejected = {
            label.split("/", 1)[1]: n
            for label, n in sorted(bucket.items())
            if label.startswith("rejected/")
        }
        rows.append(
            {
                "t": second,
                "ok": bucket.get("ok", 0),
                "on_time": bucket.get("on_time", 0),
                "rejected": rejected,
                "lost": bucket.get("lost", 0),
            }
        )
    return rows


def _class_report(cls: SloClass, t: ClassTally) -> dict[str, Any]:
    lat = sorted(t.latencies_ms)
    return {
        "name": cls.name,
        "share": cls.share,
        "deadline_ms": cls.deadline_ms,
        "offered": t.offered,
        "succeeded": t.ok,
        "on_time": t.on_time,
        "on_time_share": t.on_time / t.offered if t.offered else 0.0,
        "refused": t.refused,
        "admitted_late": t.late,
        "lost": t.lost,
        "client_dropped": t.client_dropped,
        "p50_ms": _quantile(lat, 0.50),
        "p95_ms": _quantile(lat, 0.95),
        "p99_ms": _quantile(lat, 0.99),
    }


def summarize(
    tally: Tally,
    elapsed: float,
    gateway: GatewayCounters | None,
    *,
    classes: Sequence[SloClass] = (),
    window_s: float | None = None,
    workers_cpu_s: float | None = None,
) -> dict[str, Any]:
    """The report (what ``--json`` prints). ``classes`` names ``tally.classes``; ``window_s``
    is the arrival window (``--seconds``) goodput is judged over; ``workers_cpu_s`` the
    workers' CPU seconds over the run (``--worker-metrics``)."""
    lat = sorted(tally.latencies_ms)
    added = sorted(tally.added_ms)
    requests = tally.requests
    window = window_s if window_s else elapsed
    admitted = requests - tally.refused
    # Attempts the gateway answered (successes plus every rejection, retries included): what
    # its CPU was spent on.
    served_attempts = tally.ok + sum(tally.rejected.values())

    def per_s(n: int) -> float:
        return n / elapsed if elapsed else 0.0

    def share(n: int) -> float:
        return n / requests if requests else 0.0

    return {
        "requests": requests,
        "answered": tally.answered,
        "ok": tally.ok,
        "on_time": tally.on_time,
        "lost": tally.lost,
        "attempts": tally.sent,
        "retries": tally.retries,
        "unfinished": tally.unfinished,
        "success_rate": share(tally.ok),
        "on_time_rate": share(tally.on_time),
        "lost_rate": share(tally.lost),
        "answered_rps": per_s(tally.answered),
        "success_rps": per_s(tally.ok),
        "on_time_rps": per_s(tally.on_time),
        # Kept for older readers: throughput counts successful answers only (a rejection is
        # not throughput), goodput the on-time ones.
        "throughput_rps": per_s(tally.ok),
        "goodput_rps": per_s(tally.on_time),
        # On-time successes over the arrival window: the benchmark's goodput.
        "goodput_window_rps": tally.on_time / window if window else 0.0,
        "window_s": window,
        "offered": sum(c.offered for c in tally.classes) or requests + tally.client_dropped,
        "admitted": admitted,
        "admitted_late": tally.admitted_late,
        "admitted_late_share": tally.admitted_late / admitted if admitted else 0.0,
        "classes": [_class_report(c, t) for c, t in zip(classes, tally.classes, strict=False)],
        "p50_ms": _quantile(lat, 0.50),
        "p95_ms": _quantile(lat, 0.95),
        "p99_ms": _quantile(lat, 0.99),
        "max_ms": lat[-1] if lat else math.nan,
        "added_p50_ms": _quantile(added, 0.50),
        "added_p99_ms": _quantile(added, 0.99),
        "mean_batch_size": sum(tally.batch_sizes) / len(tally.batch_sizes)
        if tally.batch_sizes
        else 0.0,
        "hedge_rate": tally.hedged / tally.ok if tally.ok else 0.0,
        "outcomes": dict(sorted(tally.outcomes.items())),
        "rejected": dict(sorted(tally.rejected.items())),
        "versions": dict(sorted(tally.versions.items())),
        "client_dropped": tally.client_dropped,
        "elapsed_s": elapsed,
        "gateway_cpu_ms_per_request": (gateway.cpu_seconds * 1000.0 / served_attempts)
        if gateway is not None and served_attempts
        else None,
        "gateway_cpu_s": gateway.cpu_seconds if gateway is not None else None,
        # The workers' CPU (summed) per attempt the gateway answered, as for the gateway's.
        "worker_cpu_ms_per_request": (workers_cpu_s * 1000.0 / served_attempts)
        if workers_cpu_s is not None and served_attempts
        else None,
        "worker_cpu_s": workers_cpu_s,
        # The gateway's own count over all its traffic in the run (this client's, normally):
        # batches dispatched and the plain mean of their sizes, where ``mean_batch_size`` above
        # is the size of the batch each answer came in (larger batches count more often).
        "gateway_batches": int(gateway.batches)
        if gateway is not None and gateway.batches is not None
        else None,
        "gateway_requests_per_batch": gateway.batched_requests / gateway.batches
        if gateway is not None and gateway.batches and gateway.batched_requests is not None
        else None,
        "timeline": _timeline(tally),
    }


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def render(report: dict[str, Any]) -> str:
    requests = report["requests"]
    lines = [
        f"  requests        {requests:<10d}  answered {report['answered']}, "
        f"lost {report['lost']}"
        + (
            f"   ({report['attempts']} attempts, {report['retries']} retries; "
            f"{report['unfinished']} cut off by the end of the run)"
            if report["retries"] or report["unfinished"]
            else ""
        ),
        f"  answered        {report['answered_rps']:.1f} req/s   (any Halcyon answer, "
        "rejections included)",
        f"  successful      {report['success_rps']:.1f} req/s   "
        f"success rate {100.0 * report['success_rate']:.2f}%",
        f"  on time         {report['on_time_rps']:.1f} req/s   "
        f"{100.0 * report['on_time_rate']:.2f}% of requests succeeded within their deadline",
        f"  p50/p95/p99     {report['p50_ms']:.1f} / {report['p95_ms']:.1f} / "
        f"{report['p99_ms']:.1f} ms   (max {report['max_ms']:.1f} ms; successful requests, "
        "from the first attempt)",
        f"  added latency   p50 {report['added_p50_ms']:.2f} / p99 {report['added_p99_ms']:.2f} ms"
        "   (end to end minus the worker's device time)",
        f"  mean batch size {report['mean_batch_size']:.2f}   hedge rate "
        f"{100.0 * report['hedge_rate']:.2f}%",
        "  outcomes        " + _counts(report["outcomes"]) + "   (final answer per request)",
    ]
    if report["rejected"]:
        lines.append(
            "  rejections      " + _counts(report["rejected"]) + "   (every rejected attempt)"
        )
    lines.append("  versions        " + _counts(report["versions"]))
    if report["client_dropped"]:
        lines.append(
            f"  client dropped  {report['client_dropped']} (open loop over --max-inflight)"
        )
    for c in report.get("classes") or []:
        lines.append(
            f"  class {c['name']:<9s} {c['offered']} offered, {c['succeeded']} succeeded, "
            f"{c['on_time']} on time ({100.0 * c['on_time_share']:.1f}%) within "
            f"{c['deadline_ms']:g} ms   p50/p99 {c['p50_ms']:.1f} / {c['p99_ms']:.1f} ms"
        )
    if "goodput_window_rps" in report:
        lines.append(
            f"  goodput         {report['goodput_window_rps']:.1f} on-time req/s over the "
            f"{report['window_s']:g} s arrival window"
        )
        lines.append(
            f"  admitted, late  {report['admitted_late']} of {report['admitted']} admitted "
            f"({100.0 * report['admitted_late_share']:.2f}%) answered after their deadline or "
            "with DEADLINE_EXCEEDED"
        )
    if report["gateway_cpu_ms_per_request"] is not None:
        lines.append(f"  gateway CPU     {report['gateway_cpu_ms_per_request']:.3f} ms per request")
    if report.get("worker_cpu_ms_per_request") is not None:
        lines.append(
            f"  worker CPU      {report['worker_cpu_ms_per_request']:.3f} ms per request "
            "(all --worker-metrics workers)"
        )
    if report.get("gateway_requests_per_batch") is not None:
        lines.append(
            f"  gateway batches {report['gateway_batches']} dispatched, "
            f"{report['gateway_requests_per_batch']:.2f} requests per batch "
            "(mean batch size above is per answer)"
        )
    return "\n".join(lines)


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
        help="gateway address, or a gRPC target naming several (ipv4:A,B or dns:///NAME:PORT; "
        "see --health-check) (default 127.0.0.1:50051)",
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


@dataclass
class LoadOptions:
    """What one load test does: the ``halcyon loadtest`` flags, with the same defaults."""

    target: str = "127.0.0.1:50051"
    api_key: str = "demo-key-premium"
    model: str = "llama-3-8b"
    clients: int = 32
    rate: float = 0.0  # > 0: open loop at this many arrivals per second
    seconds: float = 20.0
    deadline_ms: float = 2000.0
    max_inflight: int = 4096
    seed: int = 1
    honor_retry_info: bool = False
    retry_immediately: bool = False
    health_check: str | None = None
    connect_timeout: float = 10.0
    gateway_metrics: str | None = None
    worker_metrics: Sequence[str] | None = None
    mix: Sequence[SloClass] | None = None  # None: one class with deadline_ms
    max_tokens: tuple[int, int] | None = None  # None: DEFAULT_MAX_TOKENS
    input_bytes: tuple[int, int] | None = None  # None: 4 to 16 words
    # Objectives the command judges the run on (judge(slo, result.latencies_ms, result.report));
    # run_loadtest itself only measures.
    slo: Sequence[Objective] | None = None
    json: bool = False
    progress: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadOptions:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})

    @property
    def classes(self) -> tuple[SloClass, ...]:
        return tuple(self.mix) if self.mix else (SloClass("default", 1.0, self.deadline_ms),)

    @property
    def mode(self) -> str:
        mode = f"open loop {self.rate:g} req/s" if self.rate else f"{self.clients} clients"
        if self.mix:
            mode += ", mix " + ",".join(f"{c.name}:{c.share:g}:{c.deadline_ms:g}" for c in self.mix)
        if self.health_check is not None:
            mode += f", round_robin on health of {self.health_check!r}"
        if self.honor_retry_info:
            mode += ", honouring retry advice"
        elif self.retry_immediately:
            mode += ", retrying immediately"
        return mode

    def problem(self) -> str | None:
        """Why these options cannot run (the command line's wording), or None."""
        if self.clients < 1 and not self.rate:
            return "--clients must be at least 1 (or give --rate)"
        if self.rate < 0:
            return "--rate must be positive (or leave it out for a closed loop)"
        if self.seconds <= 0:
            return "--seconds must be positive"
        if self.deadline_ms <= 0:
            return "--deadline-ms must be positive"
        if self.honor_retry_info and self.retry_immediately:
            return "--honor-retry-info and --retry-immediately exclude each other"
        if self.input_bytes is not None and self.input_bytes[1] > MAX_INPUT_BYTES:
            return f"--input-bytes: at most {MAX_INPUT_BYTES} bytes (the gateway's limit)"
        return None


@dataclass(frozen=True)
class ClassResult:
    """One SLO class's figures (see :func:`summarize`'s ``classes``)."""

    name: str
    share: float
    deadline_ms: float
    offered: int
    succeeded: int
    on_time: int
    on_time_share: float  # of offered
    refused: int
    admitted_late: int
    lost: int
    client_dropped: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True)
class LoadResult:
    """Every figure of one load test; ``report`` is the ``--json`` object (and more keys)."""

    mode: str
    report: dict[str, Any]
    offered: int  # requests begun, plus arrivals the open-loop client dropped
    requests: int  # requests that ended
    succeeded: int
    on_time: int
    elapsed_s: float  # wall time, including answers still awaited after the window
    window_s: float  # the arrival window (--seconds)
    goodput_rps: float  # on-time successes / window_s
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch_size: float  # per successful answer (InferResponse.batch.size)
    gateway_requests_per_batch: float | None  # the gateway's histogram, per dispatch
    gateway_cpu_ms_per_request: float | None
    worker_cpu_ms_per_request: float | None
    admitted: int
    admitted_late: int
    admitted_late_share: float
    classes: tuple[ClassResult, ...]
    # Every successful request's latency (ms, from its first attempt), sorted: what the
    # quantiles above and the --slo latency objectives are taken from.
    latencies_ms: tuple[float, ...] = ()

    @classmethod
    def from_report(
        cls, mode: str, report: dict[str, Any], latencies_ms: Sequence[float] = ()
    ) -> LoadResult:
        return cls(
            mode=mode,
            report=report,
            offered=report["offered"],
            requests=report["requests"],
            succeeded=report["ok"],
            on_time=report["on_time"],
            elapsed_s=report["elapsed_s"],
            window_s=report["window_s"],
            goodput_rps=report["goodput_window_rps"],
            p50_ms=report["p50_ms"],
            p95_ms=report["p95_ms"],
            p99_ms=report["p99_ms"],
            mean_batch_size=report["mean_batch_size"],
            gateway_requests_per_batch=report["gateway_requests_per_batch"],
            gateway_cpu_ms_per_request=report["gateway_cpu_ms_per_request"],
            worker_cpu_ms_per_request=report["worker_cpu_ms_per_request"],
            admitted=report["admitted"],
            admitted_late=report["admitted_late"],
            admitted_late_share=report["admitted_late_share"],
            classes=tuple(ClassResult(**c) for c in report["classes"]),
            latencies_ms=tuple(sorted(latencies_ms)),
        )


def _warn(message: str) -> None:
    print(f"loadtest: {message}", file=sys.stderr)


def run_loadtest(options: LoadOptions, *, warn: Callable[[str], None] = _warn) -> LoadResult:
    """Run one load test against a running gateway and return its figures.

    Raises ValueError for options :meth:`LoadOptions.problem` refuses and ConnectionError when
    no gateway accepts a connection within ``connect_timeout``. Metrics endpoints that cannot
    be read are reported through ``warn`` and their figures left out (None).
    """
    problem = options.problem()
    if problem is not None:
        raise ValueError(problem)
    before = read_gateway_counters(options.gateway_metrics) if options.gateway_metrics else None
    if options.gateway_metrics and before is None:
        warn(
            f"cannot read http://{options.gateway_metrics}/metrics; running without "
            "gateway figures (check --gateway-metrics)"
        )
    workers = list(options.worker_metrics or ())
    workers_before = read_workers_cpu(workers)
    unread = [w for w in workers if w not in workers_before]
    if unread:
        warn(
            f"cannot read the metrics of {', '.join(unread)}; worker CPU leaves them out "
            "(check --worker-metrics)"
        )
    tally = LoadGenerator(options).run()
    after = (
        read_gateway_counters(options.gateway_metrics)
        if before is not None and options.gateway_metrics
        else None
    )
    workers_cpu: float | None = None
    if workers_before:
        workers_after = read_workers_cpu(list(workers_before))
        if workers_after.keys() == workers_before.keys():
            workers_cpu = sum(workers_after[w] - workers_before[w] for w in workers_before)
        else:
            warn("a worker's metrics went away during the run; no worker CPU figure")
    report = summarize(
        tally,
        tally.started,
        after.minus(before) if after is not None and before else None,
        classes=options.classes,
        window_s=options.seconds,
        workers_cpu_s=workers_cpu,
    )
    return LoadResult.from_report(options.mode, report, tally.latencies_ms)


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
