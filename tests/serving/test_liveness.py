"""Liveness: the pure judgement, the watchdog on an injected clock, and a ServiceHost whose loop
is really blocked, probed on its probe port from another thread (ADR 0010)."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.liveness import LIVE, LivenessWatchdog, Verdict, judge
from common.serving import (
    SERVING_PATH_ENV,
    ServiceHost,
    ServingOptions,
    add_serving_arguments,
    serving_options_from_args,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LIMIT = 10.0


def test_a_busy_but_moving_loop_is_live() -> None:
    # A beat posted 9.9 s ago and a queue pumped 9.9 s ago: slow, not wedged.
    assert judge(100.0, LIMIT, 90.1, [("/a/B", None, 90.1), ("/a/C", None, None)]) == LIVE
    assert judge(100.0, LIMIT, None, []) == LIVE


def test_a_loop_that_runs_nothing_past_the_limit_is_not_live() -> None:
    verdict = judge(100.0, LIMIT, 89.0, [("/a/B", None, None)])
    assert not verdict.live and "event loop has run nothing for 11.0 s" in verdict.reason


def test_a_queue_held_without_pumping_past_the_limit_is_not_live() -> None:
    verdict = judge(100.0, LIMIT, None, [("/a/B", None, 95.0), ("/a/C", None, 80.0)])
    assert not verdict.live and verdict.reason.startswith("/a/C: calls waiting")


def test_a_failed_pump_is_not_live_whatever_else() -> None:
    verdict = judge(100.0, LIMIT, None, [("/a/B", "the poller died", None)])
    assert verdict == Verdict(False, "/a/B: the poller died")


class _Loop:
    """Takes the watchdog's beats; runs them when told to."""

    def __init__(self) -> None:
        self.beats: list[Any] = []
        self.closed = False

    def call_soon_threadsafe(self, callback: Any) -> None:
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.beats.append(callback)

    def run(self) -> None:
        beats, self.beats = self.beats, []
        for beat in beats:
            beat()


class _Pump:
    method = "/a/B"
    failure: str | None = None
    since: float | None = None

    def stalled_since(self) -> float | None:
        return self.since


def test_the_watchdog_reports_flips_of_live_only() -> None:
    now = [0.0]
    loop, pump = _Loop(), _Pump()
    seen: list[Verdict] = []
    dog = LivenessWatchdog(loop, [pump], 1.0, seen.append, clock=lambda: now[0])  # type: ignore[arg-type]
    assert dog.check() and len(loop.beats) == 1
    loop.run()  # the loop answers its beat
    for t in (0.5, 1.0, 1.5):
        now[0] = t
        dog.check()
        loop.run()
    assert seen == []
    dog.check()  # posts a beat at 1.5 that the (now stuck) loop never runs
    for t in (2.0, 2.6, 3.0, 4.0):
        now[0] = t
        dog.check()
    assert [v.live for v in seen] == [False]  # one report, not one per check
    loop.run()
    now[0] = 4.1
    dog.check()
    assert [v.live for v in seen] == [False, True]
    pump.failure = "gone"
    dog.check()
    assert seen[-1] == Verdict(False, "/a/B: gone")
    loop.closed = True
    loop.beats.clear()
    dog._beat()  # the last beat ran
    assert not dog.check()  # nothing left to watch


def test_the_watchdog_refuses_a_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="positive"):
        LivenessWatchdog(_Loop(), [], 0.0, print)  # type: ignore[arg-type]


def _probe(address: str, name: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=name), timeout=1
        )
    return int(reply.status)


async def test_a_blocked_loop_is_answered_not_serving_on_the_probe_port(
    make_host: Any, wait_until: Any
) -> None:
    options = ServingOptions(metrics_listen=None, health_listen="127.0.0.1:0", stall_limit_s=0.4)
    host: ServiceHost = await make_host(options=options)
    host.set_ready(True)
    probe = host.health_address
    assert probe is not None and host.health_address != host.grpc_address
    assert await asyncio.to_thread(_probe, probe, "liveness") == SERVING
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append((_probe(probe, "liveness"), _probe(probe, "readiness")))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    await wait_until(lambda: bool(seen))
    time.sleep(2.0)  # the loop is stuck: nothing on it runs  # noqa: ASYNC251
    stuck = list(seen)
    await wait_until(lambda: len(seen) > len(stuck) and seen[-1] == (SERVING, SERVING))
    done.set()
    await asyncio.to_thread(watcher.join)
    assert (NOT_SERVING, NOT_SERVING) in stuck, stuck  # answered while the loop was stuck
    # The main port agrees once the loop runs again; readiness is what the host was told.
    assert host.health.get("liveness") == host.health.get("readiness") == SERVING
    host.set_ready(False)
    assert await asyncio.to_thread(_probe, probe, "readiness") == NOT_SERVING
    assert await asyncio.to_thread(_probe, probe, "liveness") == SERVING


async def test_stop_turns_the_probe_port_off_and_closes_it(make_host: Any) -> None:
    host: ServiceHost = await make_host(options=ServingOptions(health_listen="127.0.0.1:0"))
    probe = host.health_address
    assert probe is not None
    assert await asyncio.to_thread(_probe, probe, "liveness") == SERVING
    await host.stop(0)
    with pytest.raises(grpc.RpcError):
        await asyncio.to_thread(_probe, probe, "liveness")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serving_arguments(parser, default_listen="127.0.0.1:1", default_metrics_listen="off")
    return parser


def test_serving_path_and_probe_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SERVING_PATH_ENV, raising=False)
    defaults = serving_options_from_args(_parser().parse_args([]))
    assert (defaults.serving_path, defaults.health_listen, defaults.stall_limit_s) == (
        "fast",
        None,
        10.0,
    )
    args = ["--serving-path", "aio", "--health-listen", "0.0.0.0:9", "--stall-limit", "3"]
    options = serving_options_from_args(_parser().parse_args(args))
    assert (options.serving_path, options.health_listen, options.stall_limit_s) == (
        "aio",
        "0.0.0.0:9",
        3.0,
    )
    monkeypatch.setenv(SERVING_PATH_ENV, "aio")
    assert serving_options_from_args(_parser().parse_args([])).serving_path == "aio"
    assert ServingOptions().serving_path == "aio"
    for bad in (["--stall-limit", "0"], ["--health-listen", "nohost"]):
        with pytest.raises(SystemExit):
            serving_options_from_args(_parser().parse_args(bad))
    with pytest.raises(SystemExit):
        _parser().parse_args(["--serving-path", "turbo"])
    monkeypatch.setenv(SERVING_PATH_ENV, "turbo")
    with pytest.raises(SystemExit, match=SERVING_PATH_ENV):
        _parser()
