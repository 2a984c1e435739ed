"""The rows of the batching benchmark, and the adapter that puts the gateway's batcher in one.

What it decides: which strategies the table compares, in which order (the order is also each
strategy's device-jitter stream: ``0xBEEF + index``, so the published rows keep their
published streams), and how each is configured.

Halcyon's row is not a re-implementation: :class:`GatewayBatcherScheduler` drives
:class:`gateway.batching.DeadlineBatcher` — the class the gateway serves traffic with — through
the simulator's interface, converting the trace's milliseconds to the batcher's seconds. The
simulated device is one replica with one slot. Its cost model starts from a prior of the
device's nominal constants and then learns from every batch, like the baselines' models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.baselines import FixedBatchScheduler, SeedDeadlineScheduler
from bench.sim import DeviceModel, DeviceState, SimScheduler
from bench.workload import TraceRequest
from common.clock import ManualClock
from gateway.batching import (
    BatcherConfig,
    DeadlineBatcher,
    Objective,
    OnlineCostModel,
    Rejected,
    ReplicaSlots,
)

DEVICE_REPLICA = "device"


class GatewayBatcherScheduler:
    """Runs the gateway's :class:`DeadlineBatcher` as a simulator strategy (ms ↔ s)."""

    def __init__(self, device: DeviceModel, config: BatcherConfig | None = None) -> None:
        self.clock = ManualClock(0.0)
        self.batcher: DeadlineBatcher[TraceRequest] = DeadlineBatcher(self.clock, config)
        self.batcher.add_replica(
            ReplicaSlots(DEVICE_REPLICA),
            cost_model=OnlineCostModel(device.intercept_ms / 1000.0, device.ms_per_token / 1000.0),
        )
        self._in_flight = 0

    def _at(self, now_ms: float) -> None:
        now = now_ms / 1000.0
        if now > self.clock.now():
            self.clock.set(now)

    def submit(self, request: TraceRequest, now: float) -> bool:
        self._at(now)
        result = self.batcher.submit(
            request, tokens=request.tokens, deadline=request.deadline_ms / 1000.0
        )
        return not isinstance(result, Rejected)

    def take(self, now: float) -> list[TraceRequest] | None:
        self._at(now)
        batch = self.batcher.take_batch(DEVICE_REPLICA)
        if batch is None:
            return None
        self._in_flight = batch.batch_id
        return [item.payload for item in batch.items]

    def next_wakeup(self, now: float, device_free: bool) -> float | None:
        wake = self.batcher.next_wakeup(now / 1000.0)
        return None if wake is None else wake * 1000.0

    def wake(self, now: float) -> None:
        self._at(now)
        self.batcher.poll()

    def completed(self, tokens: int, duration_ms: float, now: float) -> None:
        self._at(now)
        self.batcher.complete(self._in_flight, duration_ms / 1000.0)

    def take_dropped(self) -> list[TraceRequest]:
        return [dropped.item.payload for dropped in self.batcher.take_dropped()]


@dataclass(frozen=True, slots=True)
class Strategy:
    """One row of the table: a name, its jitter-stream index and how to build it."""

    name: str
    index: int
    build: Callable[[DeviceModel, DeviceState], SimScheduler]


def _no_batching(device: DeviceModel, state: DeviceState) -> SimScheduler:
    return FixedBatchScheduler(max_items=1, linger_ms=0.0, max_queue=512)


def _fixed(device: DeviceModel, state: DeviceState) -> SimScheduler:
    return FixedBatchScheduler(max_items=32, linger_ms=25.0, max_queue=512)


def _fixed_64(device: DeviceModel, state: DeviceState) -> SimScheduler:
    return FixedBatchScheduler(max_items=32, linger_ms=25.0, max_queue=64)


def _seed(device: DeviceModel, state: DeviceState) -> SimScheduler:
    return SeedDeadlineScheduler(
        device_remaining_ms=state.remaining_ms,
        prior_intercept_ms=device.intercept_ms,
        prior_ms_per_token=device.ms_per_token,
    )


def _halcyon(device: DeviceModel, state: DeviceState) -> SimScheduler:
    return GatewayBatcherScheduler(device, BatcherConfig(objective=Objective.ON_TIME_REQUESTS))


def _halcyon_tokens(device: DeviceModel, state: DeviceState) -> SimScheduler:
    return GatewayBatcherScheduler(device, BatcherConfig(objective=Objective.ON_TIME_TOKENS))


# Index = position = device jitter stream (0xBEEF + index); the first three are published.
STRATEGIES: tuple[Strategy, ...] = (
    Strategy("no batching", 0, _no_batching),
    Strategy("fixed batch (32 / 25ms, queue 512)", 1, _fixed),
    Strategy("original deadline-aware (seed)", 2, _seed),
    Strategy("fixed batch (32 / 25ms, queue 64)", 3, _fixed_64),
    Strategy("halcyon", 4, _halcyon),
)

HALCYON_TOKENS = Strategy("halcyon (on-time tokens)", 5, _halcyon_tokens)
