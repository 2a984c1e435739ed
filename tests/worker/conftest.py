"""Fixtures for the worker tests: real WorkerApps on 127.0.0.1:0 and clients with stubs.

Helpers are handed out as fixtures so no test module imports a ``conftest`` by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.auth import bearer_metadata
from common.backoff import Backoff
from common.serving import ServingOptions
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from tests.support.waiting import wait_until_async
from worker.app import WorkerApp, WorkerConfig

FLEET = "test-fleet-token"
OPERATOR = "test-operator-token"


@dataclass
class RunningWorker:
    app: WorkerApp
    channel: grpc.aio.Channel
    stub: worker_pb2_grpc.WorkerServiceStub
    metadata: tuple[tuple[str, str], ...]

    def batch(self, *items: tuple[str, int, int], **kw: Any) -> worker_pb2.ExecuteBatchRequest:
        """A batch for this worker's model: items as (id, input_tokens, max_output_tokens)."""
        return worker_pb2.ExecuteBatchRequest(
            batch_id=kw.get("batch_id", "b1"),
            model=kw.get("model", self.app.config.model),
            version=kw.get("version", self.app.config.version),
            items=[
                worker_pb2.BatchItem(id=i, input=f"prompt {i}", input_tokens=t, max_output_tokens=o)
                for i, t, o in items
            ],
        )

    def execute(self, request: worker_pb2.ExecuteBatchRequest, **kw: Any) -> Any:
        kw.setdefault("metadata", self.metadata)
        return self.stub.ExecuteBatch(request, **kw)

    async def busy_slots(self) -> int:
        reply = await self.stub.Describe(worker_pb2.DescribeRequest(), metadata=self.metadata)
        return int(reply.load.busy_slots)


def worker_config(**overrides: Any) -> WorkerConfig:
    base = WorkerConfig(
        fleet_token=FLEET,
        operator_token=OPERATOR,
        jitter=0.0,
        intercept_ms=20.0,
        ms_per_token=0.01,
        reconnect=Backoff(initial_s=0.02, max_s=0.1),
        serving=ServingOptions(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", grace_s=1.0),
    )
    return dataclasses.replace(base, **overrides)


WorkerFactory = Callable[..., Awaitable[RunningWorker]]


@pytest.fixture
async def start_worker() -> AsyncIterator[WorkerFactory]:
    """Start WorkerApps (config overrides as keywords); stopped at teardown."""
    running: list[RunningWorker] = []

    async def start(*, tracer: Any = None, **overrides: Any) -> RunningWorker:
        app = WorkerApp(worker_config(**overrides), tracer=tracer)
        await app.start()
        channel = grpc.aio.insecure_channel(app.host.grpc_address)
        worker = RunningWorker(
            app, channel, worker_pb2_grpc.WorkerServiceStub(channel), bearer_metadata(FLEET)
        )
        running.append(worker)
        return worker

    yield start
    for worker in running:
        await worker.channel.close()
        await worker.app.stop()


@pytest.fixture(name="wait_until")
def wait_until_fixture() -> Callable[..., Awaitable[object]]:
    return wait_until_async


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(spans: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider


@pytest.fixture
def tokens() -> tuple[str, str]:
    return FLEET, OPERATOR
