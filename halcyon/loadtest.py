"""``halcyon loadtest``: drive real load at a running gateway and report what users would see.

Closed loop (``--clients N``): each client sends its next request as soon as the previous one
is answered, like a pool of interactive users. Open loop (``--rate R``): Poisson arrivals at R
req/s regardless of how fast answers come back, so a slow server cannot hide its tail latency
by slowing the load down (coordinated omission).

The request mix follows the original system's load test: max output tokens uniform in
[64, 255], one session key per client, a 2 s deadline carried as the gRPC deadline. Requests
are serialized once up front so the load generator spends its CPU on calls, not on protobuf.

With ``--gateway-metrics HOST:PORT`` it reads the gateway's ``process_cpu_seconds_total`` and
batch-size histogram before and after the run and reports the gateway's CPU time per request
and how many batches it dispatched for them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from common.errors import parse_rpc_error
from halcyon.v1 import infer_pb2

INFER_METHOD = "/halcyon.v1.InferService/Infer"


@dataclass
class Tally:
    """Everything measured during a run; one per process, merged at the end."""

    started: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    # End-to-end latency minus the device time the worker reported: what the serving path
    # (client hop, gateway, worker RPC) adds on top of the model itself.
    added_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    batch_sizes: list[int] = field(default_factory=list)
    hedged: int = 0
    sent: int = 0
    client_dropped: int = 0

    @property
    def ok(self) -> int:
        return self.outcomes.get("OK", 0)

    @property
    def answered(self) -> int:
        return sum(self.outcomes.values())


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _request_pool(model: str, session: str, rng: random.Random, size: int = 32) -> list[bytes]:
    words = ["summarise", "the", "quarterly", "report", "for", "our", "fleet", "please"]
    pool = []
    for _ in range(size):
        req = infer_pb2.InferRequest(
            model=model,
            input=" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))),
            max_output_tokens=rng.randint(64, 255),
            session_key=session,
        )
        pool.append(req.SerializeToString())
    return pool


class LoadGenerator:
    """Sends pre-serialized Infer requests and records how each one ended.

    Calls are grpc callback futures: completions run on gRPC's own threads and immediately
    fire the client's next request (closed loop), so the generator spends little CPU per call
    and can drive a gateway past 3,000 req/s from one process.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tally = Tally()
        self.rng = random.Random(args.seed)
        self.metadata = (("x-api-key", args.api_key),)
        self.deadline_s = args.deadline_ms / 1000.0
        self._lock = threading.Lock()
        self._outstanding = 0
        self._idle = threading.Condition(self._lock)
        self._stop_at = 0.0
        self.channel = grpc.insecure_channel(args.target)
        self.call = self.channel.unary_unary(
            INFER_METHOD,
            request_serializer=None,
            response_deserializer=infer_pb2.InferResponse.FromString,
        )

    def _send(self, payload: bytes, then: Callable[[], None] | None) -> None:
        with self._lock:
            self._outstanding += 1
            self.tally.sent += 1
        t0 = time.perf_counter()
        future = self.call.future(payload, timeout=self.deadline_s, metadata=self.metadata)
        future.add_done_callback(lambda f: self._done(f, t0, then))

    def _done(self, future: grpc.Future, t0: float, then: Callable[[], None] | None) -> None:
        elapsed_ms = (time.perf_counter() - t0) * 1000.0
        err = future.exception()
        with self._lock:
            tally = self.tally
            if err is None:
                resp = future.result()
                tally.latencies_ms.append(elapsed_ms)
                execution = resp.timings.execution
                tally.added_ms.append(
                    elapsed_ms - (execution.seconds * 1e3 + execution.nanos / 1e6)
                )
                tally.outcomes["OK"] += 1
                tally.versions[resp.version] += 1
                tally.batch_sizes.append(resp.batch.size)
                if resp.hedged:
                    tally.hedged += 1
            else:
                assert isinstance(err, grpc.RpcError)
                rich = parse_rpc_error(err)
                code = err.code() if callable(getattr(err, "code", None)) else None
                name = code.name if code is not None else "UNKNOWN"
                tally.outcomes[name + (f"/{rich.reason}" if rich.reason else "")] += 1
            self._outstanding -= 1
            if self._outstanding == 0:
                self._idle.notify_all()
        if then is not None and time.perf_counter() < self._stop_at:
            then()

    def _closed_loop(self) -> None:
        for i in range(self.args.clients):
            pool = _request_pool(self.args.model, f"client-{i}", random.Random(self.args.seed + i))
            counter = itertools.count()

            def next_call(pool: list[bytes] = pool, counter: Iterator[int] = counter) -> None:
                self._send(pool[next(counter) % len(pool)], next_call)

            next_call()

    def _open_loop(self) -> None:
        pools = [
            _request_pool(self.args.model, f"session-{i}", random.Random(self.args.seed + i), 8)
            for i in range(256)
        ]
        next_at = time.perf_counter()
        while True:
            next_at += -math.log(1.0 - self.rng.random()) / self.args.rate
            if next_at >= self._stop_at:
                return
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if self._outstanding >= self.args.max_inflight:
                self.tally.client_dropped += 1
                continue
            pool = pools[self.rng.randrange(len(pools))]
            self._send(pool[self.rng.randrange(len(pool))], None)

    def _progress(self, stop: threading.Event) -> None:
        last_n, last_t = 0, time.perf_counter()
        while not stop.wait(1.0):
            now = time.perf_counter()
            with self._lock:
                n = self.tally.answered
                ok = self.tally.ok
                lat = sorted(self.tally.latencies_ms[-2000:])
            print(
                f"\r[{now - self.tally.started:5.1f}s] {n:7d} answered  "
                f"{(n - last_n) / (now - last_t):7.1f} req/s  "
                f"ok {100.0 * ok / max(1, n):6.2f}%  p99 {_quantile(lat, 0.99):6.1f} ms",
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
                f"no gateway answered at {self.args.target} within {self.args.connect_timeout:g} s"
            ) from None
        self.tally.started = time.perf_counter()
        self._stop_at = self.tally.started + self.args.seconds
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
        elapsed = time.perf_counter() - self.tally.started
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


