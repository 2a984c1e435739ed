"""The worker's pure parts: simulated device cost model, faults, slots, backoff, validation."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.backoff import Backoff
from common.clock import ManualClock
from common.errors import RichError
from common.rng import SeededRng
from halcyon.v1 import worker_pb2
from worker.descriptor import ReplicaIdentity
from worker.faults import FaultInjector, FaultKind
from worker.replica import Replica, ReplicaDraining
from worker.runtime import (
    MAX_OUTPUT_WORDS,
    DeviceFault,
    SimulatedDevice,
    WorkItem,
    batch_tokens,
    generate_text,
)
from worker.slots import SlotsBusy, SlotTable
from worker.validation import parse_batch


class FixedRng:
    """Returns the given uniforms in turn."""

    def __init__(self, values: Sequence[float]) -> None:
        self._values = list(values)

    def random(self) -> float:
        return self._values.pop(0)

    def randrange(self, n: int) -> int:
        return int(self.random() * n)


class VirtualSleep:
    """An injected sleep that advances a ManualClock instead of waiting."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0)


def items(*tokens: tuple[int, int]) -> list[WorkItem]:
    return [WorkItem(f"i{n}", f"prompt {n}", t, o) for n, (t, o) in enumerate(tokens)]


# -- simulated device -------------------------------------------------------------------------


async def test_device_time_follows_the_cost_model_with_jitter_bounds() -> None:
    clock = ManualClock()
    sleep = VirtualSleep(clock)
    device = SimulatedDevice(
        intercept_ms=18.0,
        ms_per_token=0.022,
        speed=0.5,
        jitter=0.08,
        rng=FixedRng([0.0, 1.0, 0.5]),
        clock=clock,
        sleep=sleep,
    )
    batch = items((1000, 24), (476, 0))  # 1500 work tokens
    assert batch_tokens(batch) == 1500
    nominal = (18.0 + 0.022 * 1500) / 0.5 / 1000.0
    assert device.estimate_s(1500) == pytest.approx(nominal)
    low = await device.execute(batch)
    high = await device.execute(batch)
    mid = await device.execute(batch)
    assert low.device_time_s == pytest.approx(nominal * 0.92)
    assert high.device_time_s == pytest.approx(nominal * 1.08)
    assert mid.device_time_s == pytest.approx(nominal)
    assert mid.batch_tokens == 1500
    assert [o.id for o in mid.outputs] == ["i0", "i1"]
    assert [(o.input_tokens, o.output_tokens) for o in mid.outputs] == [(1000, 24), (476, 0)]
    assert mid.outputs[1].output == ""  # nothing generated for a zero budget


@given(st.text(max_size=200), st.integers(min_value=0, max_value=5000))
def test_generated_text_is_deterministic_and_capped(prompt: str, tokens: int) -> None:
    text = generate_text(prompt, tokens)
    assert text == generate_text(prompt, tokens)
    assert len(text.split()) == min(tokens, MAX_OUTPUT_WORDS)


def test_different_prompts_give_different_text() -> None:
    assert generate_text("hello", 10) != generate_text("world", 10)


async def test_cancellation_stops_the_device() -> None:
    device = SimulatedDevice(intercept_ms=60_000.0, jitter=0.0)
    task = asyncio.ensure_future(device.execute(items((1, 1))))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1.0)


async def test_injected_faults_fail_fast_hang_or_slow_down() -> None:
    clock = ManualClock()
    sleep = VirtualSleep(clock)
    fail = FaultInjector(fail_rate=1.0, fail_fast_ms=2.0, rng=SeededRng(1))
    device = SimulatedDevice(jitter=0.0, clock=clock, sleep=sleep, faults=fail)
    with pytest.raises(DeviceFault):
        await device.execute(items((10_000, 0)))
    assert sleep.calls == [pytest.approx(0.002)]

    slow = FaultInjector(slowdown=3.0, rng=SeededRng(1))
    device = SimulatedDevice(jitter=0.0, clock=clock, sleep=sleep, faults=slow)
    result = await device.execute(items((1000, 0)))
    assert result.device_time_s == pytest.approx(3 * (18.0 + 22.0) / 1000.0)

    hang = FaultInjector(hang_rate=1.0, rng=SeededRng(1))
    device = SimulatedDevice(jitter=0.0, clock=clock, sleep=sleep, faults=hang)
    task = asyncio.ensure_future(device.execute(items((1, 1))))
    done, _ = await asyncio.wait({task}, timeout=0.05)
    assert not done  # hung
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_fault_rates_are_honoured_and_seeded() -> None:
    def plans(seed: int) -> list[FaultKind]:
        injector = FaultInjector(fail_rate=0.3, hang_rate=0.2, rng=SeededRng(seed))
        return [injector.plan().kind for _ in range(4000)]

    kinds = plans(7)
    assert kinds == plans(7)
    fail_share = kinds.count(FaultKind.FAIL) / len(kinds)
    hang_share = kinds.count(FaultKind.HANG) / len(kinds)
    assert 0.27 < fail_share < 0.33
    assert 0.7 * 0.2 - 0.03 < hang_share < 0.7 * 0.2 + 0.03  # hang is drawn after fail
    assert not FaultInjector(rng=SeededRng(0)).active
    with pytest.raises(ValueError):
        FaultInjector(fail_rate=1.5, rng=SeededRng(0))


