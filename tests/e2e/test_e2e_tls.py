"""TLS between real processes: server-only, mutual, and a rogue CA refused.

Controller, worker and gateway each run with ``--tls-cert/--tls-key`` (their certificate,
signed by a private CA made at test time) and ``--tls-ca`` (the CA they verify the servers
they call against). With ``--tls-client-ca`` added they also require client certificates.
Tenants are plain gRPC clients (and the real grpcurl) with or without a certificate.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from halcyon.v1 import infer_pb2, infer_pb2_grpc

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING


def _tls_flags(pki: Path, *, trust: str = "ca", mutual: bool = False) -> tuple[str, ...]:
    flags = ("--tls-cert", str(pki / "node.pem"), "--tls-key", str(pki / "node.key"))
    flags += ("--tls-ca", str(pki / f"{trust}.pem"))
    if mutual:
        flags += ("--tls-client-ca", str(pki / "ca.pem"))
    return flags


def _start(
    launch: Any, e2e: SimpleNamespace, pki: Path, *, mutual: bool, gateway_trust: str = "ca"
) -> SimpleNamespace:
    tls = _tls_flags(pki, mutual=mutual)
    controller = launch.controller(*tls)
    worker = launch.worker(controller, "replica-a", *e2e.INSTANT, *tls)
    gateway = launch.gateway(controller, *_tls_flags(pki, trust=gateway_trust, mutual=mutual))
    for proc in (worker, gateway):
        proc.wait_ready()
    return SimpleNamespace(controller=controller, worker=worker, gateway=gateway)


def _credentials(pki: Path, client: str | None = None) -> grpc.ChannelCredentials:
    """A tenant's TLS: trust the CA; present ``client``'s certificate if given."""
    return grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / f"{client}.key").read_bytes() if client else None,
        certificate_chain=(pki / f"{client}.pem").read_bytes() if client else None,
    )


def _ready(address: str, credentials: grpc.ChannelCredentials) -> bool:
    with grpc.secure_channel(address, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=2
        )
    return bool(reply.status == SERVING)


def _infer(address: str, credentials: grpc.ChannelCredentials, key: str) -> infer_pb2.InferResponse:
    with grpc.secure_channel(address, credentials) as channel:
        return infer_pb2_grpc.InferServiceStub(channel).Infer(
            infer_pb2.InferRequest(model="llama-3-8b", input="over tls"),
            metadata=(("x-api-key", key),),
            timeout=5,
        )


def _refused(call: Any) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_server_only_tls_with_a_private_ca(launch: Any, e2e: SimpleNamespace, pki: Path) -> None:
    procs = _start(launch, e2e, pki, mutual=False)
    address = procs.gateway.grpc
    tenant = _credentials(pki)  # no client certificate
    # The gateway verified the controller and the worker against the private CA: it is ready.
    e2e.wait_for(lambda: _ready(address, tenant), 30, "gateway ready over TLS", watch=(
        procs.controller, procs.worker, procs.gateway))  # fmt: skip
    reply = _infer(address, tenant, e2e.API_KEY)
    assert reply.replica_id == "replica-a"
    # The real grpcurl, verifying with the CA and presenting nothing.
    out = subprocess.run(
        [e2e.GRPCURL, "-cacert", str(pki / "ca.pem"), "-max-time", "10",
         "-H", f"x-api-key: {e2e.API_KEY}", "-d", '{"model":"llama-3-8b","input":"hi"}',
         address, "halcyon.v1.InferService/Infer"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["replica_id"] == "replica-a"
    # Plaintext is not served.
    with grpc.insecure_channel(address) as channel:
        _refused(
            lambda: health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="readiness"), timeout=2
            )
        )


def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    launch: Any, e2e: SimpleNamespace, pki: Path
) -> None:
    procs = _start(launch, e2e, pki, mutual=True)
    address = procs.gateway.grpc
    tenant = _credentials(pki, "tenant")
    # Gateway -> controller and gateway -> worker present the node certificate: accepted.
    e2e.wait_for(lambda: _ready(address, tenant), 30, "gateway ready over mTLS", watch=(
        procs.controller, procs.worker, procs.gateway))  # fmt: skip
    assert _infer(address, tenant, e2e.API_KEY).replica_id == "replica-a"
    _refused(lambda: _infer(address, _credentials(pki), e2e.API_KEY))  # no certificate
    _refused(lambda: _infer(address, _credentials(pki, "rogue-tenant"), e2e.API_KEY))


def test_a_controller_the_gateway_cannot_verify_is_refused(
    launch: Any, e2e: SimpleNamespace, pki: Path
) -> None:
    # The gateway trusts only the rogue CA, so the real controller (signed by the fleet's CA)
    # looks exactly like a rogue controller would to a correctly configured gateway.
    procs = _start(launch, e2e, pki, mutual=False, gateway_trust="rogue-ca")
    tenant = _credentials(pki)
    watch = (procs.controller, procs.worker, procs.gateway)
    # The worker (trusting the right CA) registers; the gateway never learns the fleet.
    e2e.wait_for(
        lambda: e2e.sample(e2e.scrape(procs.worker), "halcyon_worker_controller_connected") == 1,
        30,
        "the worker to register over TLS",
        watch=watch,
    )
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert not _ready(procs.gateway.grpc, tenant)
        metrics = e2e.scrape(procs.gateway)
        assert e2e.sample(metrics, "halcyon_gateway_controller_connected") == 0
        assert e2e.sample(metrics, "halcyon_gateway_fleet_replicas") == 0
        time.sleep(0.5)
    err = e2e.rich_error(lambda: _infer(procs.gateway.grpc, tenant, e2e.API_KEY))
    assert err.code == grpc.StatusCode.UNAVAILABLE and err.reason == "NO_CAPACITY"
