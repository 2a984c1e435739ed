"""Health answers undecodable bytes with a typed INVALID_ARGUMENT, on the main port and on the
``--health-listen`` probe port alike, whichever transport serves the hot method (issue #23).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from contract_support import Running
from grpc_health.v1 import health_pb2

from common.errors import DOMAIN, Reason, parse_rpc_error

pytestmark = pytest.mark.asyncio(loop_scope="module")

GARBAGE = b"\xff\xff\xff"
CHECK = "/grpc.health.v1.Health/Check"


async def _check(address: str, payload: bytes) -> Any:
    async with grpc.aio.insecure_channel(address) as channel:
        check = channel.unary_unary(
            CHECK,
            request_serializer=None,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        return await check(payload, timeout=5.0)


@pytest.mark.parametrize(
    "port",
    [
        "main-port",
        "probe-port",
    ],
)
async def test_undecodable_health_checks_are_invalid_argument(
    start_own: Callable[..., Awaitable[Running]], port: str
) -> None:
    running = await start_own("worker", health_listen="127.0.0.1:0")
    host = running.served.host
    address = host.grpc_address if port == "main-port" else host.health_address
    assert address is not None
    liveness = health_pb2.HealthCheckRequest(service="liveness").SerializeToString()
    assert (await _check(address, liveness)).status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _check(address, GARBAGE)
    err = parse_rpc_error(info.value)
    assert (err.code, err.reason, err.domain) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.INVALID_FIELD,
        DOMAIN,
    )
    assert [(v.field, v.description) for v in err.field_violations] == [
        ("request", "not a valid grpc.health.v1.HealthCheckRequest")
    ]
    assert (await _check(address, liveness)).status == health_pb2.HealthCheckResponse.SERVING
