"""``halcyon gateway --batching halcyon|fixed|none``: the seed's baselines as live batchers.

Pure tests drive :class:`FixedBatcher` / :class:`UnbatchedBatcher` on a ``ManualClock`` the way
the dispatcher does (``submit``, ``take_batch`` per free replica, ``poll``, ``next_wakeup``);
the last tests serve a request through a real gateway per strategy and read the flush reason
the response reports.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from common.clock import ManualClock
from gateway.batching import (
    Accepted,
    BatcherConfig,
    DeadlineBatcher,
    DropReason,
    FlushReason,
    Lane,
    OnlineCostModel,
    Rejected,
    ReplicaSlots,
)
from gateway.batching.fixed import (
    SEED_FIXED_LINGER_S,
    SEED_FIXED_MAX_ITEMS,
    SEED_FIXED_MAX_QUEUE,
    BatchingStrategy,
    BatchPolicy,
    FixedBatcher,
    UnbatchedBatcher,
    make_batcher,
)
from gateway.main import config_from_args, configure
from halcyon.v1 import infer_pb2

FAR = 100.0  # a deadline nothing in these tests gets near


def _fixed(clock: ManualClock, slots: int = 1) -> FixedBatcher[int]:
    batcher: FixedBatcher[int] = FixedBatcher(clock)
    batcher.add_replica(ReplicaSlots("r", slots=slots))
    return batcher


def _submit(b: BatchPolicy[int], payload: int, deadline: float = FAR, tokens: int = 100) -> None:
    assert isinstance(b.submit(payload, tokens=tokens, deadline=deadline), Accepted)


def test_the_seed_settings() -> None:
    assert (SEED_FIXED_MAX_ITEMS, SEED_FIXED_LINGER_S, SEED_FIXED_MAX_QUEUE) == (32, 0.025, 512)
    b = FixedBatcher[int](ManualClock())
    assert (b.max_items, b.linger_s, b.max_queue) == (32, 0.025, 512)


def test_fixed_flushes_when_32_are_waiting_in_fifo_order() -> None:
    clock = ManualClock()
    b = _fixed(clock)
    for i in range(31):
        _submit(b, i)
        clock.advance(0.0001)
    assert b.take_batch("r") is None  # 31 waiting, the oldest 3.1 ms: keep waiting
    _submit(b, 31)
    _submit(b, 32)
    batch = b.take_batch("r")
    assert batch is not None
    assert batch.reason is FlushReason.FULL
    assert batch.payloads == list(range(32))
    assert batch.tokens == 3200
    assert b.depth == 1


def test_fixed_flushes_25_ms_after_the_first_item_arrived() -> None:
    clock = ManualClock(10.0)
    b = _fixed(clock)
    _submit(b, 0)
    clock.advance(0.010)
    _submit(b, 1)  # a later arrival does not restart the linger
    assert b.take_batch("r") is None
    assert b.next_wakeup() == pytest.approx(10.025)
    clock.set(10.0249)
    assert b.take_batch("r") is None
    clock.set(10.025)
    batch = b.take_batch("r")
    assert batch is not None
    assert batch.reason is FlushReason.LINGER
    assert batch.payloads == [0, 1]
    assert b.next_wakeup() is None


def test_fixed_waits_for_a_busy_replica_and_then_flushes_what_lingered() -> None:
    clock = ManualClock()
    b = _fixed(clock)
    for i in range(32):
        _submit(b, i)
    first = b.take_batch("r")
    assert first is not None and first.reason is FlushReason.FULL
    _submit(b, 32)
    clock.advance(0.5)
    assert b.free_replicas() == []
    assert b.take_batch("r") is None  # no free slot
    # Only the eviction of the queued request's deadline would wake a busy batcher.
    assert b.next_wakeup() == FAR
    b.complete(first, 0.080)
    second = b.take_batch("r")
    assert second is not None and second.reason is FlushReason.LINGER
    assert second.payloads == [32]


def test_fixed_is_fifo_not_earliest_deadline_first() -> None:
    clock = ManualClock()
    b = _fixed(clock)
    _submit(b, 0, deadline=50.0)
    _submit(b, 1, deadline=0.5)  # more urgent, later: still behind
    _submit(b, 2, deadline=9.0, tokens=4000)
    assert isinstance(
        b.submit(3, tokens=10, deadline=20.0, lane=Lane.BULK), Accepted
    )  # one FIFO for both lanes
    clock.advance(SEED_FIXED_LINGER_S)
    batch = b.take_batch("r")
    assert batch is not None and batch.payloads == [0, 1, 2, 3]


def test_fixed_queue_holds_512_and_refuses_the_next_as_queue_full() -> None:
    clock = ManualClock()
    b = _fixed(clock)
    for i in range(SEED_FIXED_MAX_QUEUE):
        _submit(b, i)
    verdict = b.submit(512, tokens=100, deadline=FAR)
    assert isinstance(verdict, Rejected)
    assert verdict.reason is DropReason.QUEUE_FULL
    assert verdict.retry_after is not None and verdict.retry_after > 0
    assert b.depth == SEED_FIXED_MAX_QUEUE
    batch = b.take_batch("r")
    assert batch is not None
    _submit(b, 513)  # room again once a batch left


def test_fixed_never_sheds_for_feasibility_and_evicts_only_once_the_deadline_passed() -> None:
    clock = ManualClock()
    b = _fixed(clock)
    # A very slow device.
    b.add_replica(ReplicaSlots("r", slots=1), cost_model=OnlineCostModel(1.0, 0.01))
    for i in range(32):
        _submit(b, i)
    running = b.take_batch("r")
    assert running is not None
    # Cannot possibly finish in 10 ms behind a multi-second batch: accepted all the same.
    _submit(b, 100, deadline=0.010, tokens=5000)
    _submit(b, 101, deadline=0.020)
    assert b.next_wakeup() == pytest.approx(0.010)
    clock.set(0.0099)
    b.poll()
    assert b.take_dropped() == []
    clock.set(0.010)
    b.poll()
    dropped = b.take_dropped()
    assert [(d.item.payload, d.reason) for d in dropped] == [(100, DropReason.DEADLINE_MISSED)]
    assert b.depth == 1
    clock.set(0.5)
    b.poll()
    assert [d.item.payload for d in b.take_dropped()] == [101]
    assert b.depth == 0 and b.next_wakeup() is None


def test_refusals_that_are_facts_not_predictions() -> None:
    clock = ManualClock(5.0)
    b: FixedBatcher[int] = FixedBatcher(clock)
    none = b.submit(0, tokens=10, deadline=FAR)
    assert isinstance(none, Rejected) and none.reason is DropReason.NO_CAPACITY
    b.add_replica(ReplicaSlots("r"))
    late = b.submit(1, tokens=10, deadline=5.0)
    assert isinstance(late, Rejected) and late.reason is DropReason.DEADLINE_UNREACHABLE
    b.close()
    closed = b.submit(2, tokens=10, deadline=FAR)
    assert isinstance(closed, Rejected) and closed.reason is DropReason.CLOSED


def test_completions_teach_each_replica_its_own_cost_model() -> None:
    clock = ManualClock()
    b: FixedBatcher[int] = FixedBatcher(clock)
    b.add_replica(ReplicaSlots("fast"))
    b.add_replica(ReplicaSlots("slow"))
    assert b.cost_model("fast") is not b.cost_model("slow")
    for i in range(64):
        _submit(b, i)
    one = b.take_batch("fast")
    two = b.take_batch("slow")
    assert one is not None and two is not None
    assert b.free_replicas() == []
    b.complete(one, 0.05)
    b.complete(two, 0.5)
    assert b.cost_model("fast").observations == 1
    assert b.cost_model("slow").predict(3200) > b.cost_model("fast").predict(3200)
    # The output budget prices a batch (its longest member), as for Halcyon's batcher.
    b.submit(99, tokens=300, deadline=FAR, output_tokens=200)
    b.submit(98, tokens=100, deadline=FAR, output_tokens=50)
    clock.advance(SEED_FIXED_LINGER_S)
    priced = b.take_batch("fast")
    assert priced is not None and priced.longest == 200
    model = b.cost_model("fast")
    assert priced.predicted_seconds == pytest.approx(model.predict(400, 200))
    b.complete(priced, 0.06)
    # A replica re-added (breaker closed again) keeps what it learned.
    learned = b.cost_model("slow")
    b.remove_replica("slow")
    b.add_replica(ReplicaSlots("slow"), cost_model=learned)
    assert b.cost_model("slow") is learned


def test_failed_batches_free_the_slot_and_hand_back_or_requeue_their_requests() -> None:
    clock = ManualClock()
    b = _fixed(clock)
    for i in range(33):
        _submit(b, i)
    batch = b.take_batch("r")
    assert batch is not None
    items = b.fail(batch)
    assert [item.payload for item in items] == list(range(32))
    assert b.cost_model("r").observations == 0
    assert b.take_batch("r") is None  # the 33rd has not lingered yet
    clock.advance(SEED_FIXED_LINGER_S)
    again = b.take_batch("r")
    assert again is not None and again.reason is FlushReason.LINGER and again.payloads == [32]
    b2 = _fixed(clock)
    for i in range(33):
        _submit(b2, i)
    batch2 = b2.take_batch("r")
    assert batch2 is not None
    assert b2.fail(batch2, requeue=True) == []
    assert [item.payload for item in b2.queued_items()] == list(range(33))


def test_a_retry_is_held_out_of_the_replica_it_failed_on() -> None:
    clock = ManualClock()
    b: FixedBatcher[int] = FixedBatcher(clock)
    b.add_replica(ReplicaSlots("a"))
    b.add_replica(ReplicaSlots("b"))
    b.submit(0, tokens=10, deadline=FAR, avoid=frozenset({"a"}))
    clock.advance(SEED_FIXED_LINGER_S)
    assert b.take_batch("a") is None
    assert b.withheld == 1
    batch = b.take_batch("b")
    assert batch is not None and batch.payloads == [0]


def test_none_dispatches_one_request_per_batch_as_soon_as_a_slot_is_free() -> None:
    clock = ManualClock()
    b: UnbatchedBatcher[int] = UnbatchedBatcher(clock)
    b.add_replica(ReplicaSlots("r", slots=2))
    for i in range(3):
        _submit(b, i)
    first, second = b.take_batch("r"), b.take_batch("r")
    assert first is not None and second is not None
    assert (first.payloads, second.payloads) == ([0], [1])
    assert first.reason is second.reason is FlushReason.CAPACITY
    assert b.take_batch("r") is None  # both slots busy
    b.complete(first, 0.02)
    third = b.take_batch("r")
    assert third is not None and third.payloads == [2] and third.reason is FlushReason.CAPACITY
    assert b.max_queue == SEED_FIXED_MAX_QUEUE


def test_make_batcher_builds_the_strategy_it_names() -> None:
    clock = ManualClock()
    cfg = BatcherConfig(prior_intercept_s=0.02)
    halcyon: BatchPolicy[int] = make_batcher(BatchingStrategy.HALCYON, clock, cfg)
    fixed: BatchPolicy[int] = make_batcher(BatchingStrategy.FIXED, clock, cfg)
    none: BatchPolicy[int] = make_batcher(BatchingStrategy.NONE, clock, cfg)
    assert isinstance(halcyon, DeadlineBatcher)
    assert isinstance(fixed, FixedBatcher) and not isinstance(fixed, UnbatchedBatcher)
    assert isinstance(none, UnbatchedBatcher)
    fixed.add_replica(ReplicaSlots("r"))
    assert fixed.cost_model("r").intercept == pytest.approx(0.02)
    assert BatchingStrategy.parse(" Fixed ") is BatchingStrategy.FIXED
    with pytest.raises(ValueError, match="halcyon, fixed, none"):
        BatchingStrategy.parse("adaptive")


def test_the_gateway_flag_chooses_the_strategy() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    configure(parser)
    assert config_from_args(parser.parse_args(["--dev-mode"])).batching is BatchingStrategy.HALCYON
    args = parser.parse_args(["--dev-mode", "--batching", "fixed"])
    assert config_from_args(args).batching is BatchingStrategy.FIXED
    assert "32" in parser.format_help() and "seed description" in parser.format_help()


# -- through a real gateway ------------------------------------------------------------------

_EXPECTED = {
    # Halcyon with no linger: an idle replica takes the request at once.
    BatchingStrategy.HALCYON: infer_pb2.FLUSH_REASON_CAPACITY,
    # One request never fills 32: it leaves after the 25 ms linger.
    BatchingStrategy.FIXED: infer_pb2.FLUSH_REASON_LINGER,
    BatchingStrategy.NONE: infer_pb2.FLUSH_REASON_CAPACITY,
}


@pytest.mark.parametrize("strategy", list(BatchingStrategy))
async def test_a_request_is_served_with_the_strategys_flush_reason(
    strategy: BatchingStrategy, start_worker: Any, start_gateway: Any
) -> None:
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway(batching=strategy)
    gw.apply([worker])
    assert gw.sample("halcyon_gateway_batching_info", {"strategy": strategy.value}) == 1.0

    reply = await gw.infer(text="x" * 40, max_output_tokens=24)
    assert reply.batch.size == 1
    assert reply.batch.flush_reason == _EXPECTED[strategy]
    if strategy is BatchingStrategy.FIXED:
        assert reply.timings.queued.ToNanoseconds() >= 24_000_000  # the linger, ~25 ms

    # And a burst: everything answered, batched (fixed) or one by one (none).
    replies = await asyncio.gather(*(gw.infer(text=f"burst {i}") for i in range(40)))
    sizes = {r.batch.size for r in replies}
    if strategy is BatchingStrategy.NONE:
        assert sizes == {1}
    if strategy is BatchingStrategy.FIXED:
        assert max(sizes) > 1 and max(sizes) <= SEED_FIXED_MAX_ITEMS
    d = next(iter(gw.app.dispatchers.values()))
    assert d.batcher.cost_model("w-1").observations >= 2


async def test_fixed_answers_a_request_whose_deadline_passes_in_the_queue(
    start_worker: Any, start_gateway: Any, wait_until: Any
) -> None:
    # A slow worker holding its one slot: the second request waits past its deadline and is
    # answered by the gateway (not left to the client's own deadline).
    worker = await start_worker(replica_id="w-slow", intercept_ms=600.0)
    gw = await start_gateway(batching=BatchingStrategy.FIXED)
    gw.apply([worker])
    first = asyncio.ensure_future(gw.infer(deadline_s=5.0))
    await asyncio.sleep(0.1)  # the first batch is on the device
    err = await gw.infer_error(deadline_s=0.3)
    assert err.code.name == "DEADLINE_EXCEEDED"
    d = next(iter(gw.app.dispatchers.values()))
    await wait_until(lambda: d.batcher.depth == 0, timeout_s=1.0)  # evicted, not left queued
    assert (await first).batch.flush_reason == infer_pb2.FLUSH_REASON_LINGER


# -- the loadtest as a library, against each strategy -----------------------------------------


@pytest.mark.parametrize("strategy", list(BatchingStrategy))
async def test_the_loadtest_library_reports_slo_classes_against_each_strategy(
    strategy: BatchingStrategy, start_worker: Any, start_gateway: Any
) -> None:
    from common.serving import ServingOptions
    from halcyon.tools.loadtest import LoadOptions, parse_mix, run_loadtest

    worker = await start_worker(
        replica_id="w-1",
        serving=ServingOptions(listen="127.0.0.1:0", metrics_listen="127.0.0.1:0", grace_s=1.0),
    )
    gw = await start_gateway(batching=strategy, metrics=True)
    gw.apply([worker])
    options = LoadOptions(
        target=gw.app.host.grpc_address,
        api_key="demo-key-premium",
        # ~40 % of the one-slot worker's capacity without batching (20 ms a request): light
        # enough that a starved runner still meets the 500 ms class.
        rate=20.0,
        seconds=1.0,
        mix=parse_mix("urgent:0.5:500,relaxed:0.5:3000"),
        max_tokens=(16, 32),
        gateway_metrics=gw.app.host.metrics_address,
        worker_metrics=[str(worker.host.metrics_address)],
    )
    warnings: list[str] = []
    result = await asyncio.to_thread(run_loadtest, options, warn=warnings.append)
    assert not warnings
    assert [c.name for c in result.classes] == ["urgent", "relaxed"]
    assert sum(c.offered for c in result.classes) == result.offered == result.requests
    # A light load: everything served — give or take a request whose 500 ms deadline a
    # starved CI runner (three test workers on two cores) could not meet.
    assert result.requests > 10 and result.succeeded >= 0.9 * result.requests
    assert all(c.on_time <= c.succeeded <= c.offered for c in result.classes)
    assert result.on_time == sum(c.on_time for c in result.classes)
    assert result.goodput_rps == pytest.approx(result.on_time / 1.0)
    assert result.admitted == result.requests
    assert result.p50_ms <= result.p95_ms <= result.p99_ms
    assert result.mean_batch_size >= 1.0
    if strategy is BatchingStrategy.NONE:
        assert result.mean_batch_size == 1.0
    assert result.gateway_requests_per_batch is not None
    assert result.gateway_cpu_ms_per_request is not None
    assert result.worker_cpu_ms_per_request is not None
    assert result.report["classes"][0]["deadline_ms"] == 500.0
