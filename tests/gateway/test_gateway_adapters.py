"""Both ways Infer is served — the completion-queue endpoint and the grpc.aio servicer it falls
back to — give the same answers, errors and cancellation accounting."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from common.errors import Reason
from common.serving import SERVING_PATH_ENV


@pytest.fixture(params=["completion-queue", "aio-fallback"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    # Every ServingOptions built in the test (gateway and workers) takes its default from here.
    monkeypatch.setenv(SERVING_PATH_ENV, "fast" if request.param == "completion-queue" else "aio")
    return str(request.param)


async def test_same_answers_either_way(path: str, start_worker: Any, start_gateway: Any) -> None:
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway()
    gw.apply([worker])
    (endpoint,) = gw.app.host._raw_endpoints
    assert endpoint.attached is (path == "completion-queue")

    replies = await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(8)))
    assert {r.replica_id for r in replies} == {"w-1"}
    assert all(r.output and r.usage.total_tokens for r in replies)
    err = await gw.infer_error(key="not-a-key")
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.reason == Reason.INVALID_CREDENTIALS
    labels = {"grpc_service": "halcyon.v1.InferService", "grpc_method": "Infer"}
    ok = gw.sample("grpc_server_handled_total", {**labels, "grpc_type": "unary", "grpc_code": "OK"})
    assert ok == 8


async def test_a_cancelled_call_frees_its_admission_slot(
    path: str, start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    worker = await start_worker(hang_rate=1.0)  # the batch never finishes
    gw = await start_gateway()
    gw.apply([worker])
    call = asyncio.ensure_future(gw.infer(deadline_s=10.0))
    await wait_until(lambda: gw.app.admission.limiter.inflight == 1)

    call.cancel()

    await wait_until(lambda: gw.app.admission.limiter.inflight == 0)
    await wait_until(
        lambda: gw.sample("halcyon_gateway_requests_total", {"outcome": "cancelled"}) == 1
    )
