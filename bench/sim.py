"""Event-driven simulation of one accelerator behind a batching scheduler.

What this decides: nothing about scheduling — it is the referee. It replays a trace against a
scheduler, runs the device the scheduler feeds, and scores the outcome. Every strategy gets the
same trace and the same device model, so the table compares schedulers and nothing else.

The device executes one batch at a time and has no queue of its own: modelling a downstream
queue would hide backpressure from the scheduler. A batch of ``n`` tokens takes
``(intercept + per_token × n) × (1 + (2U − 1) × jitter)`` with ``U`` drawn from a mulberry32
stream of its own (seeded ``0xBEEF + strategy index``), one draw per batch, in dispatch order —
the published device model.

Time moves from event to event (a heap of arrivals, batch completions and scheduler wake-ups),
never in fixed steps, so a run costs in proportion to the number of requests and batches, not
to simulated time. Schedulers see time in milliseconds here; the adapter for the gateway's
batcher converts to the seconds the gateway's clock uses.

Scoring follows the published definitions: goodput is requests finished by their deadline per
second of trace; a request that is rejected, evicted or shed counts against attainment exactly
like one served late (so refusing work never scores); queued work is drained after the last
arrival.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from bench.workload import URGENT, TraceRequest
from common.rng import Mulberry32

# Device jitter streams are mulberry32 seeded DEVICE_SEED + the strategy's index.
DEVICE_SEED = 0xBEEF


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """The simulated accelerator's service time: affine in batch tokens, with bounded jitter."""

    intercept_ms: float = 18.0
    ms_per_token: float = 0.022
    jitter: float = 0.08

    def nominal_ms(self, tokens: int) -> float:
        return self.intercept_ms + self.ms_per_token * tokens

    def duration_ms(self, tokens: int, u: float) -> float:
        """Service time for a batch of ``tokens`` given one uniform draw ``u`` in [0, 1)."""
        return self.nominal_ms(tokens) * (1.0 + (u * 2.0 - 1.0) * self.jitter)


class DeviceState:
    """What the device is doing, for strategies that (like the seed's) read its remaining work."""

    __slots__ = ("busy_until",)

    def __init__(self) -> None:
        self.busy_until = -1.0  # < 0: idle

    def remaining_ms(self, now: float) -> float:
        return max(0.0, self.busy_until - now) if self.busy_until >= 0.0 else 0.0


class SimScheduler(Protocol):
    """What the simulator needs from a strategy. Times are milliseconds on the trace timeline.

    The simulator calls ``submit`` on every arrival, ``take`` whenever the device is free after
    an event, ``next_wakeup`` after every event (``None`` = nothing to do until the next
    arrival or completion), and ``completed`` when a batch finishes. Requests the strategy
    refuses or drops are reported through ``take_dropped`` and count as shed.
    """

    def submit(self, request: TraceRequest, now: float) -> bool:
        """Offers a request; ``False`` means it was rejected at once (it counts as shed)."""
        ...

    def take(self, now: float) -> list[TraceRequest] | None:
        """The batch to start now on the (free) device, or ``None`` to leave it idle."""
        ...

    def next_wakeup(self, now: float, device_free: bool) -> float | None:
        """When to call ``wake`` next; a time not after ``now`` is a busy-spin and an error."""
        ...

    def wake(self, now: float) -> None:
        """Called at (or after) the time ``next_wakeup`` asked for, whether or not it is free."""
        ...

    def completed(self, tokens: int, duration_ms: float, now: float) -> None: ...

    def take_dropped(self) -> list[TraceRequest]:
        """Requests evicted or shed since the last call."""
        ...


