"""The decode guard on a real aio ServiceHost: bytes that do not parse get INVALID_ARGUMENT.

A test service whose methods take a protobuf message (``StringValue``) in every shape a
servicer can meet its requests: the unary request, a server stream's request, a request
iterator (client stream and bidi), and ``await context.read()``. Each gets bytes that fail
to parse and must answer INVALID_ARGUMENT with a Halcyon ``ErrorInfo`` and a ``BadRequest``
naming the message type — never UNKNOWN — and the same channel must be served right after.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health_pb2

from common.auth import AuthPolicy, Role, bearer_metadata
from common.decode_guard import UNDECODABLE, DecodeGuard, guard_handler
from common.errors import DOMAIN, Reason, RichError, parse_rpc_error
from common.serving import ServiceHost, ServingOptions
from halcyon.v1 import control_pb2

SERVICE = "halcyon.test.Guarded"
FLEET = "fleet-secret"
GARBAGE = b"\xff\xff\xff"  # an invalid tag: "Wire format was corrupt"
BAD_UTF8 = b"\x0a\x01\xff"  # field 1 (a string) with invalid UTF-8
STRING = wrappers_pb2.StringValue
# The servicers below record what they were handed, to show the bad message never reached them.
seen: list[Any] = []


async def _unary(request: wrappers_pb2.StringValue, context: Any) -> wrappers_pb2.StringValue:
    seen.append(request)
    return STRING(value=request.value.upper())


async def _server_stream(
    request: wrappers_pb2.StringValue, context: Any
) -> AsyncIterator[wrappers_pb2.StringValue]:
    seen.append(request)
    for _ in range(2):
        yield STRING(value=request.value)


async def _client_stream(
    requests: AsyncIterator[wrappers_pb2.StringValue], context: Any
) -> wrappers_pb2.StringValue:
    values = []
    async for r in requests:
        seen.append(r)
        values.append(r.value)
    return STRING(value="+".join(values))


async def _bidi(
    requests: AsyncIterator[wrappers_pb2.StringValue], context: Any
) -> AsyncIterator[wrappers_pb2.StringValue]:
    async for r in requests:
        seen.append(r)
        yield STRING(value=r.value.upper())


async def _bidi_reads(requests: Any, context: Any) -> None:
    """Reads with ``context.read()`` and writes with ``context.write()`` (the controller's
    WorkerSession does); a read error is swallowed the way a session reader might."""
    while True:
        message = await context.read()
        if message is grpc.aio.EOF:
            return
        seen.append(message)
        await context.write(STRING(value=message.value.upper()))


def _register(_servicer: Any, server: Any) -> None:
    kw: dict[str, Any] = {
        "request_deserializer": STRING.FromString,
        "response_serializer": STRING.SerializeToString,
    }
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Unary": grpc.unary_unary_rpc_method_handler(_unary, **kw),
                    "ServerStream": grpc.unary_stream_rpc_method_handler(_server_stream, **kw),
                    "ClientStream": grpc.stream_unary_rpc_method_handler(_client_stream, **kw),
                    "Bidi": grpc.stream_stream_rpc_method_handler(_bidi, **kw),
                    "BidiReads": grpc.stream_stream_rpc_method_handler(_bidi_reads, **kw),
                },
            ),
        )
    )


METHODS = ("Unary", "ServerStream", "ClientStream", "Bidi", "BidiReads")


@pytest.fixture
async def host_factory() -> AsyncIterator[Callable[[AuthPolicy | None], Awaitable[ServiceHost]]]:
    hosts: list[ServiceHost] = []

    async def make(auth: AuthPolicy | None) -> ServiceHost:
        host = ServiceHost("test", ServingOptions(metrics_listen=None), auth)
        host.add_service(_register, None, SERVICE)
        await host.start()
        hosts.append(host)
        return host

    seen.clear()
    yield make
    for host in hosts:
        await host.stop(0)


def _policy() -> AuthPolicy:
    return AuthPolicy(
        fleet_token=FLEET,
        operator_token=None,
        rules={f"/{SERVICE}/{m}": Role.FLEET for m in METHODS},
    )


def _call_sync(
    channel: grpc.Channel, method: str, messages: list[bytes], metadata: Any
) -> list[bytes]:
    path = f"/{SERVICE}/{method}"
    kw: dict[str, Any] = {"request_serializer": None, "response_deserializer": None}
    if method == "Unary":
        return [channel.unary_unary(path, **kw)(messages[0], metadata=metadata, timeout=5)]
    if method == "ServerStream":
        return list(channel.unary_stream(path, **kw)(messages[0], metadata=metadata, timeout=5))
    if method == "ClientStream":
        stream = channel.stream_unary(path, **kw)
        return [stream(iter(messages), metadata=metadata, timeout=5)]
    return list(channel.stream_stream(path, **kw)(iter(messages), metadata=metadata, timeout=5))


async def _call(
    channel: grpc.Channel, method: str, messages: list[bytes], metadata: Any = ()
) -> list[bytes]:
    """Send raw request bytes the way ``method`` takes them; the raw response bytes.

    Through the synchronous client, in a thread: when a server ends a request stream early, the
    grpc.aio client can replace the server's status with its own ``INTERNAL`` (a write that
    fails before the status is read), and the answer under test is the server's."""
    return await asyncio.to_thread(_call_sync, channel, method, messages, metadata)


