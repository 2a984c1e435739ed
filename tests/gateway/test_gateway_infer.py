"""The Infer path end to end: response fields, batching of concurrent calls, sticky versions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.versioning import VersionSplit
from halcyon.v1 import infer_pb2

MODEL = "llama-3-8b"


def _seconds(d: Any) -> float:
    return float(d.ToNanoseconds()) / 1e9


async def test_one_request_reports_every_field(start_worker: Any, start_gateway: Any) -> None:
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway()
    gw.apply([worker])

    reply = await gw.infer(text="x" * 40, max_output_tokens=24)

    assert reply.output
    assert reply.model == MODEL
    assert reply.version == "v1"
    assert reply.replica_id == "w-1"
    assert not reply.hedged
    assert reply.request_id
    queued, execution, total = (
        _seconds(reply.timings.queued),
        _seconds(reply.timings.execution),
        _seconds(reply.timings.total),
    )
    assert queued >= 0.0
    assert execution > 0.0
    # Device time is measured inside the RPC, which starts after the request left the queue.
    assert queued + execution <= total + 1e-6
    assert execution >= 0.020 - 1e-3  # the worker's 20 ms intercept
    assert reply.batch.size >= 1
    assert reply.batch.flush_reason != infer_pb2.FLUSH_REASON_UNSPECIFIED
    assert reply.batch.tokens >= reply.usage.input_tokens
    assert reply.usage.input_tokens == 10  # 40 bytes at 4 bytes per token
    assert 0 < reply.usage.output_tokens <= 24
    assert reply.usage.input_tokens + reply.usage.output_tokens == reply.usage.total_tokens


async def test_bearer_token_authenticates_like_the_api_key_header(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    reply = await gw.stub.Infer(
        gw.request(),
        metadata=(("authorization", "Bearer demo-key-premium"),),
        timeout=10.0,
    )
    assert reply.output


async def test_concurrent_requests_share_batches(start_worker: Any, start_gateway: Any) -> None:
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway()
    gw.apply([worker])

    replies = await asyncio.gather(*(gw.infer(text=f"prompt {i}") for i in range(32)))

    assert len({r.request_id for r in replies}) == 32
    assert all(r.output and r.replica_id == "w-1" for r in replies)
    sizes = [r.batch.size for r in replies]
    assert max(sizes) > 1, sizes
    # A request's reported batch size is the number of requests that rode with it.
    by_size: dict[int, int] = {}
    for s in sizes:
        by_size[s] = by_size.get(s, 0) + 1
    for size, riders in by_size.items():
        assert riders % size == 0, (size, riders)
    # One slot: far fewer device runs than requests.
    batches = sum(riders // size for size, riders in by_size.items())
    assert batches < 32
    assert all(r.batch.flush_reason != infer_pb2.FLUSH_REASON_UNSPECIFIED for r in replies)


async def test_same_session_key_keeps_its_version(start_worker: Any, start_gateway: Any) -> None:
    v1 = await start_worker(replica_id="w-v1", version="v1", slots=4)
    v2 = await start_worker(replica_id="w-v2", version="v2", slots=4)
    gw = await start_gateway()
    gw.apply([v1, v2], routing={MODEL: ("v1", "v2", 5000)})
    split = VersionSplit(MODEL, "v1", "v2", 5000)
    keys = [f"user-{i}" for i in range(48)]

    seen: dict[str, set[str]] = {k: set() for k in keys}
    for _ in range(3):
        replies = await asyncio.gather(*(gw.infer(session_key=k) for k in keys))
        for k, r in zip(keys, replies, strict=True):
            seen[k].add(r.version)
            assert r.replica_id == ("w-v2" if r.version == "v2" else "w-v1")

    assert all(len(versions) == 1 for versions in seen.values()), seen
    assigned = {k: next(iter(v)) for k, v in seen.items()}
    # Gateways share no state: the assignment is the hash, so anyone can predict it.
    assert assigned == {k: split.version_for(k) for k in keys}
    canary = sum(v == "v2" for v in assigned.values())
    assert 0.3 * len(keys) <= canary <= 0.7 * len(keys), canary


async def test_without_session_key_requests_are_assigned_independently(
    start_worker: Any, start_gateway: Any
) -> None:
    v1 = await start_worker(version="v1", slots=4)
    v2 = await start_worker(version="v2", slots=4)
    gw = await start_gateway()
    gw.apply([v1, v2], routing={MODEL: ("v1", "v2", 5000)})
    replies = await asyncio.gather(*(gw.infer() for _ in range(40)))
    versions = [r.version for r in replies]
    assert {"v1", "v2"} == set(versions), versions


@pytest.mark.parametrize("weight", [0, 10_000])
async def test_weight_extremes_send_everyone_to_one_version(
    start_worker: Any, start_gateway: Any, weight: int
) -> None:
    v1 = await start_worker(version="v1", slots=4)
    v2 = await start_worker(version="v2", slots=4)
    gw = await start_gateway()
    gw.apply([v1, v2], routing={MODEL: ("v1", "v2", weight)})
    replies = await asyncio.gather(*(gw.infer(session_key=f"s{i}") for i in range(16)))
    expected = "v2" if weight else "v1"
    assert {r.version for r in replies} == {expected}
