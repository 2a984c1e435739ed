"""``halcyon loadtest``'s driver: the clients that send the load, and one run from start to end.

:class:`LoadGenerator` sends pre-serialized Infer requests on one channel (gRPC callback
futures, so it can drive a gateway past 3,000 req/s from one process): closed loop (each client
sends its next request when the previous one ends) or open loop (Poisson arrivals at
``--rate``, capped at ``--max-inflight``); retries per ``--honor-retry-info`` or
``--retry-immediately`` (:class:`_RetryTimer`); balancing per ``--health-check``
(:func:`channel_options`). :func:`run_loadtest` wraps one run with the metrics read before and
after it and returns the :class:`~halcyon.tools.loadtest_report.LoadResult`.
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from common import keepalive
from common.errors import DOMAIN, RichError, parse_rpc_error
from halcyon.tools.loadtest_mix import (
    DEFAULT_MAX_TOKENS,
    LoadOptions,
    SloClass,
    _request_pool,
    split_targets,
)
from halcyon.tools.loadtest_report import (
    LoadResult,
    read_gateway_counters,
    read_workers_cpu,
    summarize,
)
from halcyon.tools.loadtest_tally import ClassTally, Tally, _quantile
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
    target: int = 0  # index into LoadGenerator.targets


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
        # One channel per --target gateway; clients are spread over them round robin.
        self.targets = split_targets(args.target)
        options = channel_options(getattr(args, "health_check", None))
        self.channels = [grpc.insecure_channel(t, options=options) for t in self.targets]
        self.calls = [
            channel.unary_unary(
                INFER_METHOD,
                request_serializer=None,
                response_deserializer=infer_pb2.InferResponse.FromString,
            )
            for channel in self.channels
        ]
        if len(self.targets) > 1:
            self.tally.by_target.update(dict.fromkeys(self.targets, 0))
            self.tally.ok_by_target.update(dict.fromkeys(self.targets, 0))
        self._next_target = itertools.count()

    def close(self) -> None:
        for channel in self.channels:
            channel.close()

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

    def _begin(
        self, payload: bytes, then: Callable[[], None] | None, slo: int = 0, target: int = 0
    ) -> None:
        request = _Request(payload, time.perf_counter(), then, slo, target)
        with self._lock:
            self._outstanding += 1
            self.tally.classes[slo].offered += 1
        self._attempt(request)

    def _attempt(self, request: _Request) -> None:
        with self._lock:
            self.tally.sent += 1
        t0 = time.perf_counter()
        future = self.calls[request.target].future(
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
            if retry_after is None and len(self.targets) > 1:
                target = self.targets[request.target]
                tally.by_target[target] += 1
                if err is None:
                    tally.ok_by_target[target] += 1
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
                target: int = i % len(self.targets),
            ) -> None:
                payload = pool[next(counter) % len(pool)]
                self._begin(payload, next_call, self._draw_class(slo_rng), target)

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
            target = next(self._next_target) % len(self.targets)
            self._begin(pool[self.rng.randrange(len(pool))], None, slo, target)

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
        for target, channel in zip(self.targets, self.channels, strict=True):
            try:
                grpc.channel_ready_future(channel).result(timeout=self.args.connect_timeout)
            except grpc.FutureTimeoutError:
                raise ConnectionError(
                    f"no gateway answered at {target} within "
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
        self.close()
        self.tally.started = elapsed  # reuse as the run's wall time
        return self.tally


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
