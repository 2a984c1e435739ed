"""TLS and mTLS on a ServiceHost, with the throwaway PKI of ``tests/conftest.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.serving import ServingOptions, TlsOptions


async def _check(address: str, credentials: grpc.ChannelCredentials) -> int:
    async with grpc.aio.secure_channel(address, credentials) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=5
        )
        return int(reply.status)


async def _refused(address: str, credentials: grpc.ChannelCredentials) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _check(address, credentials)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mtls_accepts_a_signed_client_and_refuses_others(make_host: Any, pki: Path) -> None:
    server_tls = TlsOptions(pki / "node.pem", pki / "node.key", client_ca=pki / "ca.pem")
    host = await make_host(options=ServingOptions(tls=server_tls, metrics_listen=None))
    client = TlsOptions(pki / "tenant.pem", pki / "tenant.key", ca=pki / "ca.pem")
    assert await _check(host.grpc_address, client.channel_credentials()) == (
        health_pb2.HealthCheckResponse.SERVING
    )
    no_client_cert = TlsOptions(None, None, ca=pki / "ca.pem")
    await _refused(host.grpc_address, no_client_cert.channel_credentials())
    rogue_client = TlsOptions(pki / "rogue-tenant.pem", pki / "rogue-tenant.key", ca=pki / "ca.pem")
    await _refused(host.grpc_address, rogue_client.channel_credentials())
    async with grpc.aio.insecure_channel(host.grpc_address) as plaintext:
        with pytest.raises(grpc.aio.AioRpcError):
            await health_pb2_grpc.HealthStub(plaintext).Check(
                health_pb2.HealthCheckRequest(service="liveness"), timeout=5
            )


async def test_server_only_tls_needs_no_client_certificate(make_host: Any, pki: Path) -> None:
    host = await make_host(
        options=ServingOptions(
            tls=TlsOptions(pki / "node.pem", pki / "node.key"), metrics_listen=None
        )
    )
    creds = TlsOptions(None, None, ca=pki / "ca.pem").channel_credentials()
    assert await _check(host.grpc_address, creds) == health_pb2.HealthCheckResponse.SERVING


async def test_a_server_signed_by_a_rogue_ca_is_refused(make_host: Any, pki: Path) -> None:
    host = await make_host(
        options=ServingOptions(
            tls=TlsOptions(pki / "rogue-node.pem", pki / "rogue-node.key"), metrics_listen=None
        )
    )
    trusting_ca = TlsOptions(None, None, ca=pki / "ca.pem")
    await _refused(host.grpc_address, trusting_ca.channel_credentials())


def test_serving_tls_needs_a_certificate() -> None:
    with pytest.raises(ValueError, match="certificate"):
        TlsOptions(None, None, ca=Path("ca.pem")).server_credentials()
