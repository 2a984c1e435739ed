"""The stop gate on a real ServiceHost: after ``quiesce()`` new calls are held — on the
completion-queue path, unary and streaming methods through grpc.aio alike — and refused with
``SHUTTING_DOWN`` once the stop begins, or just before their own deadline; health checks pass;
``quiesce()`` returns once arrivals stop, or at its limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import common.serving as serving
import common.stop_gate as stop_gate
from common.call import HELD, UnaryCall
from common.errors import DOMAIN, Reason, RichError, parse_rpc_error
from common.serving import STOP_HOLD_LIMIT_S, STOP_QUIET_S, ServiceHost, ServingOptions
from common.stop_gate import StopGate

SERVICE = "halcyon.test.Gated"
RAW = f"/{SERVICE}/Raw"  # served off the completion queue (ServiceHost.add_unary)
UNARY = f"/{SERVICE}/Unary"  # a servicer's unary method, served by grpc.aio
STREAM = f"/{SERVICE}/Stream"  # grpc.aio, server streaming


async def _unary(request: bytes, context: Any) -> bytes:
    return request


async def _stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
    yield request


def _register(_servicer: Any, server: Any) -> None:
    kw: dict[str, Any] = {"request_deserializer": None, "response_serializer": None}
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(_unary, **kw),
                    "Stream": grpc.unary_stream_rpc_method_handler(_stream, **kw),
                },
            ),
        )
    )


def _raw_echo(request: bytes, call: UnaryCall) -> None:
    call.reply(request)


@pytest.fixture
async def host() -> AsyncIterator[ServiceHost]:
    host = ServiceHost("gated", ServingOptions(metrics_listen=None, serving_path="fast"), None)
    host.add_service(_register, None, SERVICE)
    host.add_unary(RAW, _raw_echo, deserializer=None)
    await host.start()
    assert host.serving_path == "fast"
    yield host
    await host.stop(0)


async def _ask(channel: grpc.aio.Channel, method: str, deadline_s: float | None = None) -> bytes:
    if method == STREAM:
        call = channel.unary_stream(method)(b"hi", timeout=deadline_s)
        return b"".join([r async for r in call])
    answer: bytes = await channel.unary_unary(method)(b"hi", timeout=deadline_s)
    return answer


def _refusal(task: asyncio.Task[bytes]) -> RichError:
    exc = task.exception()
    assert isinstance(exc, grpc.aio.AioRpcError), exc
    return parse_rpc_error(exc)


def _is_shutting_down(err: RichError) -> bool:
    return (
        err.code == grpc.StatusCode.UNAVAILABLE
        and err.reason == Reason.SHUTTING_DOWN
        and err.domain == DOMAIN
    )


@pytest.mark.parametrize("method", [RAW, UNARY, STREAM])
async def test_calls_after_quiesce_are_held_until_the_stop_then_refused(
    host: ServiceHost, method: str
) -> None:
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        assert await _ask(channel, method) == b"hi"  # served while open
        quiescing = asyncio.ensure_future(host.quiesce())
        await asyncio.sleep(0)  # the gate is closed now
        held = asyncio.ensure_future(_ask(channel, method))
        await quiescing  # returns once no call has arrived for STOP_QUIET_S
        await asyncio.sleep(0.1)
        assert not held.done()  # held: neither answered nor pending in the transport
        await host.stop(1.0)
        await asyncio.wait_for(asyncio.wait({held}), 5.0)
    assert _is_shutting_down(_refusal(held)), _refusal(held)


@pytest.mark.parametrize("method", [RAW, UNARY])
async def test_a_held_call_is_answered_before_its_deadline(
    host: ServiceHost, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wide margin, so a busy machine cannot turn the answer into the client's own deadline.
    monkeypatch.setattr(stop_gate, "ANSWER_BEFORE_DEADLINE_S", 0.3)
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        await _ask(channel, method)
        quiescing = asyncio.ensure_future(host.quiesce())
        await asyncio.sleep(0)
        t0 = time.monotonic()
        held = asyncio.ensure_future(_ask(channel, method, deadline_s=1.0))
        await asyncio.wait({held, quiescing})
        took = time.monotonic() - t0
    assert _is_shutting_down(_refusal(held)), _refusal(held)  # not DEADLINE_EXCEEDED
    assert 0.6 < took < 1.0, took  # held until 0.3 s before its deadline, not answered at once


async def test_health_checks_are_neither_held_nor_arrivals(
    host: ServiceHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "STOP_HOLD_LIMIT_S", 30.0)  # quiet, or nothing
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        host.set_ready(True)
        health = health_pb2_grpc.HealthStub(channel)
        quiescing = asyncio.ensure_future(host.quiesce())
        give_up = loop.time() + 10.0
        checks = 0
        # Checks keep coming, faster than the quiet period, and quiesce still sees quiet.
        while not quiescing.done() and loop.time() < give_up:
            answer = await health.Check(
                health_pb2.HealthCheckRequest(service="readiness"), timeout=5
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            checks += 1
            await asyncio.sleep(STOP_QUIET_S / 5)
        assert quiescing.done() and checks >= 1


async def test_quiesce_returns_once_arrivals_stop(
    host: ServiceHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "STOP_HOLD_LIMIT_S", 30.0)  # quiet, or nothing
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        t0 = loop.time()
        quiescing = asyncio.ensure_future(host.quiesce())
        held = [asyncio.ensure_future(_ask(channel, UNARY, deadline_s=30)) for _ in range(8)]
        await asyncio.wait_for(quiescing, 10.0)
        took = loop.time() - t0
        await host.stop(1.0)
        await asyncio.wait(held)
    assert STOP_QUIET_S <= took < 10.0
    assert all(_is_shutting_down(parse_rpc_error(f.exception())) for f in held)  # type: ignore[arg-type]


async def test_quiesce_gives_up_at_its_limit_while_calls_keep_arriving(host: ServiceHost) -> None:
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        await _ask(channel, UNARY)
        t0 = loop.time()
        quiescing = asyncio.ensure_future(host.quiesce())
        held: list[asyncio.Future[bytes]] = []
        while not quiescing.done():  # an open loop: a new call every STOP_QUIET_S / 3
            held.append(asyncio.ensure_future(_ask(channel, UNARY, deadline_s=5)))
            await asyncio.sleep(STOP_QUIET_S / 3)
            assert loop.time() - t0 < 10.0, "quiesce did not give up"
        took = loop.time() - t0
        await host.stop(1.0)
        await asyncio.wait(held)
    assert took >= STOP_HOLD_LIMIT_S, took
    assert len(held) >= 4
    assert all(_is_shutting_down(parse_rpc_error(f.exception())) for f in held)  # type: ignore[arg-type]


# -- the gate alone, with stand-in calls --------------------------------------------------------


class _Call:
    """Stands in for a unary call: a deadline, and the answers it was given."""

    def __init__(self, left_s: float | None) -> None:
        self._deadline = None if left_s is None else time.monotonic() + left_s
        self.answers: list[tuple[float, RichError]] = []

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def reject(self, err: RichError) -> None:
        self.answers.append((time.monotonic(), err))


def _admit(gate: StopGate, call: _Call) -> Any:
    return gate.admit(call)  # type: ignore[arg-type]


async def test_held_calls_are_refused_on_release_or_before_their_deadline() -> None:
    gate = StopGate("gateway")
    assert _admit(gate, _Call(None)) is None  # open: the call goes on
    gate.close()
    patient, hurried = _Call(None), _Call(0.1)
    assert _admit(gate, patient) is HELD and _admit(gate, hurried) is HELD
    assert gate.held == 2 and not patient.answers and not hurried.answers
    await asyncio.sleep(0.15)
    assert len(hurried.answers) == 1 and not patient.answers
    answered_at, err = hurried.answers[0]
    assert answered_at <= hurried._deadline  # type: ignore[operator]
    assert _is_shutting_down(err) and "gateway is shutting down" in err.message
    gate.release()
    assert len(patient.answers) == 1 and len(hurried.answers) == 1  # one answer each
    refused = _admit(gate, _Call(None))  # after the release: refused at once
    assert isinstance(refused, RichError) and _is_shutting_down(refused)


async def test_quiet_waits_for_the_last_arrival() -> None:
    loop = asyncio.get_running_loop()
    gate = StopGate("gateway")
    t0 = loop.time()

    async def arrive(times: int) -> None:
        for _ in range(times):
            await asyncio.sleep(0.02)
            _admit(gate, _Call(None))

    arrivals = asyncio.ensure_future(arrive(5))  # the last at ~0.1 s
    await gate.quiet(0.05, 1.0)
    await arrivals
    assert 0.15 <= loop.time() - t0 < 0.5
    gate.release()
