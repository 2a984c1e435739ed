"""The host's unary pipeline on a real ServiceHost, on both transports: the size limit before
the credential, the credential before decoding, one handler either way, refused calls counted;
the probe port's answer to bytes that do not parse; and spans on unary and streaming calls."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from common.auth import AuthPolicy, Role, bearer_metadata
from common.call import UnaryCall
from common.errors import Reason, RichError, parse_rpc_error
from common.serving import ServiceHost, ServingOptions

SERVICE = "halcyon.test.Piped"
METHOD = f"/{SERVICE}/Call"
LIMIT = 64


HOLD = f"/{SERVICE}/Hold"
_cancelled: list[str] = []


def _echo(request: BytesValue, call: UnaryCall) -> None:
    call.reply(request.SerializeToString())


def _hold(request: bytes, call: UnaryCall) -> None:
    """Never answers: the client's deadline ends the call."""
    call.on_cancel = lambda: _cancelled.append(call.method)


@pytest.fixture(params=["fast", "aio"])
async def host(request: pytest.FixtureRequest) -> AsyncIterator[ServiceHost]:
    options = ServingOptions(metrics_listen=None, serving_path=request.param, grace_s=1.0)
    rules = {METHOD: Role.FLEET, HOLD: Role.FLEET}
    policy = AuthPolicy(fleet_token="f", operator_token="o", rules=rules)
    host = ServiceHost("piped", options, policy)
    host.add_unary(METHOD, _echo, deserializer=BytesValue.FromString, max_request_bytes=LIMIT)
    host.add_unary(HOLD, _hold, deserializer=None)
    await host.start()
    assert host.serving_path == request.param
    yield host
    await host.stop(0)


async def _refusal(host: ServiceHost, body: bytes, metadata: Any = ()) -> RichError:
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(METHOD)(body, timeout=5, metadata=metadata)
    return parse_rpc_error(caught.value)


def _handled(host: ServiceHost, code: str, method: str = "Call") -> float:
    labels = {"grpc_service": SERVICE, "grpc_method": method, "grpc_type": "unary"}
    return (
        host.registry.get_sample_value("grpc_server_handled_total", labels | {"grpc_code": code})
        or 0.0
    )


@pytest.mark.parametrize("metadata", [(), bearer_metadata("o"), bearer_metadata("f")])
async def test_an_oversized_request_is_refused_whatever_the_credential(
    host: ServiceHost, metadata: Any
) -> None:
    err = await _refusal(host, b"\xff" * (LIMIT + 1), metadata)
    assert (err.code, err.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.MESSAGE_TOO_LARGE)
    assert err.metadata == {"size_bytes": str(LIMIT + 1), "limit_bytes": str(LIMIT)}


async def test_the_credential_is_checked_before_the_bytes_are_decoded(host: ServiceHost) -> None:
    undecodable = b"\xff\xff\xff"
    err = await _refusal(host, undecodable)
    assert (err.code, err.reason) == (grpc.StatusCode.UNAUTHENTICATED, Reason.MISSING_CREDENTIALS)
    err = await _refusal(host, undecodable, bearer_metadata("f"))
    assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
    assert "google.protobuf.BytesValue" in err.message


async def test_one_handler_serves_and_refusals_are_counted(host: ServiceHost) -> None:
    body = BytesValue(value=b"hi").SerializeToString()
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        call: Callable[..., Any] = channel.unary_unary(METHOD)
        assert await call(body, timeout=5, metadata=bearer_metadata("f")) == body
    await _refusal(host, body)
    assert _handled(host, "OK") == 1
    assert _handled(host, "Unauthenticated") == 1


async def test_a_passed_deadline_cancels_the_call_and_is_counted(
    host: ServiceHost, wait_until: Any
) -> None:
    _cancelled.clear()
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(HOLD)(b"", timeout=0.2, metadata=bearer_metadata("f"))
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await wait_until(lambda: _cancelled == [HOLD])
    assert _handled(host, "DeadlineExceeded", "Hold") == 1


async def test_the_probe_port_answers_undecodable_bytes_invalid_argument() -> None:
    options = ServingOptions(metrics_listen=None, health_listen="127.0.0.1:0")
    host = ServiceHost("probed", options, None)
    await host.start()
    try:
        assert host.health_address is not None
        async with grpc.aio.insecure_channel(host.health_address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await channel.unary_unary("/grpc.health.v1.Health/Check")(b"\xff\xff", timeout=5)
        err = parse_rpc_error(caught.value)
        assert (err.code, err.reason) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_FIELD)
        assert "grpc.health.v1.HealthCheckRequest" in err.message
    finally:
        await host.stop(0)


async def _count(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(3):
        yield request + bytes([48 + i])


def _register_stream(_servicer: Any, server: Any) -> None:
    handler = grpc.unary_stream_rpc_method_handler(_count)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Count": handler}),)
    )


async def test_streams_and_unary_calls_get_spans_from_the_same_layer() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    options = ServingOptions(metrics_listen=None, serving_path="aio")
    host = ServiceHost("traced", options, None, tracer=provider.get_tracer("test"))
    host.add_service(_register_stream, None, SERVICE)
    host.add_unary(METHOD, _echo, deserializer=BytesValue.FromString)
    await host.start()
    try:
        async with grpc.aio.insecure_channel(host.grpc_address) as channel:
            replies = [r async for r in channel.unary_stream(f"/{SERVICE}/Count")(b"n", timeout=5)]
            with pytest.raises(grpc.aio.AioRpcError):
                await channel.unary_unary(METHOD)(b"\xff\xff", timeout=5)
    finally:
        await host.stop(0)
    assert replies == [b"n0", b"n1", b"n2"]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name, code in (
        (f"/{SERVICE}/Count", grpc.StatusCode.OK),
        (METHOD, grpc.StatusCode.INVALID_ARGUMENT),
    ):
        attributes = spans[name].attributes
        assert spans[name].kind == SpanKind.SERVER and attributes is not None
        assert attributes["rpc.grpc.status_code"] == code.value[0]