@dataclass(slots=True)
class SimResult:
    """One (strategy, trace) cell of the benchmark table."""

    strategy: str
    rate: float
    offered: int
    on_time: int
    late: int
    shed: int
    goodput_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    urgent_slo: float
    relaxed_slo: float
    utilisation: float
    mean_batch: float
    batches: int
    wall_s: float = 0.0

    def as_json(self) -> dict[str, object]:
        """The documented ``--json`` record (one per strategy and rate)."""
        return {
            "strategy": self.strategy,
            "rate": self.rate,
            "goodput_per_s": round(self.goodput_per_s, 3),
            "p50_ms": round(self.p50_ms, 3),
            "p95_ms": round(self.p95_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
            "urgent_slo": round(self.urgent_slo, 5),
            "relaxed_slo": round(self.relaxed_slo, 5),
            "utilisation": round(self.utilisation, 5),
            "mean_batch": round(self.mean_batch, 3),
            "shed": self.shed,
            "late": self.late,
        }


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# Event kinds, ordered so that simultaneous events resolve as the published loop did:
# arrivals are admitted first, then the finished batch is retired, then wake-ups run.
_ARRIVAL = 0
_COMPLETION = 1
_WAKEUP = 2


def simulate(
    scheduler: SimScheduler,
    trace: Sequence[TraceRequest],
    *,
    strategy: str,
    rate: float,
    device: DeviceModel,
    device_seed: int,
    duration_s: float,
    device_state: DeviceState | None = None,
) -> SimResult:
    """Replays ``trace`` through ``scheduler`` on one device and scores the outcome."""
    started = time.perf_counter()
    jitter = Mulberry32(device_seed)
    events: list[tuple[float, int, int]] = []  # (time, kind, sequence)
    push, pop = heapq.heappush, heapq.heappop
    n = len(trace)
    if n:
        push(events, (trace[0].arrival_ms, _ARRIVAL, 0))

    in_flight: list[TraceRequest] = []
    in_flight_tokens = 0
    in_flight_duration = 0.0
    busy_until = -1.0  # < 0 means the device is free
    busy_ms = 0.0
    batches = 0
    dispatched = 0
    wake_at = math.inf  # the one wake-up currently armed (older heap entries are stale)
    wake_seq = 0

    latencies: list[float] = []
    on_time_by_cohort = {URGENT: 0, "relaxed": 0}
    late = 0
    shed = 0
    now = 0.0

    while events:
        now, kind, seq = pop(events)
        if kind == _ARRIVAL:
            request = trace[seq]
            if seq + 1 < n:
                push(events, (trace[seq + 1].arrival_ms, _ARRIVAL, seq + 1))
            if not scheduler.submit(request, now):
                shed += 1
        elif kind == _COMPLETION:
            for request in in_flight:
                latencies.append(now - request.arrival_ms)
                if now <= request.deadline_ms:
                    cohort = URGENT if request.cohort == URGENT else "relaxed"
                    on_time_by_cohort[cohort] += 1
                else:
                    late += 1
            scheduler.completed(in_flight_tokens, in_flight_duration, now)
            in_flight = []
            busy_until = -1.0
            if device_state is not None:
                device_state.busy_until = -1.0
        else:
            if seq != wake_seq:
                continue  # superseded by a later arming
            wake_at = math.inf
            scheduler.wake(now)

        shed += len(scheduler.take_dropped())
        if busy_until < 0.0:
            batch = scheduler.take(now)
            if batch:
                tokens = 0
                for request in batch:
                    tokens += request.tokens
                duration = device.duration_ms(tokens, jitter.random())
                in_flight_duration = duration
                in_flight = batch
                in_flight_tokens = tokens
                busy_until = now + duration
                if device_state is not None:
                    device_state.busy_until = busy_until
                busy_ms += duration
                batches += 1
                dispatched += len(batch)
                push(events, (busy_until, _COMPLETION, batches))
                shed += len(scheduler.take_dropped())
        wanted = scheduler.next_wakeup(now, busy_until < 0.0)
        if wanted is not None and wanted != wake_at:
            if wanted <= now:
                raise RuntimeError(f"{strategy}: asked to be woken at {wanted} <= now {now}")
            wake_at = wanted
            wake_seq += 1
            push(events, (wake_at, _WAKEUP, wake_seq))
        elif wanted is None and wake_at != math.inf:
            wake_at = math.inf
            wake_seq += 1  # disarm: the queued entry becomes stale

    offered = n
    urgent_offered = sum(1 for r in trace if r.cohort == URGENT)
    relaxed_offered = offered - urgent_offered
    on_time = on_time_by_cohort[URGENT] + on_time_by_cohort["relaxed"]
    latencies.sort()
    return SimResult(
        strategy=strategy,
        rate=rate,
        offered=offered,
        on_time=on_time,
        late=late,
        shed=shed,
        goodput_per_s=on_time / duration_s,
        p50_ms=quantile(latencies, 0.50),
        p95_ms=quantile(latencies, 0.95),
        p99_ms=quantile(latencies, 0.99),
        urgent_slo=on_time_by_cohort[URGENT] / urgent_offered if urgent_offered else 1.0,
        relaxed_slo=on_time_by_cohort["relaxed"] / relaxed_offered if relaxed_offered else 1.0,
        utilisation=min(1.0, busy_ms / (duration_s * 1000.0)),
        mean_batch=dispatched / batches if batches else 0.0,
        batches=batches,
        wall_s=time.perf_counter() - started,
    )
