"""TLS and mTLS on a ServiceHost, with throwaway certificates made by the openssl CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.serving import ServingOptions, TlsOptions

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI missing")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _leaf(name: str, d: Path, ext: str) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=d)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr", cwd=d
    )
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        f"{name}.pem",
        "-extfile",
        f"{name}.ext",
        cwd=d,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=halcyon-test-ca",
        "-days",
        "1",
        "-out",
        "ca.pem",
        cwd=d,
    )
    _leaf("server", d, "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _leaf("client", d, "extendedKeyUsage=clientAuth\n")
    return d


async def _check(address: str, credentials: grpc.ChannelCredentials) -> int:
    async with grpc.aio.secure_channel(address, credentials) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=5
        )
        return int(reply.status)


async def test_mtls_accepts_a_signed_client_and_refuses_others(make_host: Any, pki: Path) -> None:
    server_tls = TlsOptions(pki / "server.pem", pki / "server.key", client_ca=pki / "ca.pem")
    host = await make_host(options=ServingOptions(tls=server_tls, metrics_listen=None))
    client = TlsOptions(pki / "client.pem", pki / "client.key", ca=pki / "ca.pem")
    assert await _check(host.grpc_address, client.channel_credentials()) == (
        health_pb2.HealthCheckResponse.SERVING
    )
    no_client_cert = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _check(host.grpc_address, no_client_cert)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.insecure_channel(host.grpc_address) as plaintext:
        with pytest.raises(grpc.aio.AioRpcError):
            await health_pb2_grpc.HealthStub(plaintext).Check(
                health_pb2.HealthCheckRequest(service="liveness"), timeout=5
            )


async def test_server_only_tls(make_host: Any, pki: Path) -> None:
    host = await make_host(
        options=ServingOptions(
            tls=TlsOptions(pki / "server.pem", pki / "server.key"), metrics_listen=None
        )
    )
    creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    assert await _check(host.grpc_address, creds) == health_pb2.HealthCheckResponse.SERVING
