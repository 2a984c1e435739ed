"""A served call and a refused call each make one server span, the same on both transports
(issue #23): named after the method, with the RPC semantic conventions' attributes and the
status OpenTelemetry's gRPC conventions give a server span (an error only for the codes that
are the server's fault), as the instrumentation's grpc.aio interceptor makes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from contract_support import (
    EXECUTE_BATCH,
    FLEET,
    INFER,
    REPLICA_ID,
    Served,
    batch_request,
    infer_request,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from common.auth import bearer_metadata

pytestmark = pytest.mark.asyncio(loop_scope="module")

Spans = Callable[[str], list[ReadableSpan]]
# Where the call came from: the client's ephemeral port differs from call to call.
_PER_CALL = ("net.peer.port",)


async def _one_span(spans: Spans, name: str) -> ReadableSpan:
    """The one server span ``name`` (a server may end its span just after answering)."""
    for _ in range(100):
        if spans(name):
            break
        await asyncio.sleep(0.01)
    [span] = spans(name)
    return span


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return {k: v for k, v in (span.attributes or {}).items() if k not in _PER_CALL}


def _rpc(service: str, method: str, code: int) -> dict[str, Any]:
    return {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": method,
        "rpc.grpc.status_code": code,
        "net.peer.ip": "127.0.0.1",
        "net.peer.name": "localhost",
    }


def _user_agent(attributes: dict[str, Any]) -> dict[str, Any]:
    """The client's user agent, which both transports copy from the call's metadata."""
    agent = attributes.pop("rpc.user_agent", "")
    assert agent.startswith("grpc-python"), agent
    return attributes


async def test_a_served_infer_has_one_ok_span(gateway: Served, spans: Spans) -> None:
    await gateway.call(infer_request(), gateway.credential)
    span = await _one_span(spans, INFER)
    assert span.status.status_code == StatusCode.UNSET
    assert _user_agent(_attributes(span)) == {
        **_rpc("halcyon.v1.InferService", "Infer", 0),
        "halcyon.tenant": "premium",
        "halcyon.model": "llama-3-8b",
        "halcyon.version": "v1",
    }


async def test_a_refused_infer_has_one_span_with_its_code(gateway: Served, spans: Spans) -> None:
    await gateway.refusal(infer_request(), ())
    span = await _one_span(spans, INFER)
    assert span.status.status_code == StatusCode.UNSET  # UNAUTHENTICATED: the caller's fault
    assert _user_agent(_attributes(span)) == _rpc("halcyon.v1.InferService", "Infer", 16)


async def test_a_served_batch_has_one_ok_span(worker: Served, spans: Spans) -> None:
    await worker.call(batch_request(), bearer_metadata(FLEET))
    span = await _one_span(spans, EXECUTE_BATCH)
    assert span.status.status_code == StatusCode.UNSET
    attributes = _user_agent(_attributes(span))
    assert attributes.pop("halcyon.device_time_ms") > 0
    assert attributes == {
        **_rpc("halcyon.v1.WorkerService", "ExecuteBatch", 0),
        "halcyon.batch_id": "b1",
        "halcyon.replica_id": REPLICA_ID,
        "halcyon.model": "llama-3-8b",
        "halcyon.version": "v1",
        "halcyon.batch_size": 1,
        "halcyon.outcome": "ok",
        "halcyon.batch_tokens": 4,
    }


async def test_a_refused_batch_has_one_span_with_its_code(worker: Served, spans: Spans) -> None:
    await worker.refusal(batch_request(), ())
    span = await _one_span(spans, EXECUTE_BATCH)
    assert span.status.status_code == StatusCode.UNSET
    assert _user_agent(_attributes(span)) == _rpc("halcyon.v1.WorkerService", "ExecuteBatch", 16)
