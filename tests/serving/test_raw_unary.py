"""The completion-queue endpoint on a real ServiceHost: answers, errors, cancellation, metrics,
auth, shutdown, fault isolation, and when grpc.aio serves instead (ADR 0006, ADR 0010).

The method is added with ``ServiceHost.add_unary``: one handler, behind the host's pipeline, on
whichever path serves it."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest

import common.raw_unary as raw_unary
from common.auth import AuthPolicy, Role, bearer_metadata
from common.call import UnaryCall
from common.errors import Reason, RichError, parse_rpc_error, unavailable
from common.raw_unary import (
    VERIFIED_GRPCIO,
    RawCall,
    RawUnaryEndpoint,
    ServingPathError,
    fast_path_refusal,
)
from common.serving import ServiceHost, ServingFailed, ServingOptions

SERVICE = "halcyon.test.Raw"
METHOD = f"/{SERVICE}/Call"


class Handler:
    """b"ok:<x>" -> reply <x>; b"rich" -> a RichError with retry advice; b"boom" -> raises;
    b"hold" -> never answers (until cancelled); b"later" -> answers 0.3 s later."""

    def __init__(self) -> None:
        self.cancelled: list[bytes] = []
        self.held: list[UnaryCall] = []
        self.metadata: list[Any] = []

    def __call__(self, body: bytes, call: UnaryCall) -> None:
        self.metadata.append(call.metadata)
        if body.startswith(b"ok:"):
            call.reply(body[3:])
        elif body == b"rich":
            call.reject(unavailable(Reason.OVERLOADED, "too busy", 0.25))
        elif body == b"boom":
            raise ValueError("boom")
        elif body == b"hold":
            self.held.append(call)
            call.on_cancel = lambda: self.cancelled.append(body)
        elif body == b"later":
            self.held.append(call)
            asyncio.get_running_loop().call_later(0.3, call.reply, b"done")
            call.on_cancel = lambda: self.cancelled.append(body)


HostWithHandler = tuple[ServiceHost, Handler, RawUnaryEndpoint]


@pytest.fixture
async def make_raw_host() -> AsyncIterator[Callable[..., Any]]:
    hosts: list[ServiceHost] = []

    async def make(
        auth: AuthPolicy | None = None,
        path: str = "fast",
        before_start: Callable[[RawUnaryEndpoint], None] | None = None,
    ) -> HostWithHandler:
        options = ServingOptions(metrics_listen=None, serving_path=path, grace_s=1.0)
        host = ServiceHost("raw", options, auth)
        handler = Handler()
        host.add_unary(METHOD, handler, deserializer=None)
        (endpoint,) = host._raw_endpoints
        if before_start is not None:
            before_start(endpoint)
        await host.start()
        hosts.append(host)
        return host, handler, endpoint

    yield make
    for host in hosts:
        await host.stop(0)


def _call(host: ServiceHost) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(host.grpc_address)
    return channel, channel.unary_unary(METHOD)


def _sample(host: ServiceHost, name: str, **labels: str) -> float:
    full = {"grpc_service": SERVICE, "grpc_method": "Call", "grpc_type": "unary", **labels}
    return host.registry.get_sample_value(name, full) or 0.0


async def test_the_installed_grpcio_is_verified_and_attaches(make_raw_host: Any) -> None:
    # A grpcio outside VERIFIED_GRPCIO (constraints.txt bumped, internals changed) fails here
    # instead of silently serving the hot methods through the slower aio path: run the suite
    # on it (both paths) and add its minor release to the table.
    assert fast_path_refusal() is None, fast_path_refusal()
    host, _, endpoint = await make_raw_host()
    assert endpoint.attached and host.serving_path == "fast"
    assert ".".join(grpc.__version__.split(".")[:2]) in VERIFIED_GRPCIO


async def test_replies_and_sees_metadata_and_deadline(make_raw_host: Any) -> None:
    host, handler, _ = await make_raw_host()
    channel, call = _call(host)
    async with channel:
        assert await call(b"ok:hello", timeout=5, metadata=(("x-api-key", "k"),)) == b"hello"
        replies = await asyncio.gather(*(call(f"ok:{i}".encode(), timeout=5) for i in range(50)))
    assert replies == [str(i).encode() for i in range(50)]
    assert ("x-api-key", "k") in [tuple(m) for m in handler.metadata[0]]
    assert _sample(host, "grpc_server_handled_total", grpc_code="OK") == 51
    assert _sample(host, "grpc_server_started_total") == 51
    assert _sample(host, "grpc_server_msg_sent_total") == 51
    assert _sample(host, "grpc_server_handling_seconds_count") == 51


async def test_a_rich_error_arrives_with_its_details(make_raw_host: Any) -> None:
    host, _, _ = await make_raw_host()
    channel, call = _call(host)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"rich", timeout=5)
    err = parse_rpc_error(caught.value)
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.reason == Reason.OVERLOADED
    assert err.retry_after_s == pytest.approx(0.25)
    assert _sample(host, "grpc_server_handled_total", grpc_code="Unavailable") == 1


async def test_a_handler_bug_is_internal_not_unknown(make_raw_host: Any) -> None:
    host, _, _ = await make_raw_host()
    channel, call = _call(host)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"boom", timeout=5)
        assert await call(b"ok:still-serving", timeout=5) == b"still-serving"
    err = parse_rpc_error(caught.value)
    assert err.code == grpc.StatusCode.INTERNAL and err.reason == Reason.INTERNAL
    assert "ValueError" in err.message


async def test_a_pump_fault_fails_only_the_call_it_was_handling(
    make_raw_host: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def fault(stage: str, raw: RawCall | None) -> None:
        if stage == "event" and raw is not None and raw.request == b"ok:fault":
            raise KeyError("injected")

    def install(endpoint: RawUnaryEndpoint) -> None:
        endpoint.fault_hook = fault

    host, _, endpoint = await make_raw_host(before_start=install)
    channel, call = _call(host)
    async with channel:
        bodies = [f"ok:{i}".encode() for i in range(20)] + [b"ok:fault"]
        outcomes = await asyncio.gather(
            *(call(b, timeout=5) for b in bodies), return_exceptions=True
        )
        assert outcomes[:20] == [str(i).encode() for i in range(20)]
        assert isinstance(outcomes[20], grpc.aio.AioRpcError)
        err = parse_rpc_error(outcomes[20])
        assert err.code == grpc.StatusCode.INTERNAL and err.reason == Reason.INTERNAL
        again = await asyncio.gather(*(call(b"ok:x", timeout=5) for _ in range(20)))
    assert again == [b"x"] * 20  # the pump went on
    assert endpoint.event_failures == 1 and endpoint.failure is None
    # The faulty call never reached the pipeline (whose metrics layer counts calls): it is
    # counted by the endpoint, as gRPC's own failures before a handler are on grpc.aio.
    assert _sample(host, "grpc_server_handled_total", grpc_code="OK") == 40
    assert [r for r in caplog.records if "handling an event failed" in r.getMessage()]


async def test_a_dead_poller_turns_health_off_and_stops_the_host(
    make_raw_host: Any, wait_until: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dying: list[bool] = []

    def fault(stage: str, raw: RawCall | None) -> None:
        if stage == "poll" and dying:
            raise RuntimeError("injected")
        if raw is not None and raw.request == b"ok:die":
            dying.append(True)

    def install(endpoint: RawUnaryEndpoint) -> None:
        endpoint.fault_hook = fault

    host, _, _ = await make_raw_host(before_start=install)
    host.set_ready(True)
    serving = asyncio.ensure_future(host.serve_until_signal())
    channel, call = _call(host)
    async with channel:
        assert await call(b"ok:die", timeout=5) == b"die"
        # Calls until one reaches the poller (the loop takes events itself while it is busy).
        while True:
            await asyncio.sleep(0.1)
            stranded = asyncio.ensure_future(call(b"ok:x", timeout=30))
            done, _ = await asyncio.wait([stranded], timeout=1.0)
            if not done:
                break
        await wait_until(lambda: host.failure is not None)
        assert host.health.get("liveness") == host.health.get("readiness") == 2  # NOT_SERVING
        with pytest.raises(ServingFailed, match="poller thread died"):
            await asyncio.wait_for(serving, 10)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(stranded, 5)  # answered at the stop, not at its deadline
    assert caught.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    assert "poller thread died" in (host.failure or "")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "cannot go on" in errors[0].getMessage(), errors


async def test_calls_that_cannot_be_requested_fail_the_start(make_raw_host: Any) -> None:
    # A changed internal after attach: the start fails at once, loudly, before anyone waits.
    class Refusing:
        def __init__(self, core: Any) -> None:
            self._core = core

        def request_registered_call(self, *args: Any) -> None:
            raise TypeError("request_registered_call() takes 5 arguments")

    def break_core(endpoint: RawUnaryEndpoint) -> None:
        original = endpoint.attach

        def attach(server: Any) -> str | None:
            why = original(server)
            endpoint._core = Refusing(endpoint._core)
            return why

        endpoint.attach = attach  # type: ignore[method-assign]

    with pytest.raises(ServingPathError, match="--serving-path aio"):
        await make_raw_host(before_start=break_core)


async def test_client_deadline_cancels_and_a_late_answer_is_dropped(
    make_raw_host: Any, wait_until: Any
) -> None:
    host, handler, _ = await make_raw_host()
    channel, call = _call(host)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"hold", timeout=0.2)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_until(lambda: handler.cancelled == [b"hold"])
        held = handler.held[0]
        assert not held.open
        held.reply(b"too late")  # dropped, not a second answer
        assert await call(b"ok:next", timeout=5) == b"next"
    assert _sample(host, "grpc_server_handled_total", grpc_code="DeadlineExceeded") == 1


async def test_client_cancel_runs_on_cancel(make_raw_host: Any, wait_until: Any) -> None:
    host, handler, _ = await make_raw_host()
    channel, call = _call(host)
    async with channel:
        pending = call(b"hold", timeout=10)
        await wait_until(lambda: len(handler.held) == 1)
        pending.cancel()
        await wait_until(lambda: handler.cancelled == [b"hold"])
    assert _sample(host, "grpc_server_handled_total", grpc_code="Canceled") == 1


async def test_auth_policy_of_the_host_applies(make_raw_host: Any) -> None:
    policy = AuthPolicy(fleet_token="f", operator_token="o", rules={METHOD: Role.FLEET})
    host, handler, _ = await make_raw_host(auth=policy)
    channel, call = _call(host)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"ok:x", timeout=5)
        assert await call(b"ok:x", timeout=5, metadata=bearer_metadata("f")) == b"x"
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert parse_rpc_error(caught.value).reason == Reason.MISSING_CREDENTIALS
    assert len(handler.metadata) == 1  # the refused call never reached the handler


async def test_stop_answers_in_flight_calls_within_the_grace(
    make_raw_host: Any, wait_until: Any
) -> None:
    host, handler, _ = await make_raw_host()
    channel, call = _call(host)
    async with channel:
        pending = asyncio.ensure_future(call(b"later", timeout=5))
        await wait_until(lambda: len(handler.held) == 1)
        await host.stop(2.0)
        assert not handler.held[0].open  # answered before stop() returned
        assert await asyncio.wait_for(pending, 2.0) == b"done"


async def _served_by_aio(host: ServiceHost, handler: Handler, endpoint: RawUnaryEndpoint) -> None:
    assert not endpoint.attached and host.serving_path == "aio"
    channel, call = _call(host)
    async with channel:
        assert await call(b"ok:x", timeout=5) == b"x"  # the same handler, through grpc.aio
    assert len(handler.metadata) == 1
    assert _sample(host, "grpc_server_handled_total", grpc_code="OK") == 1


def _path_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "through grpc.aio" in r.getMessage()]


async def test_without_the_core_server_grpc_aio_serves_the_method(
    make_raw_host: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(raw_unary, "_core_server", lambda _server: None)
    await _served_by_aio(*await make_raw_host())
    (line,) = _path_lines(caplog)
    assert "core server" in line.getMessage() and line.levelno == logging.WARNING


async def test_an_unverified_grpcio_is_served_by_aio_with_one_line(
    make_raw_host: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(grpc, "__version__", "1.99.0")
    await _served_by_aio(*await make_raw_host())
    (line,) = _path_lines(caplog)
    assert "grpcio 1.99.0 is not a release" in line.getMessage()
    assert line.levelno == logging.WARNING


async def test_serving_path_aio_forces_grpc_aio(
    make_raw_host: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="halcyon.serving")
    await _served_by_aio(*await make_raw_host(path="aio"))
    (line,) = _path_lines(caplog)
    assert "--serving-path aio" in line.getMessage() and line.levelno == logging.INFO


async def test_changed_internal_signatures_are_refused_before_attaching(
    make_raw_host: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A stand-in for cygrpc whose request_registered_call grew a parameter.
    def request_registered_call(self: Any, call_queue: Any, server_queue: Any, method: Any,
                                tag: Any, flags: Any) -> None: ...  # fmt: skip

    real = raw_unary.cygrpc.Server
    server = SimpleNamespace(
        register_completion_queue=real.register_completion_queue,
        register_method=real.register_method,
        request_registered_call=request_registered_call,
    )
    fake = SimpleNamespace(**vars(raw_unary.cygrpc) | {"Server": server})
    assert inspect.signature(fake.Server.request_registered_call).parameters
    monkeypatch.setattr(raw_unary, "cygrpc", fake)
    raw_unary._internals_refusal.cache_clear()
    try:
        assert "request_registered_call" in (fast_path_refusal() or "")
        await _served_by_aio(*await make_raw_host())
    finally:
        raw_unary._internals_refusal.cache_clear()
    (line,) = _path_lines(caplog)
    assert "request_registered_call" in line.getMessage()


def test_rich_error_trailers_survive_the_raw_path_shape() -> None:
    # RawCall.fail() takes the trailers RichError produces: a binary details entry and pushback.
    err = RichError(grpc.StatusCode.UNAVAILABLE, "x", reason="OVERLOADED", retry_after_s=0.07)
    keys = [k for k, _ in err.trailing_metadata()]
    assert keys == ["grpc-status-details-bin", "grpc-retry-pushback-ms"]


async def test_a_burst_of_calls_yields_the_loop_to_other_work_often(make_raw_host: Any) -> None:
    # Under a flood of calls (a retry storm: thousands of rejections a second) the loop's other
    # callbacks — a worker's reply, the next batch's dispatch — must not wait behind the whole
    # flood: the pump hands the loop back every few calls. Here the loop is blocked while 300
    # calls arrive; a callback scheduled when the first is handled must run before many more.
    handled = 0
    ran_after: list[int] = []
    loop = asyncio.get_running_loop()

    def observe(stage: str, raw: RawCall | None) -> None:
        nonlocal handled
        if stage != "event":
            return
        handled += 1
        if handled == 1:
            loop.call_soon(lambda: ran_after.append(handled))

    def install(endpoint: RawUnaryEndpoint) -> None:
        endpoint.fault_hook = observe

    host, _, _ = await make_raw_host(before_start=install)

    def flood() -> list[bytes]:
        with grpc.insecure_channel(host.grpc_address) as channel:
            call = channel.unary_unary(METHOD)
            futures = [call.future(f"ok:{i}".encode(), timeout=30) for i in range(300)]
            return [f.result() for f in futures]

    sent = loop.run_in_executor(None, flood)
    await asyncio.sleep(0.05)  # the thread is sending
    time.sleep(0.5)  # noqa: ASYNC251 -- the loop is busy (as in a storm) while calls pile up
    assert len(await sent) == 300
    # The pump yields every 16 calls; a call completing in the same pass may add one or two.
    assert ran_after and ran_after[0] <= 32, ran_after
