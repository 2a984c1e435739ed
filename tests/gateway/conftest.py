"""Fixtures for the gateway integration tests: a real GatewayApp and real WorkerApps on
127.0.0.1:0 in the test's event loop, a real aio client, and the fleet given by hand-built
controller snapshots (``apply_snapshot``) instead of a running controller.

Helpers are handed out as fixtures (``start_gateway``, ``start_worker``, ``wait_until``,
``span_exporter``) so test modules never import a ``conftest`` by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.backoff import Backoff
from common.errors import RichError, parse_rpc_error
from common.serving import ServingOptions
from gateway.admission import TenantRegistry
from gateway.app import GatewayApp, GatewayConfig
from halcyon.v1 import control_pb2, fleet_pb2, infer_pb2, infer_pb2_grpc
from tests.support.spans import global_span_exporter
from tests.support.waiting import wait_until_async
from worker.app import WorkerApp, WorkerConfig

FLEET = "gateway-test-fleet-token"
OPERATOR = "gateway-test-operator-token"
MODEL = "llama-3-8b"
STANDARD_KEY = "demo-key-standard"

# (stable, canary, canary weight in basis points) per model
Routing = Mapping[str, tuple[str, str, int]]


def worker_config(**overrides: Any) -> WorkerConfig:
    """A fast, deterministic worker: 20 ms + 0.01 ms/token, no jitter, one slot."""
    base = WorkerConfig(
        fleet_token=FLEET,
        operator_token=OPERATOR,
        model=MODEL,
        version="v1",
        jitter=0.0,
        intercept_ms=20.0,
        ms_per_token=0.01,
        reconnect=Backoff(initial_s=0.02, max_s=0.1),
        serving=ServingOptions(listen="127.0.0.1:0", metrics_listen=None, grace_s=1.0),
    )
    return dataclasses.replace(base, **overrides)


def member(worker: WorkerApp, *, draining: bool = False) -> control_pb2.FleetMember:
    """The fleet entry the controller would send for ``worker``."""
    assert worker.identity is not None, "start the worker first"
    ident = worker.identity
    return control_pb2.FleetMember(
        replica=fleet_pb2.ReplicaDescriptor(
            replica_id=ident.replica_id,
            address=ident.address,
            model=ident.model,
            version=ident.version,
            hardware=ident.hardware,
            slots=ident.slots,
            speed=ident.speed,
        ),
        load=fleet_pb2.ReplicaLoad(draining=draining),
    )


@dataclass
class RunningGateway:
    """A started gateway, a client stub on it, and a way to feed it fleet snapshots."""

    app: GatewayApp
    channel: grpc.aio.Channel
    stub: infer_pb2_grpc.InferServiceStub
    generation: int = 0
    stopped: bool = False
    _health: health_pb2_grpc.HealthStub | None = field(default=None, repr=False)

    def apply(
        self,
        workers: Collection[WorkerApp],
        *,
        routing: Routing | None = None,
        draining: Collection[str] = (),
        replicas: Collection[control_pb2.FleetMember] = (),
    ) -> control_pb2.WatchFleetResponse:
        """Push a snapshot of ``workers`` (ids in ``draining`` marked draining).

        ``routing`` defaults to every (model) stable on the lowest version among the workers.
        """
        if routing is None:
            stable: dict[str, str] = {}
            for w in workers:
                cfg = w.config
                stable[cfg.model] = min(stable.get(cfg.model, cfg.version), cfg.version)
            routing = {m: (v, "", 0) for m, v in stable.items()}
        self.generation += 1
        snapshot = control_pb2.WatchFleetResponse(
            generation=self.generation,
            replicas=[
                *(
                    member(w, draining=w.identity is not None and w.identity.replica_id in draining)
                    for w in workers
                ),
                *replicas,
            ],
            routing=[
                control_pb2.ModelRouting(
                    model=m, stable_version=s, canary_version=c, canary_weight_bp=bp
                )
                for m, (s, c, bp) in routing.items()
            ],
        )
        self.app.apply_snapshot(snapshot)
        return snapshot

    def request(self, text: str = "hello world", **fields: Any) -> infer_pb2.InferRequest:
        fields.setdefault("model", MODEL)
        fields.setdefault("max_output_tokens", 16)
        return infer_pb2.InferRequest(input=text, **fields)

    async def infer(
        self,
        request: infer_pb2.InferRequest | None = None,
        *,
        key: str | None = STANDARD_KEY,
        deadline_s: float | None = 10.0,
        **fields: Any,
    ) -> infer_pb2.InferResponse:
        """One Infer call (``request`` or one built from ``fields``) with the tenant ``key``.

        ``deadline_s`` is the gRPC deadline; ``timeout=`` among ``fields`` is the proto field.
        """
        req = request if request is not None else self.request(**fields)
        metadata = (("x-api-key", key),) if key is not None else ()
        return await self.stub.Infer(req, metadata=metadata, timeout=deadline_s)

    async def infer_error(
        self, request: infer_pb2.InferRequest | None = None, **kw: Any
    ) -> RichError:
        """An Infer call that must fail; its rich error."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await self.infer(request, **kw)
        return parse_rpc_error(info.value)

    async def readiness(self) -> int:
        if self._health is None:
            self._health = health_pb2_grpc.HealthStub(self.channel)
        reply = await self._health.Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=5.0
        )
        return int(reply.status)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of the samples ``name`` in the gateway's registry whose labels include
        ``labels`` (0.0 when there are none): ``{"outcome": "ok"}`` adds up every tenant,
        model and version."""
        want = (labels or {}).items()
        return sum(
            s.value
            for family in self.app.host.registry.collect()
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in want)
        )

    async def stop(self) -> None:
        """Shut down (idempotent): drain the gateway, close the client, stop the server."""
        if self.stopped:
            return
        self.stopped = True
        with contextlib.suppress(Exception):
            await self.app.shutdown(grace_s=1.0)
        await self.channel.close()
        await self.app.host.stop(0)


GatewayFactory = Callable[..., Awaitable[RunningGateway]]
WorkerFactory = Callable[..., Awaitable[WorkerApp]]


@pytest.fixture
async def start_worker() -> AsyncIterator[WorkerFactory]:
    """Start WorkerApps (``WorkerConfig`` overrides as keywords); stopped at teardown."""
    running: list[WorkerApp] = []

    async def start(**overrides: Any) -> WorkerApp:
        app = WorkerApp(worker_config(**overrides))
        await app.start()
        running.append(app)
        return app

    yield start
    for app in running:
        await app.stop()


@pytest.fixture
async def start_gateway() -> AsyncIterator[GatewayFactory]:
    """Start GatewayApps (``GatewayConfig`` overrides as keywords); stopped at teardown."""
    running: list[RunningGateway] = []

    async def start(*, metrics: bool = False, **overrides: Any) -> RunningGateway:
        overrides.setdefault("tenants", TenantRegistry.demo())
        # A controller nobody answers: the gateway gets its fleet from ``apply`` below, and its
        # retry advice comes from the (failing) resubscription schedule, as in production.
        overrides.setdefault("controller", "127.0.0.1:1")
        overrides.setdefault(
            "serving",
            ServingOptions(
                listen="127.0.0.1:0",
                metrics_listen="127.0.0.1:0" if metrics else None,
                grace_s=1.0,
            ),
        )
        config = GatewayConfig(fleet_token=FLEET, seed=7, **overrides)
        app = GatewayApp(config)
        await app.start()
        channel = grpc.aio.insecure_channel(app.host.grpc_address)
        gw = RunningGateway(app, channel, infer_pb2_grpc.InferServiceStub(channel))
        running.append(gw)
        return gw

    yield start
    for gw in running:
        await gw.stop()


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Awaitable[object]]:
    return wait_until_async


@pytest.fixture(scope="session")
def _session_span_exporter() -> InMemorySpanExporter:
    """The process's one in-memory span exporter (``tests.support.spans``): the gateway takes
    its tracers from the global provider."""
    return global_span_exporter()


@pytest.fixture
def span_exporter(_session_span_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """The global exporter, empty at the start of the test and cleared after it."""
    _session_span_exporter.clear()
    yield _session_span_exporter
    _session_span_exporter.clear()
