"""The completion-queue endpoint on a real ServiceHost: answers, errors, cancellation, metrics,
auth, shutdown, and the fall-back to grpc.aio when it cannot attach."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

import common.raw_unary as raw_unary
from common.auth import AuthPolicy, Role, bearer_metadata
from common.errors import Reason, RichError, parse_rpc_error, unavailable
from common.raw_unary import RawCall, RawUnaryEndpoint
from common.serving import ServiceHost, ServingOptions

SERVICE = "halcyon.test.Raw"
METHOD = f"/{SERVICE}/Call"


class Handler:
    """b"ok:<x>" -> reply <x>; b"rich" -> a RichError with retry advice; b"boom" -> raises;
    b"hold" -> never answers (until cancelled); b"later" -> answers 0.3 s later."""

    def __init__(self) -> None:
        self.cancelled: list[bytes] = []
        self.held: list[RawCall] = []
        self.metadata: list[Any] = []

    def __call__(self, call: RawCall) -> None:
        body = call.request
        self.metadata.append(call.metadata)
        if body.startswith(b"ok:"):
            call.reply(body[3:])
        elif body == b"rich":
            err = unavailable(Reason.OVERLOADED, "too busy", 0.25)
            call.fail(err.code, err.message, err.trailing_metadata())
        elif body == b"boom":
            raise ValueError("boom")
        elif body == b"hold":
            self.held.append(call)
            call.on_cancel = lambda: self.cancelled.append(body)
        elif body == b"later":
            self.held.append(call)
            asyncio.get_running_loop().call_later(0.3, call.reply, b"done")
            call.on_cancel = lambda: self.cancelled.append(body)


async def _aio_fallback(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"aio:" + request


def _register(_servicer: Any, server: Any) -> None:
    kw: dict[str, Any] = {"request_deserializer": None, "response_serializer": None}
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE, {"Call": grpc.unary_unary_rpc_method_handler(_aio_fallback, **kw)}
            ),
        )
    )


HostWithHandler = tuple[ServiceHost, Handler, RawUnaryEndpoint]


@pytest.fixture
async def make_raw_host() -> AsyncIterator[Callable[..., Any]]:
    hosts: list[ServiceHost] = []

    async def make(auth: AuthPolicy | None = None) -> HostWithHandler:
        host = ServiceHost("raw", ServingOptions(metrics_listen=None), auth)
        handler = Handler()
        endpoint = RawUnaryEndpoint(METHOD, handler, host.grpc_metrics)
        host.add_service(_register, None, SERVICE)
        host.add_raw_unary(endpoint)
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


async def test_it_attaches_to_the_pinned_grpc(make_raw_host: Any) -> None:
    # If a grpcio upgrade changes the internals this relies on, fail here instead of
    # silently serving the hot methods through the slower aio path.
    _, _, endpoint = await make_raw_host()
    assert endpoint.attached


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
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "ValueError" in (caught.value.details() or "")


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


async def test_without_the_internals_grpc_aio_serves_the_method(
    make_raw_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(raw_unary, "_core_server", lambda _server: None)
    host, handler, endpoint = await make_raw_host()
    assert not endpoint.attached
    channel, call = _call(host)
    async with channel:
        assert await call(b"ok:x", timeout=5) == b"aio:ok:x"
    assert handler.metadata == []


def test_rich_error_trailers_survive_the_raw_path_shape() -> None:
    # fail() takes the trailers RichError produces: a binary details entry and pushback.
    err = RichError(grpc.StatusCode.UNAVAILABLE, "x", reason="OVERLOADED", retry_after_s=0.07)
    keys = [k for k, _ in err.trailing_metadata()]
    assert keys == ["grpc-status-details-bin", "grpc-retry-pushback-ms"]