def _refusal(exc: pytest.ExceptionInfo[grpc.RpcError]) -> RichError:
    return parse_rpc_error(exc.value)


def _assert_undecodable(err: RichError) -> None:
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert err.reason == Reason.INVALID_FIELD and err.domain == DOMAIN
    assert [(v.field, v.description) for v in err.field_violations] == [
        ("request", "not a valid google.protobuf.StringValue")
    ]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("body", [GARBAGE, BAD_UTF8], ids=["bad-wire-format", "bad-utf8"])
async def test_undecodable_bytes_get_invalid_argument_and_the_server_serves_on(
    host_factory: Any, method: str, body: bytes
) -> None:
    host = await host_factory(None)
    with grpc.insecure_channel(host.grpc_address) as channel:
        with pytest.raises(grpc.RpcError) as exc:
            await _call(channel, method, [body])
        _assert_undecodable(_refusal(exc))
        assert seen == []  # the servicer never saw it
        good = STRING(value="hi").SerializeToString()
        answers = [STRING.FromString(a).value for a in await _call(channel, method, [good])]
    assert answers == {"ServerStream": ["hi", "hi"], "ClientStream": ["hi"]}.get(method, ["HI"])


@pytest.mark.parametrize("method", ["ClientStream", "Bidi", "BidiReads"])
async def test_a_stream_is_refused_at_its_first_bad_message(host_factory: Any, method: str) -> None:
    host = await host_factory(None)
    good = STRING(value="one").SerializeToString()
    with grpc.insecure_channel(host.grpc_address) as channel, pytest.raises(grpc.RpcError) as exc:
        await _call(channel, method, [good, GARBAGE, good])
    _assert_undecodable(_refusal(exc))
    assert seen == [STRING(value="one")]  # the good one before it, and nothing after


@pytest.mark.parametrize("method", METHODS)
async def test_the_auth_gate_answers_before_the_decode_guard(
    host_factory: Any, method: str
) -> None:
    host = await host_factory(_policy())
    with grpc.insecure_channel(host.grpc_address) as channel:
        with pytest.raises(grpc.RpcError) as exc:
            await _call(channel, method, [GARBAGE])
        err = _refusal(exc)
        assert err.code == grpc.StatusCode.UNAUTHENTICATED
        assert err.reason == Reason.MISSING_CREDENTIALS
        with pytest.raises(grpc.RpcError) as exc:
            await _call(channel, method, [GARBAGE], bearer_metadata(FLEET))
        _assert_undecodable(_refusal(exc))
    assert seen == []


