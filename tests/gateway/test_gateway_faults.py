"""Faults, backpressure and draining: what the dispatcher does when replicas misbehave."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc
import pytest

from common.auth import bearer_metadata
from common.errors import parse_rpc_error
from gateway.routing.breaker import BreakerState
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from worker.metrics import BatchOutcome

MODEL = "llama-3-8b"
FLEET = "gateway-test-fleet-token"


def _batches(worker: Any, outcome: str) -> float:
    return float(worker.metrics.batches[BatchOutcome(outcome)]._value.get())


def _views(gw: Any, version: str = "v1") -> dict[str, Any]:
    d = gw.app.dispatchers[(MODEL, version)]
    return {v.replica_id: v for v in d.router.views(gw.app.clock.now())}


async def test_failing_replica_is_retried_elsewhere(start_worker: Any, start_gateway: Any) -> None:
    bad = await start_worker(replica_id="w-bad", fail_rate=1.0, fail_fast_ms=1.0)
    good = await start_worker(replica_id="w-good")
    gw = await start_gateway()
    gw.apply([bad, good])

    outcomes: list[Any] = []
    for _ in range(4):  # waves of concurrent calls, so both replicas get batches
        outcomes += await asyncio.gather(
            *(gw.infer(text=f"p{i}") for i in range(8)), return_exceptions=True
        )

    assert _batches(bad, "device_fault") >= 1, "the failing replica was never tried"
    failed = [parse_rpc_error(o).reason for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
    assert failed == [], f"{len(failed)} of {len(outcomes)} failed: {failed}"
    assert all(o.replica_id == "w-good" for o in outcomes)


async def test_sequential_request_is_retried_on_the_slower_healthy_replica(
    start_worker: Any, start_gateway: Any
) -> None:
    # The healthy replica is slower (80 ms) than the failing one's prior (50 ms), so the
    # failing one wins the first pick; the retry must go elsewhere.
    bad = await start_worker(replica_id="w-bad", fail_rate=1.0, fail_fast_ms=1.0)
    good = await start_worker(replica_id="w-good", intercept_ms=80.0)
    gw = await start_gateway()
    gw.apply([good])
    assert (await gw.infer()).replica_id == "w-good"  # the healthy replica has a sample
    gw.apply([bad, good])

    try:
        reply = await gw.infer()
    except grpc.aio.AioRpcError as err:
        pytest.fail(f"failed although a healthy replica was free: {parse_rpc_error(err)}")
    assert _batches(bad, "device_fault") >= 1, "the failing replica was never tried"
    assert reply.replica_id == "w-good"


async def test_failing_replica_trips_its_breaker(start_worker: Any, start_gateway: Any) -> None:
    bad = await start_worker(replica_id="w-bad", fail_rate=1.0, fail_fast_ms=1.0)
    good = await start_worker(replica_id="w-good")
    gw = await start_gateway()
    gw.apply([bad, good])
    for _ in range(10):
        await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(8)), return_exceptions=True)
        if _views(gw)["w-bad"].breaker is BreakerState.OPEN:
            break
    views = _views(gw)
    assert views["w-bad"].breaker is BreakerState.OPEN
    assert not views["w-bad"].eligible
    assert views["w-good"].breaker is BreakerState.CLOSED
    faults = _batches(bad, "device_fault")
    assert faults >= 5  # the breaker's minimum number of judged outcomes
    # While open it takes no traffic, and everything succeeds on the healthy replica.
    replies = await asyncio.gather(*(gw.infer() for _ in range(8)))
    assert {r.replica_id for r in replies} == {"w-good"}
    assert _batches(bad, "device_fault") == faults


async def _occupy(worker: Any, stop: asyncio.Event) -> int:
    """Keep the worker's only slot busy with batches from a client the gateway knows nothing of."""
    runs = 0
    async with grpc.aio.insecure_channel(worker.host.grpc_address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        while not stop.is_set():
            request = worker_pb2.ExecuteBatchRequest(
                batch_id=f"outsider-{runs}",
                model=MODEL,
                version="v1",
                items=[
                    worker_pb2.BatchItem(
                        id="x", input="occupy", input_tokens=2, max_output_tokens=1
                    )
                ],
            )
            with contextlib.suppress(grpc.aio.AioRpcError):  # busy: the gateway got in first
                await stub.ExecuteBatch(request, metadata=bearer_metadata(FLEET), timeout=5.0)
            runs += 1
    return runs


async def test_busy_replica_is_backpressure_not_a_fault(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    # One replica with one slot that an outside client keeps busy (80 ms per batch).
    worker = await start_worker(replica_id="w-1", slots=1, intercept_ms=80.0)
    gw = await start_gateway()
    gw.apply([worker])
    stop = asyncio.Event()
    occupier = asyncio.create_task(_occupy(worker, stop))
    await wait_until(lambda: worker.slots.busy == 1)

    try:
        replies = await asyncio.gather(*(gw.infer(text=f"p{i}", deadline_s=10.0) for i in range(6)))
    finally:
        stop.set()
        await occupier

    assert all(r.output and r.replica_id == "w-1" for r in replies)
    assert _batches(worker, "busy") >= 1, "the gateway never met the busy replica"
    assert gw.sample("halcyon_gateway_busy_retries_total") >= 1
    view = _views(gw)["w-1"]
    assert view.breaker is BreakerState.CLOSED
    assert view.inflight == 0


async def test_many_busy_answers_never_open_the_breaker(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    # Two replicas; the outsider keeps one busy for the whole test. Every busy answer is
    # backpressure: even well past the breaker's minimum of 5 judged outcomes it stays closed.
    busy = await start_worker(replica_id="w-busy", slots=1, intercept_ms=60.0)
    free = await start_worker(replica_id="w-free", slots=1, intercept_ms=20.0)
    gw = await start_gateway()
    gw.apply([busy, free])
    stop = asyncio.Event()
    occupier = asyncio.create_task(_occupy(busy, stop))
    await wait_until(lambda: busy.slots.busy == 1)
    try:
        for _ in range(8):
            replies = await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(4)))
            assert all(r.output for r in replies)
            if _batches(busy, "busy") >= 6:
                break
    finally:
        stop.set()
        await occupier
    assert _batches(busy, "busy") >= 1
    assert _views(gw)["w-busy"].breaker is BreakerState.CLOSED


async def test_busy_answers_are_not_counted_as_batch_failures(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    worker = await start_worker(replica_id="w-1", slots=1, intercept_ms=80.0)
    gw = await start_gateway()
    gw.apply([worker])
    calls = 0
    # A call can land in the gap between two of the outsider's batches and find the slot free;
    # try again until one met the busy replica (the precondition), each try one batch.
    while calls < 5 and gw.sample("halcyon_gateway_busy_retries_total") < 1:
        stop = asyncio.Event()
        occupier = asyncio.create_task(_occupy(worker, stop))
        await wait_until(lambda: worker.slots.busy == 1)
        try:
            reply = await gw.infer()
        finally:
            stop.set()
            await occupier
        assert reply.output
        calls += 1
    busy = gw.sample("halcyon_gateway_busy_retries_total")
    assert busy >= 1 and _batches(worker, "busy") >= 1  # precondition: backpressure happened
    assert _batches(worker, "device_fault") == 0
    assert gw.sample("halcyon_gateway_batch_failures_total") == 0
    # One batch per call was dispatched (perhaps several times): one batch-size observation each.
    assert gw.sample("halcyon_gateway_batch_size_count") == calls


async def test_draining_replica_gets_no_new_batches(start_worker: Any, start_gateway: Any) -> None:
    a = await start_worker(replica_id="w-a")
    b = await start_worker(replica_id="w-b")
    gw = await start_gateway()
    gw.apply([a, b])
    warm = await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(16)))
    assert {r.replica_id for r in warm} <= {"w-a", "w-b"}

    gw.apply([a, b], draining={"w-a"})
    assert _views(gw)["w-a"].draining
    served_by_a = _batches(a, "ok")

    replies = []
    for _ in range(3):
        replies += await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(8)))

    assert {r.replica_id for r in replies} == {"w-b"}
    assert _batches(a, "ok") == served_by_a
    assert _batches(a, "busy") + _batches(a, "draining") + _batches(a, "device_fault") == 0

    # Undrained, it takes work again.
    gw.apply([a, b])
    assert not _views(gw)["w-a"].draining
    more = []
    for _ in range(4):
        more += await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(8)))
    assert "w-a" in {r.replica_id for r in more}


async def test_draining_the_only_replica_turns_readiness_off(
    start_worker: Any, start_gateway: Any
) -> None:
    a = await start_worker(replica_id="w-a")
    gw = await start_gateway()
    gw.apply([a])
    assert gw.app.host.ready
    gw.apply([a], draining={"w-a"})
    assert not gw.app.host.ready
