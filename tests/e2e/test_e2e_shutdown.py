"""SIGTERM a gateway under load: every call the gateway accepted gets an answer.

Sixteen clients send Infer continuously (2 s gRPC deadlines) while the gateway is told to
stop. Each call must end in one of three ways: OK (accepted work finishes within the grace),
UNAVAILABLE with ErrorInfo reason SHUTTING_DOWN (a typed refusal while draining), or
UNAVAILABLE because no connection could be made (after the listener closed). Nothing may
hang until its deadline or end UNKNOWN / INTERNAL, and the process exits 0 within its grace.

One exception, which is gRPC's and not the gateway's: when ``server.stop()`` begins, gRPC core
fails the calls that reached the transport but were never handed to a handler with CANCELLED
(grpc/grpc#41785; a bare ``grpc.aio`` server with a trivial handler does the same to clients
that keep sending through its stop). Those calls were never accepted by the gateway. They are
tolerated only if they started after SIGTERM, carry no Halcyon error details, end at once and
end while the process is stopping (before it exits); a CANCELLED call that was in flight at
SIGTERM (accepted work) fails the test.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest

from common.errors import parse_rpc_error
from halcyon.v1 import infer_pb2, infer_pb2_grpc

pytestmark = pytest.mark.e2e

CLIENTS = 16
DEADLINE_S = 2.0
GRACE_S = 5.0
WARMUP_OK = 64
# How gRPC reports a call that never reached a server (nothing listening any more).
CONNECT_FAILURE = re.compile(
    r"failed to connect|connection refused|connections to all backends failing", re.IGNORECASE
)


@dataclass(frozen=True)
class Call:
    client: int
    started: float
    ended: float
    outcome: str  # "ok" | "shutting_down" | "refused" | "transport_cancelled" | "bad"
    detail: str


def _classify(err: grpc.aio.AioRpcError) -> tuple[str, str]:
    rich = parse_rpc_error(err)
    detail = f"{rich.code.name} {rich.reason or '-'}: {rich.message}"
    if rich.code == grpc.StatusCode.UNAVAILABLE:
        if rich.reason == "SHUTTING_DOWN" and rich.domain == "halcyon.dev":
            return "shutting_down", detail
        if rich.reason is None and CONNECT_FAILURE.search(rich.message):
            return "refused", detail
    if rich.code == grpc.StatusCode.CANCELLED and rich.reason is None:
        return "transport_cancelled", detail  # judged against its timing by the test
    return "bad", detail


async def _client(
    n: int, address: str, key: str, gone: asyncio.Event, calls: list[Call], stop_by: float
) -> None:
    """Send Infer back to back until the gateway is gone and a call has been refused."""
    refused_after_exit = False
    async with grpc.aio.insecure_channel(address) as channel:
        stub = infer_pb2_grpc.InferServiceStub(channel)
        i = 0
        while not refused_after_exit and time.monotonic() < stop_by:
            exited = gone.is_set()
            started = time.monotonic()
            try:
                await stub.Infer(
                    infer_pb2.InferRequest(
                        model="llama-3-8b",
                        input=f"client {n} request {i}",
                        max_output_tokens=32,
                        session_key=f"client-{n}",
                    ),
                    metadata=(("x-api-key", key),),
                    timeout=DEADLINE_S,
                )
                outcome, detail = "ok", ""
            except grpc.aio.AioRpcError as err:
                outcome, detail = _classify(err)
            calls.append(Call(n, started, time.monotonic(), outcome, detail))
            refused_after_exit = exited and outcome == "refused"
            i += 1


async def test_sigterm_under_load_answers_every_accepted_call(
    launch: Any, e2e: SimpleNamespace
) -> None:
    # Workers with real (simulated) device time, so work is queued and in flight at SIGTERM.
    fleet = launch.fleet(
        workers={"replica-a": (), "replica-b": ()},
        gateway_args=("--shutdown-grace", str(GRACE_S)),
    )
    gateway = fleet.gateway
    calls: list[Call] = []
    gone = asyncio.Event()
    stop_by = time.monotonic() + 30.0
    clients = [
        asyncio.create_task(_client(n, gateway.grpc, e2e.API_KEY, gone, calls, stop_by))
        for n in range(CLIENTS)
    ]
    try:
        loop = asyncio.get_running_loop()
        warm_by = loop.time() + 15.0
        while sum(c.outcome == "ok" for c in calls) < WARMUP_OK:
            assert loop.time() < warm_by, Counter(c.outcome for c in calls)
            assert not any(c.outcome == "bad" for c in calls), [c.detail for c in calls]
            gateway.check_alive()
            await asyncio.sleep(0.01)

        sigterm_at = time.monotonic()
        gateway.send(signal.SIGTERM)
        code = await asyncio.to_thread(gateway.wait_exit, GRACE_S + 5.0)
        exited_at = time.monotonic()
        gone.set()
        await asyncio.wait_for(asyncio.gather(*clients), timeout=DEADLINE_S + 5.0)
    finally:
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

    assert code == 0, gateway.describe()
    assert exited_at - sigterm_at < GRACE_S + 1.0, exited_at - sigterm_at

    outcomes = Counter(c.outcome for c in calls)
    bad = [c.detail for c in calls if c.outcome == "bad"]
    assert not bad, f"{len(bad)} calls ended badly: {Counter(bad).most_common(5)}; {outcomes}"
    slowest = max(c.ended - c.started for c in calls)
    assert slowest < DEADLINE_S, f"a call took {slowest:.3f} s"
    assert outcomes["ok"] >= WARMUP_OK

    # Work accepted before SIGTERM was answered (drained), not dropped or cancelled.
    in_flight = [c for c in calls if c.started < sigterm_at < c.ended]
    assert in_flight and all(c.outcome in ("ok", "shutting_down") for c in in_flight), Counter(
        c.outcome for c in in_flight
    )
    assert any(c.outcome == "ok" for c in in_flight), Counter(c.outcome for c in in_flight)
    assert all(c.outcome == "ok" for c in calls if c.ended < sigterm_at)

    # Refusals (typed, or at the transport) come back at once: none is a hang.
    for c in calls:
        if c.outcome != "ok":
            assert c.started >= sigterm_at or c.outcome == "shutting_down", c
            assert c.ended - c.started < 0.5, c

    # gRPC's own race at server.stop(): only calls sent while the server was stopping.
    for c in calls:
        if c.outcome == "transport_cancelled":
            assert sigterm_at < c.started and c.ended < exited_at, (c, sigterm_at, exited_at)

    # Every client saw the gateway gone as a refused connection.
    after_exit = [c for c in calls if c.started > exited_at]
    assert {c.client for c in after_exit if c.outcome == "refused"} == set(range(CLIENTS))
    assert all(c.outcome == "refused" for c in after_exit), Counter(c.outcome for c in after_exit)