# -- slots ------------------------------------------------------------------------------------


def test_slots_refuse_when_full_with_time_to_earliest_finish() -> None:
    clock = ManualClock(100.0)
    table = SlotTable(2, clock)
    first = table.acquire("a", 1.0)
    clock.advance(0.25)
    table.acquire("b", 0.5)
    assert table.free == 0 and table.busy == 2
    clock.advance(0.1)
    with pytest.raises(SlotsBusy) as info:
        table.acquire("c", 0.1)
    # a ends at 101.0, b at 100.75; now 100.35 -> b frees first, in 0.4 s.
    assert info.value.retry_after_s == pytest.approx(0.4)
    assert (info.value.busy, info.value.capacity) == (2, 2)
    table.release(first)
    table.release(first)  # idempotent
    assert table.free == 1 and table.retry_after_s() == 0.0
    table.acquire("c", 0.1)


def test_overdue_batches_give_the_floor_delay() -> None:
    clock = ManualClock()
    table = SlotTable(1, clock, min_retry_s=0.001)
    table.acquire("a", 0.01)
    clock.advance(5.0)
    assert table.retry_after_s() == 0.001


# -- replica ----------------------------------------------------------------------------------


async def test_replica_counts_and_releases_on_every_ending() -> None:
    clock = ManualClock()
    injector = FaultInjector(fail_rate=0.0, rng=SeededRng(0))
    device = SimulatedDevice(jitter=0.0, clock=clock, sleep=VirtualSleep(clock), faults=injector)
    slots = SlotTable(1, clock)
    replica = Replica(device, slots)
    await replica.execute("ok", items((10, 10)))
    injector.fail_rate = 1.0
    with pytest.raises(DeviceFault):
        await replica.execute("bad", items((10, 10)))
    assert slots.busy == 0
    load = replica.load()
    assert (load.batches_total, load.batches_failed, load.draining) == (2, 1, False)
    assert (await replica.drain(1.0)).batches_finished == 0
    with pytest.raises(ReplicaDraining) as info:
        await replica.execute("late", items((10, 10)))
    assert not info.value.cut_off


# -- backoff ----------------------------------------------------------------------------------


def test_backoff_grows_caps_and_jitters_downward() -> None:
    b = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, jitter=0.2)
    assert [b.delay(n, 0.0) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert b.delay(2, 1.0) == pytest.approx(0.32)
    assert b.delay(10_000, 0.5) <= 1.0
    with pytest.raises(ValueError):
        Backoff(initial_s=2.0, max_s=1.0)


# -- validation -------------------------------------------------------------------------------

IDENTITY = ReplicaIdentity("r1", "127.0.0.1:1", "m", "v1", "a10g", 1, 1.0)


def request(
    *item_specs: tuple[str, int, int], model: str = "m", version: str = "v1"
) -> worker_pb2.ExecuteBatchRequest:
    return worker_pb2.ExecuteBatchRequest(
        batch_id="b",
        model=model,
        version=version,
        items=[
            worker_pb2.BatchItem(id=i, input="x", input_tokens=t, max_output_tokens=o)
            for i, t, o in item_specs
        ],
    )


def test_valid_batch_parses_in_order() -> None:
    parsed = parse_batch(request(("a", 5, 0), ("b", 0, 7)), IDENTITY)
    assert parsed == [WorkItem("a", "x", 5, 0), WorkItem("b", "x", 0, 7)]


@pytest.mark.parametrize(
    ("req", "field"),
    [
        (request(), "items"),
        (request(("a", 1, 1), ("a", 2, 2)), "items[1].id"),
        (request(("", 1, 1)), "items[0].id"),
        (request(("a", 1, 1), ("b", 0, 0)), "items[1].input_tokens"),
        (request(("a", 1 << 20, 0)), "items[0].max_output_tokens"),
    ],
)
def test_invalid_batches_name_the_field(req: worker_pb2.ExecuteBatchRequest, field: str) -> None:
    with pytest.raises(RichError) as info:
        parse_batch(req, IDENTITY)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in info.value.field_violations] == [field]


def test_wrong_model_is_a_failed_precondition() -> None:
    with pytest.raises(RichError) as info:
        parse_batch(request(("a", 1, 1), model="other"), IDENTITY)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.reason == "WRONG_MODEL"