def summarize(tally: Tally, elapsed: float, gateway: GatewayCounters | None) -> dict[str, Any]:
    lat = sorted(tally.latencies_ms)
    added = sorted(tally.added_ms)
    answered = tally.answered
    return {
        "requests": answered,
        "success_rate": tally.ok / answered if answered else 0.0,
        "throughput_rps": answered / elapsed if elapsed else 0.0,
        "goodput_rps": tally.ok / elapsed if elapsed else 0.0,
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
        "versions": dict(sorted(tally.versions.items())),
        "client_dropped": tally.client_dropped,
        "elapsed_s": elapsed,
        "gateway_cpu_ms_per_request": (gateway.cpu_seconds * 1000.0 / answered)
        if gateway is not None and answered
        else None,
        # The gateway's own count over all its traffic in the run (this client's, normally):
        # batches dispatched and the plain mean of their sizes, where ``mean_batch_size`` above
        # is the size of the batch each answer came in (larger batches count more often).
        "gateway_batches": int(gateway.batches)
        if gateway is not None and gateway.batches is not None
        else None,
        "gateway_requests_per_batch": gateway.batched_requests / gateway.batches
        if gateway is not None and gateway.batches and gateway.batched_requests is not None
        else None,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"  requests        {report['requests']:<10d}  success rate    "
        f"{100.0 * report['success_rate']:.2f}%",
        f"  throughput      {report['throughput_rps']:.1f} req/s   goodput "
        f"{report['goodput_rps']:.1f} req/s",
        f"  p50/p95/p99     {report['p50_ms']:.1f} / {report['p95_ms']:.1f} / "
        f"{report['p99_ms']:.1f} ms   (max {report['max_ms']:.1f} ms)",
        f"  added latency   p50 {report['added_p50_ms']:.2f} / p99 {report['added_p99_ms']:.2f} ms"
        "   (end to end minus the worker's device time)",
        f"  mean batch size {report['mean_batch_size']:.2f}   hedge rate "
        f"{100.0 * report['hedge_rate']:.2f}%",
        "  outcomes        " + ", ".join(f"{k} {v}" for k, v in report["outcomes"].items()),
        "  versions        "
        + (", ".join(f"{k} {v}" for k, v in report["versions"].items()) or "-"),
    ]
    if report["client_dropped"]:
        lines.append(
            f"  client dropped  {report['client_dropped']} (open loop over --max-inflight)"
        )
    if report["gateway_cpu_ms_per_request"] is not None:
        lines.append(f"  gateway CPU     {report['gateway_cpu_ms_per_request']:.3f} ms per request")
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
        "arrivals (--rate) and report success, throughput, latency quantiles, the latency "
        "added on top of device time, batch sizes, "
        "outcomes by status/reason, hedge rate and version split."
    )
    parser.add_argument("--target", default="127.0.0.1:50051", help="gateway host:port")
    parser.add_argument("--api-key", default="demo-key-premium", help="tenant API key")
    parser.add_argument("--model", default="llama-3-8b", help="model to call")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients (default 32)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop: Poisson arrivals per second"
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="run length (default 20)")
    parser.add_argument(
        "--deadline-ms", type=float, default=2000.0, help="per-request deadline (default 2000)"
    )
    parser.add_argument(
        "--max-inflight", type=int, default=4096, help="open loop: cap on outstanding requests"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed for the request mix")
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
        "batches it dispatched",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--progress", action="store_true", help="live progress even off a TTY")


def run(args: argparse.Namespace) -> int:
    if args.clients < 1 and not args.rate:
        print("loadtest: --clients must be at least 1 (or give --rate)", file=sys.stderr)
        return 2
    if args.seconds <= 0:
        print("loadtest: --seconds must be positive", file=sys.stderr)
        return 2
    before = read_gateway_counters(args.gateway_metrics) if args.gateway_metrics else None
    if args.gateway_metrics and before is None:
        print(f"loadtest: cannot read {args.gateway_metrics}/metrics", file=sys.stderr)
    gen = LoadGenerator(args)
    try:
        tally = gen.run()
    except ConnectionError as err:
        print(f"loadtest: {err}", file=sys.stderr)
        return 1
    after = read_gateway_counters(args.gateway_metrics) if before is not None else None
    report = summarize(
        tally, tally.started, after.minus(before) if after is not None and before else None
    )
    mode = f"open loop {args.rate:g} req/s" if args.rate else f"{args.clients} clients"
    if args.json:
        print(json.dumps({"mode": mode, **report}))
    else:
        print(f"halcyon loadtest — {mode}, {args.seconds:g} s against {args.target}")
        print(render(report))
    return 0