async def test_every_service_of_the_host_is_guarded_health_included(host_factory: Any) -> None:
    host = await host_factory(None)
    async with grpc.aio.insecure_channel(host.grpc_address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=None,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await check(GARBAGE, timeout=5)
        err = _refusal(exc)
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.reason == Reason.INVALID_FIELD
        assert err.field_violations[0].description == (
            "not a valid grpc.health.v1.HealthCheckRequest"
        )
        ok = await check(health_pb2.HealthCheckRequest(service="liveness").SerializeToString())
        assert ok.status == health_pb2.HealthCheckResponse.SERVING


async def test_the_refusal_is_counted_like_any_other(host_factory: Any, wait_until: Any) -> None:
    host = await host_factory(None)
    with grpc.insecure_channel(host.grpc_address) as channel, pytest.raises(grpc.RpcError):
        await _call(channel, "Unary", [GARBAGE])
    labels = {"grpc_service": SERVICE, "grpc_method": "Unary", "grpc_type": "unary"}

    def handled(code: str) -> float | None:
        value: float | None = host.registry.get_sample_value(
            "grpc_server_handled_total", {**labels, "grpc_code": code}
        )
        return value

    # The client can read the status before the handler has returned through the interceptor.
    await wait_until(lambda: handled("InvalidArgument") == 1.0)
    assert handled("Unknown") is None


# -- the handler transformation, without a server -------------------------------------------


def test_a_handler_without_a_deserializer_is_left_alone() -> None:
    handler = grpc.unary_unary_rpc_method_handler(_unary)
    assert guard_handler("/a.B/C", handler) is handler


def test_the_guarded_deserializer_never_raises() -> None:
    handler = grpc.unary_unary_rpc_method_handler(_unary, request_deserializer=STRING.FromString)
    guarded = guard_handler(f"/{SERVICE}/Unary", handler)
    assert guarded.request_deserializer(GARBAGE) is UNDECODABLE
    assert guarded.request_deserializer(b"\x0a\x02ok") == STRING(value="ok")
    assert guarded.response_serializer is handler.response_serializer
    assert (guarded.request_streaming, guarded.response_streaming) == (False, False)


class _Context:
    """Just what :func:`common.errors.abort` uses of a context."""

    def __init__(self) -> None:
        self.aborted: list[tuple[Any, str]] = []

    def trailing_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: Any, message: str, trailers: Any) -> None:
        self.aborted.append((code, message))
        raise asyncio.CancelledError  # stands in for grpc's AbortError


@pytest.mark.parametrize(
    ("deserializer", "named"),
    [
        (STRING.FromString, "google.protobuf.StringValue"),  # the class it belongs to
        (lambda data: STRING.FromString(data), "halcyon.v1.GetStateRequest"),  # the method's
    ],
    ids=["generated", "hand-written"],
)
async def test_the_refusal_names_the_message_type(deserializer: Any, named: str) -> None:
    assert control_pb2.GetStateRequest.DESCRIPTOR.full_name  # its file is in the pool
    handler = grpc.unary_unary_rpc_method_handler(_unary, request_deserializer=deserializer)
    guarded = guard_handler("/halcyon.v1.ControlService/GetState", handler)
    context = _Context()
    with pytest.raises(asyncio.CancelledError):
        await guarded.unary_unary(UNDECODABLE, context)
    assert context.aborted == [
        (grpc.StatusCode.INVALID_ARGUMENT, f"invalid request: not a valid {named}")
    ]


async def test_each_method_is_guarded_once_and_reused() -> None:
    guard = DecodeGuard()
    handler = grpc.unary_unary_rpc_method_handler(_unary, request_deserializer=STRING.FromString)

    async def continuation(_details: Any) -> grpc.RpcMethodHandler:
        return handler

    class Details:
        method = f"/{SERVICE}/Unary"
        invocation_metadata = ()

    first = await guard.intercept_service(continuation, Details())
    assert first is not handler
    assert await guard.intercept_service(continuation, Details()) is first

    async def unknown(_details: Any) -> None:
        return None

    assert await guard.intercept_service(unknown, Details()) is None
