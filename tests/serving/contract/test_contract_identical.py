"""Side by side: the same request gets the same answer, to the byte, from both transports.

The other contract tests hold each transport to a stated answer (code, reason, metadata). This
one sends each request to a fast-path server and to a grpc.aio server at once and compares
everything a client can read of the refusal: the ``google.rpc.Status`` (code, message, every
detail) and the retry pushback trailer. Wording included: clients log messages, and a
difference there is a second code path to keep in step (issue #23).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from contract_support import (
    FLEET,
    OPERATOR,
    TRANSPORTS,
    Served,
    batch_request,
    infer_request,
    pushback,
    start_running,
    tenant_key,
)
from google.rpc import status_pb2
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from common.auth import bearer_metadata
from common.errors import parse_rpc_error
from common.serving import MAX_RECEIVE_MESSAGE_BYTES
from halcyon.v1 import worker_pb2

pytestmark = pytest.mark.asyncio(loop_scope="module")

GARBAGE = b"\xff\xff\xff"
OVERSIZED_INFER = infer_request(input="x" * (128 * 1024 + 1))
OVER_RECEIVE_LIMIT = batch_request(
    items=[worker_pb2.BatchItem(id="a", input="x" * MAX_RECEIVE_MESSAGE_BYTES)]
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers(span_exporter: InMemorySpanExporter) -> AsyncIterator[dict[str, Served]]:
    """``"gateway/fast"``, ``"gateway/aio"``, ``"worker/fast"``, ``"worker/aio"``."""
    running = {
        f"{service}/{transport}": await start_running(service, transport)
        for service in ("gateway", "worker")
        for transport in TRANSPORTS
    }
    yield {name: r.served for name, r in running.items()}
    for r in running.values():
        await r.stop()


async def _answers(
    servers: dict[str, Served], service: str, payload: bytes, metadata: Any
) -> dict[str, tuple[status_pb2.Status, str | None]]:
    answers = {}
    for transport in TRANSPORTS:
        failure = await servers[f"{service}/{transport}"].failure(payload, metadata)
        answers[transport] = (parse_rpc_error(failure).to_proto(), pushback(failure))
    return answers


@pytest.mark.parametrize(
    ("payload", "metadata"),
    [
        pytest.param(infer_request(), (), id="no-credential"),
        pytest.param(infer_request(), tenant_key("not-a-key"), id="wrong-key"),
        pytest.param(infer_request(), tenant_key(FLEET), id="fleet-credential"),
        pytest.param(GARBAGE, tenant_key(), id="undecodable"),
        pytest.param(GARBAGE, (), id="undecodable-no-credential"),
        pytest.param(OVERSIZED_INFER, tenant_key(), id="oversized"),
        pytest.param(OVERSIZED_INFER, (), id="oversized-no-credential"),
        pytest.param(infer_request(input=""), tenant_key(), id="empty-input"),
        pytest.param(infer_request(max_output_tokens=5000), tenant_key(), id="too-many-tokens"),
        pytest.param(infer_request(model="no-such-model"), tenant_key(), id="unknown-model"),
    ],
)
async def test_infer_refusals_are_identical(
    servers: dict[str, Served], payload: bytes, metadata: Any
) -> None:
    answers = await _answers(servers, "gateway", payload, metadata)
    assert answers["fast"] == answers["aio"]


@pytest.mark.parametrize(
    ("payload", "metadata"),
    [
        pytest.param(batch_request(), (), id="no-credential"),
        pytest.param(batch_request(), bearer_metadata("guess"), id="wrong-credential"),
        pytest.param(batch_request(), bearer_metadata(OPERATOR), id="operator-credential"),
        pytest.param(GARBAGE, bearer_metadata(FLEET), id="undecodable"),
        pytest.param(GARBAGE, (), id="undecodable-no-credential"),
        pytest.param(OVER_RECEIVE_LIMIT, bearer_metadata(FLEET), id="over-the-receive-limit"),
        pytest.param(batch_request(items=[]), bearer_metadata(FLEET), id="no-items"),
        pytest.param(batch_request(model="other"), bearer_metadata(FLEET), id="wrong-model"),
    ],
)
async def test_execute_batch_refusals_are_identical(
    servers: dict[str, Served], payload: bytes, metadata: Any
) -> None:
    answers = await _answers(servers, "worker", payload, metadata)
    assert answers["fast"] == answers["aio"]
