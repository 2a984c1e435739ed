"""What the contract tests share: the servers they start and how a client talks to them.

What it decides: the one way this suite starts a gateway (with a worker behind it) or a worker on
a given transport -- in-process on 127.0.0.1:0, as the gateway and worker suites do, with the
serving path set in ``ServingOptions`` -- and the client's view of either: raw request bytes
sent with identity serializers through a real channel, the typed error rebuilt from the status
and trailers (:func:`common.errors.parse_rpc_error`), and the method's ``grpc_server_*``
samples as the host's registry (its ``/metrics``) shows them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest

from common.auth import bearer_metadata
from common.backoff import Backoff
from common.errors import PUSHBACK_KEY, RichError, parse_rpc_error
from common.serving import ServiceHost, ServingOptions
from gateway.admission import TenantRegistry
from gateway.app import GatewayApp, GatewayConfig
from halcyon.v1 import control_pb2, infer_pb2, worker_pb2
from worker.app import WorkerApp, WorkerConfig

TRANSPORTS = ("fast", "aio")
FLEET = "contract-fleet-token"
OPERATOR = "contract-operator-token"
MODEL = "llama-3-8b"
REPLICA_ID = "contract-worker"
TENANT_KEY = "demo-key-premium"  # TenantRegistry.demo()'s largest quota: no test runs it dry
INFER = "/halcyon.v1.InferService/Infer"
EXECUTE_BATCH = "/halcyon.v1.WorkerService/ExecuteBatch"

Metadata = tuple[tuple[str, str], ...]


def _identity(data: bytes) -> bytes:
    return data


@dataclass
class Served:
    """One started server and its hot method, seen from a client: bytes in, an answer out."""

    method: str
    host: ServiceHost
    channel: grpc.aio.Channel
    credential: Metadata  # what an authorized caller of ``method`` sends

    async def call(
        self, payload: bytes, metadata: Iterable[tuple[str, str]] = (), deadline_s: float = 10.0
    ) -> bytes:
        """``payload`` sent as it is (identity serializers): the response's bytes."""
        send = self.channel.unary_unary(
            self.method, request_serializer=_identity, response_deserializer=_identity
        )
        reply: bytes = await send(payload, metadata=tuple(metadata), timeout=deadline_s)
        return reply

    async def failure(
        self, payload: bytes, metadata: Iterable[tuple[str, str]] = (), deadline_s: float = 10.0
    ) -> grpc.aio.AioRpcError:
        """The error of a call that must fail, as the client has it (status and trailers)."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await self.call(payload, metadata, deadline_s)
        return info.value

    async def refusal(
        self, payload: bytes, metadata: Iterable[tuple[str, str]] = (), deadline_s: float = 10.0
    ) -> RichError:
        """The typed error a call that must fail gets (its code, ErrorInfo, RetryInfo ...)."""
        return parse_rpc_error(await self.failure(payload, metadata, deadline_s))

    def samples(self, prefix: str = "grpc_server_") -> dict[tuple[str, frozenset[Any]], float]:
        """Every ``prefix*`` sample of this server's method in its registry (what ``/metrics``
        shows), keyed by sample name and labels other than service and method."""
        service, _, name = self.method.lstrip("/").partition("/")
        found: dict[tuple[str, frozenset[Any]], float] = {}
        for family in self.host.registry.collect():
            for s in family.samples:
                labels = dict(s.labels)
                if not s.name.startswith(prefix) or labels.pop("grpc_service", None) != service:
                    continue
                if labels.pop("grpc_method", None) == name:
                    found[(s.name, frozenset(labels.items()))] = s.value
        return found


def pushback(error: grpc.aio.AioRpcError) -> str | None:
    """The ``grpc-retry-pushback-ms`` trailer (gRFC A6) of a failed call, if it has one."""
    for key, value in error.trailing_metadata() or ():
        if key == PUSHBACK_KEY:
            return str(value)
    return None


def tenant_key(key: str = TENANT_KEY) -> Metadata:
    return (("x-api-key", key),)


def infer_request(**fields: Any) -> bytes:
    fields.setdefault("model", MODEL)
    fields.setdefault("input", "hello world")
    fields.setdefault("max_output_tokens", 8)
    return infer_pb2.InferRequest(**fields).SerializeToString()


def batch_request(**fields: Any) -> bytes:
    fields.setdefault("batch_id", "b1")
    fields.setdefault("model", MODEL)
    fields.setdefault("version", "v1")
    fields.setdefault(
        "items", [worker_pb2.BatchItem(id="a", input="hi", input_tokens=2, max_output_tokens=2)]
    )
    return worker_pb2.ExecuteBatchRequest(**fields).SerializeToString()


def _serving(transport: str, **overrides: Any) -> ServingOptions:
    options = ServingOptions(
        listen="127.0.0.1:0", metrics_listen=None, grace_s=1.0, serving_path=transport
    )
    return dataclasses.replace(options, **overrides)


def _worker_config(transport: str, **serving: Any) -> WorkerConfig:
    """A fast, deterministic worker (as the gateway and worker suites build theirs)."""
    return WorkerConfig(
        fleet_token=FLEET,
        operator_token=OPERATOR,
        model=MODEL,
        version="v1",
        # Named, not worker-<port>: answers that name the replica are the same on every server.
        replica_id=REPLICA_ID,
        jitter=0.0,
        intercept_ms=1.0,
        ms_per_token=0.01,
        reconnect=Backoff(initial_s=0.02, max_s=0.1),
        serving=_serving(transport, **serving),
    )


def _fleet(worker: WorkerApp) -> control_pb2.WatchFleetResponse:
    """The snapshot a controller would send for ``worker`` alone (stable on its version)."""
    assert worker.identity is not None
    return control_pb2.WatchFleetResponse(
        generation=1,
        replicas=[control_pb2.FleetMember(replica=worker.identity.to_proto())],
        routing=[control_pb2.ModelRouting(model=MODEL, stable_version="v1")],
    )


async def _start_worker(transport: str, **serving: Any) -> tuple[WorkerApp, Served]:
    app = WorkerApp(_worker_config(transport, **serving))
    await app.start()
    channel = grpc.aio.insecure_channel(app.host.grpc_address)
    served = Served(EXECUTE_BATCH, app.host, channel, bearer_metadata(FLEET))
    return app, served


async def _start_gateway(transport: str, **serving: Any) -> tuple[GatewayApp, WorkerApp, Served]:
    worker, worker_served = await _start_worker(transport)
    await worker_served.channel.close()
    config = GatewayConfig(
        fleet_token=FLEET,
        operator_token=OPERATOR,
        seed=7,
        tenants=TenantRegistry.demo(),
        # A controller nobody answers: the fleet comes from the snapshot below.
        controller="127.0.0.1:1",
        serving=_serving(transport, **serving),
    )
    app = GatewayApp(config)
    await app.start()
    app.apply_snapshot(_fleet(worker))
    channel = grpc.aio.insecure_channel(app.host.grpc_address)
    return app, worker, Served(INFER, app.host, channel, tenant_key())


@dataclass
class Running:
    """A started gateway (with its worker) or worker, and how to stop it."""

    served: Served
    app: GatewayApp | WorkerApp
    behind: WorkerApp | None = None  # the gateway's worker

    async def stop(self) -> None:
        await self.served.channel.close()
        if isinstance(self.app, GatewayApp):
            with contextlib.suppress(Exception):
                await self.app.shutdown(grace_s=0.1)
            await self.app.host.stop(0)
        else:
            await self.app.stop()
        if self.behind is not None:
            await self.behind.stop()


async def start_running(service: str, transport: str, **serving: Any) -> Running:
    if service == "gateway":
        gateway, worker, served = await _start_gateway(transport, **serving)
        return Running(served, gateway, worker)
    app, served = await _start_worker(transport, **serving)
    return Running(served, app)
