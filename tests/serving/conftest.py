"""Fixtures for the serving tests: a ServiceHost with a generic test service of all four kinds.

Helpers are handed out as fixtures (``wait_until``, ``echo``) rather than imported, so test
modules never import a ``conftest`` by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest

from common.auth import AuthPolicy, Role
from common.serving import ServiceHost, ServingOptions
from tests.support.waiting import wait_until_async

TEST_SERVICE = "halcyon.test.Echo"
FLEET = "fleet-secret"
OPERATOR = "operator-secret"


def _identity(x: bytes) -> bytes:
    return x


async def _unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """b"ok" -> echo; b"abort" -> RESOURCE_EXHAUSTED via abort; b"setcode" -> NOT_FOUND via
    set_code; b"boom" -> an exception; b"slow" -> waits forever (to be cancelled)."""
    if request == b"abort":
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
    if request == b"setcode":
        context.set_code(grpc.StatusCode.NOT_FOUND)
        context.set_details("nope")
        return b""
    if request == b"boom":
        raise ValueError("boom")
    if request == b"slow":
        await asyncio.Event().wait()
    return request


async def _server_stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for i in range(3):
        yield request + bytes([48 + i])
    if request == b"abort":
        await context.abort(grpc.StatusCode.UNAVAILABLE, "gone")


async def _client_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> bytes:
    parts = [r async for r in requests]
    return b"".join(parts)


async def _bidi(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for r in requests:
        yield r.upper()


def echo_handler() -> grpc.GenericRpcHandler:
    kw: dict[str, Any] = {"request_deserializer": _identity, "response_serializer": _identity}
    return grpc.method_handlers_generic_handler(
        TEST_SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary, **kw),
            "ServerStream": grpc.unary_stream_rpc_method_handler(_server_stream, **kw),
            "ClientStream": grpc.stream_unary_rpc_method_handler(_client_stream, **kw),
            "Bidi": grpc.stream_stream_rpc_method_handler(_bidi, **kw),
            "OperatorOnly": grpc.unary_unary_rpc_method_handler(_unary, **kw),
        },
    )


def register_echo(_servicer: Any, server: grpc.aio.Server) -> None:
    server.add_generic_rpc_handlers((echo_handler(),))


def echo_policy() -> AuthPolicy:
    return AuthPolicy(
        fleet_token=FLEET,
        operator_token=OPERATOR,
        rules={
            f"/{TEST_SERVICE}/Unary": Role.FLEET,
            f"/{TEST_SERVICE}/ServerStream": Role.FLEET,
            f"/{TEST_SERVICE}/ClientStream": Role.FLEET,
            f"/{TEST_SERVICE}/Bidi": Role.FLEET,
            f"/{TEST_SERVICE}/OperatorOnly": Role.OPERATOR,
        },
    )


HostFactory = Callable[..., Awaitable[ServiceHost]]


@pytest.fixture
async def make_host() -> AsyncIterator[HostFactory]:
    """Start ServiceHosts on 127.0.0.1:0 serving the echo service; stopped at teardown."""
    hosts: list[ServiceHost] = []

    async def make(
        *, auth: AuthPolicy | None = None, options: ServingOptions | None = None
    ) -> ServiceHost:
        host = ServiceHost("test", options or ServingOptions(), auth)
        host.add_service(register_echo, None, TEST_SERVICE)
        await host.start()
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        await host.stop(0)


def unary(channel: grpc.aio.Channel, method: str = "Unary") -> Any:
    return channel.unary_unary(
        f"/{TEST_SERVICE}/{method}", request_serializer=_identity, response_deserializer=_identity
    )


def server_stream(channel: grpc.aio.Channel) -> Any:
    return channel.unary_stream(
        f"/{TEST_SERVICE}/ServerStream",
        request_serializer=_identity,
        response_deserializer=_identity,
    )


def client_stream(channel: grpc.aio.Channel) -> Any:
    return channel.stream_unary(
        f"/{TEST_SERVICE}/ClientStream",
        request_serializer=_identity,
        response_deserializer=_identity,
    )


def bidi(channel: grpc.aio.Channel) -> Any:
    return channel.stream_stream(
        f"/{TEST_SERVICE}/Bidi", request_serializer=_identity, response_deserializer=_identity
    )


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Awaitable[object]]:
    return wait_until_async


@pytest.fixture
def echo() -> SimpleNamespace:
    """Client-side callables for the echo service and its credentials."""
    return SimpleNamespace(
        service=TEST_SERVICE,
        fleet=FLEET,
        operator=OPERATOR,
        policy=echo_policy,
        unary=unary,
        server_stream=server_stream,
        client_stream=client_stream,
        bidi=bidi,
    )
