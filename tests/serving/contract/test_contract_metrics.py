"""The hot methods' ``grpc_server_*`` samples are the same on both transports (issue #23).

After one known sequence of calls (one served, the rest refused for different reasons), the
growth of every ``grpc_server_*`` sample of the method -- started, handled by code, messages
received and sent, the handling-time histogram's count -- must be exactly what a
go-grpc-prometheus dashboard expects, whichever transport served the calls: every unary call
received one message, only a served one sent one. (The histogram's buckets below ``+Inf`` and
its sum depend on timing and are compared only for consistency.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from contract_support import FLEET, OPERATOR, Served, batch_request, infer_request, tenant_key
from prometheus_client.parser import text_string_to_metric_families

from common.auth import bearer_metadata

pytestmark = pytest.mark.asyncio(loop_scope="module")

GARBAGE = b"\xff\xff\xff"
Sample = tuple[str, frozenset[Any]]


def _growth(before: dict[Sample, float], after: dict[Sample, float]) -> dict[Sample, float]:
    """Samples that grew, by how much; timestamps and the timing-dependent histogram parts
    left out."""
    grown: dict[Sample, float] = {}
    for key, value in after.items():
        name, labels = key
        if name == "grpc_server_handling_seconds_sum" or name.endswith("_created"):
            continue  # timing, and when each child was first made
        if name == "grpc_server_handling_seconds_bucket" and ("le", "+Inf") not in labels:
            continue
        delta = value - before.get(key, 0.0)
        if delta:
            grown[key] = delta
    return grown


def _expected(calls: int, codes: dict[str, int]) -> dict[Sample, float]:
    unary = frozenset({("grpc_type", "unary")})
    expected: dict[Sample, float] = {
        ("grpc_server_started_total", unary): calls,
        ("grpc_server_msg_received_total", unary): calls,
        ("grpc_server_handling_seconds_count", unary): calls,
        ("grpc_server_handling_seconds_bucket", unary | {("le", "+Inf")}): calls,
    }
    if codes.get("OK"):
        expected[("grpc_server_msg_sent_total", unary)] = codes["OK"]
    for code, n in codes.items():
        expected[("grpc_server_handled_total", unary | {("grpc_code", code)})] = n
    return expected


async def _run(served: Served, calls: list[tuple[bytes, Any]]) -> dict[Sample, float]:
    """Make ``calls`` one after the other; the samples' growth once every call is counted
    (grpc.aio may count a call just after its client has the answer)."""
    before = served.samples()
    for payload, metadata in calls:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await served.call(payload, metadata)
    give_up = time.monotonic() + 5.0
    while True:
        grown = _growth(before, served.samples())
        count = grown.get(
            ("grpc_server_handling_seconds_count", frozenset({("grpc_type", "unary")}))
        )
        if count == len(calls) or time.monotonic() > give_up:
            return grown
        await asyncio.sleep(0.01)


async def test_infer_is_counted_the_same(gateway: Served) -> None:
    grown = await _run(
        gateway,
        [
            (infer_request(), tenant_key()),
            (infer_request(), ()),
            (infer_request(), tenant_key("not-a-key")),
            (GARBAGE, tenant_key()),
            (infer_request(input=""), tenant_key()),
            (infer_request(model="no-such-model"), tenant_key()),
        ],
    )
    codes = {"OK": 1, "Unauthenticated": 2, "InvalidArgument": 2, "NotFound": 1}
    assert grown == _expected(6, codes)


async def test_execute_batch_is_counted_the_same(worker: Served) -> None:
    grown = await _run(
        worker,
        [
            (batch_request(), bearer_metadata(FLEET)),
            (batch_request(), ()),
            (batch_request(), bearer_metadata(OPERATOR)),
            (GARBAGE, bearer_metadata(FLEET)),
            (batch_request(items=[]), bearer_metadata(FLEET)),
        ],
    )
    codes = {"OK": 1, "Unauthenticated": 1, "PermissionDenied": 1, "InvalidArgument": 2}
    assert grown == _expected(5, codes)


async def test_metrics_serves_the_samples_the_registry_holds(
    start_own: Callable[..., Awaitable[Any]],
) -> None:
    """The samples above are read from the host's registry: ``/metrics`` serves the same."""
    running = await start_own("worker", metrics_listen="127.0.0.1:0")
    served = running.served
    await _run(served, [(batch_request(), bearer_metadata(FLEET)), (batch_request(), ())])
    text = await asyncio.to_thread(_scrape, f"http://{served.host.metrics_address}/metrics")
    scraped = {
        (s.name, frozenset((k, v) for k, v in s.labels.items() if k not in _METHOD_LABELS)): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("grpc_server_") and s.labels.get("grpc_method") == "ExecuteBatch"
    }
    assert scraped == served.samples()


_METHOD_LABELS = ("grpc_service", "grpc_method")


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()
