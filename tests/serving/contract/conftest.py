"""Fixtures for the transport contract suite: one gateway and one worker per transport.

What it decides: that every contract test runs once over the completion-queue fast path and
once over ``grpc.aio`` (``transport``, ADR 0010), against real servers started in-process on
127.0.0.1:0 the way the gateway and worker suites start them (``GatewayApp`` / ``WorkerApp``
with their ``ServingOptions``), and that the tests see them only as a client does: raw bytes
in through a real channel, a status, trailers, ``/metrics`` samples and spans out.

Why one server per transport per module: starting a gateway and its worker costs ~0.2 s, and
the contract tests only read what servers answer; a test that disturbs its server (stops it,
breaks a handler) starts its own (``start_own``). The servers' event
loop is the module's (test modules say ``pytestmark = pytest.mark.asyncio(loop_scope=...)``).

Spans go to one in-memory exporter on the process's global tracer provider, installed before
any server is built: both transports take their tracer from there (the grpc.aio interceptor
and the fast path's hand-made spans), and OpenTelemetry lets a process set it only once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from contract_support import TRANSPORTS, Running, Served, start_running
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.spans import global_span_exporter


@pytest.fixture(scope="session")
def span_exporter() -> InMemorySpanExporter:
    """The process's one in-memory span exporter (``tests.support.spans``); tests read it by
    span name."""
    return global_span_exporter()


@pytest.fixture(scope="module", params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(transport: str, span_exporter: InMemorySpanExporter) -> AsyncIterator[Served]:
    """A gateway (with one worker behind it) on ``transport``, shared by the module's tests."""
    running = await start_running("gateway", transport)
    assert running.served.host.serving_path == transport
    yield running.served
    await running.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(transport: str, span_exporter: InMemorySpanExporter) -> AsyncIterator[Served]:
    """A worker on ``transport``, shared by the module's tests."""
    running = await start_running("worker", transport)
    assert running.served.host.serving_path == transport
    yield running.served
    await running.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def start_own(
    transport: str, span_exporter: InMemorySpanExporter
) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    """Start a server of one's own (``"gateway"`` or ``"worker"``, ServingOptions overrides as
    keywords) on ``transport``, for a test that disturbs it; stopped at teardown."""
    started: list[Running] = []

    async def start(service: str, **serving: Any) -> Running:
        running = await start_running(service, transport, **serving)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.stop()


@pytest.fixture
def spans(span_exporter: InMemorySpanExporter) -> Iterator[Callable[[str], list[ReadableSpan]]]:
    """Finished SERVER spans named ``name`` since the test began."""
    span_exporter.clear()

    def server_spans(name: str) -> list[ReadableSpan]:
        return [
            s
            for s in span_exporter.get_finished_spans()
            if s.name == name and s.kind == trace.SpanKind.SERVER
        ]

    yield server_spans
    span_exporter.clear()
