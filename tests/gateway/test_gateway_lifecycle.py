"""Readiness follows the fleet; shutdown finishes accepted work and refuses new work."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from common.errors import parse_rpc_error

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_readiness_waits_for_a_snapshot_with_a_replica(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    assert await gw.readiness() == NOT_SERVING
    # A snapshot with routing but no replica is not enough.
    gw.apply([], routing={"llama-3-8b": ("v1", "", 0)})
    assert await gw.readiness() == NOT_SERVING
    worker = await start_worker()
    gw.apply([worker])
    assert await gw.readiness() == SERVING
    # The replica leaves: not ready again.
    gw.apply([], routing={"llama-3-8b": ("v1", "", 0)})
    assert await gw.readiness() == NOT_SERVING


async def test_shutdown_finishes_accepted_work_and_refuses_new_work(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    worker = await start_worker(intercept_ms=300.0)
    gw = await start_gateway()
    gw.apply([worker])
    limiter = gw.app.admission.limiter

    def served() -> float:
        return gw.sample("halcyon_gateway_requests_total", {"outcome": "ok"})

    calls = [asyncio.create_task(gw.infer(text=f"p{i}", deadline_s=10.0)) for i in range(20)]
    await wait_until(lambda: limiter.inflight + served() == 20)  # all twenty admitted
    assert limiter.inflight >= 10  # most of them still queued or on the device

    shutdown = asyncio.create_task(gw.app.shutdown(grace_s=5.0))
    await wait_until(lambda: not gw.app.host.ready)
    assert await gw.readiness() == NOT_SERVING

    # New work while draining: refused with a reason, not queued.
    err = await gw.infer_error()
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == "SHUTTING_DOWN"

    replies = await asyncio.gather(*calls)  # every accepted request is answered OK
    assert all(r.output for r in replies)
    assert len({r.request_id for r in replies}) == 20
    await asyncio.wait_for(shutdown, timeout=5.0)
    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "ok"}) == 20
    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "shutting_down"}) == 1

    # Once the server itself is stopped, calls fail at the connection.
    await gw.app.host.stop(0)
    try:
        await gw.infer(deadline_s=2.0)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, parse_rpc_error(exc)
    else:
        raise AssertionError("a stopped gateway answered")


async def test_shutdown_answers_queued_work_left_after_the_grace_period(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    # A worker that hangs with one slot: its batch never finishes, so the rest stays queued
    # until the grace runs out; then each queued request gets a typed answer at once.
    worker = await start_worker(hang_rate=1.0)
    gw = await start_gateway()
    gw.apply([worker])
    first = asyncio.create_task(gw.infer(text="first", deadline_s=10.0))
    await wait_until(lambda: worker.slots.busy == 1)
    queued = [asyncio.create_task(gw.infer(text=f"p{i}", deadline_s=10.0)) for i in range(4)]
    await wait_until(lambda: gw.app.admission.limiter.inflight == 5)

    await asyncio.wait_for(gw.app.shutdown(grace_s=0.3), timeout=5.0)

    outcomes = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 1.0)
    for o in outcomes:
        assert isinstance(o, grpc.aio.AioRpcError), o
        err = parse_rpc_error(o)
        assert err.code == grpc.StatusCode.UNAVAILABLE
        assert err.reason == "SHUTTING_DOWN"
    first.cancel()


async def test_shutdown_answers_in_flight_work_left_after_the_grace_period(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    worker = await start_worker(hang_rate=1.0)
    gw = await start_gateway()
    gw.apply([worker])
    call = asyncio.create_task(gw.infer(deadline_s=10.0))
    await wait_until(lambda: worker.slots.busy == 1)

    await asyncio.wait_for(gw.app.shutdown(grace_s=0.3), timeout=5.0)

    try:
        done, _ = await asyncio.wait({call}, timeout=1.0)
        assert done, "the in-flight request was still unanswered 1 s after shutdown returned"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            call.result()
        err = parse_rpc_error(info.value)
        assert err.code == grpc.StatusCode.UNAVAILABLE
        assert err.reason  # a typed answer (e.g. SHUTTING_DOWN), not a bare cancellation
    finally:
        call.cancel()
