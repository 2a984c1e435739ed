"""The batcher's knobs, with defaults that need no tuning to a particular trace.

What it decides: the few limits that are genuinely facts about the deployment (device
ceilings, queue depth, timer resolution, shutdown behaviour) and the one policy choice an
operator should make deliberately (what to maximise under overload). Batch size and waiting
time are *not* here: they fall out of deadlines and the learned cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.batching.records import Objective


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    """Configuration of one :class:`~gateway.batching.batcher.DeadlineBatcher`."""

    # Resolution of the caller's timers. Slack below one tick cannot be spent (no runtime
    # honours a sub-tick timer), so a batch whose slack falls to a tick is flushed, and
    # ``next_wakeup`` is never less than a tick away — no busy-spin near saturation.
    tick_s: float = 0.001
    # Ceiling on deliberately holding a batch on an idle replica to let it grow.
    linger_s: float = 0.005
    # Device ceilings (compiled graph size, memory). A single request larger than the token
    # ceiling still runs, alone.
    max_batch_items: int = 256
    max_batch_tokens: int = 262_144
    # Backpressure: beyond this many queued requests, admission answers QUEUE_FULL.
    max_queue: int = 8192
    # A bulk request that has waited this long competes with interactive work by deadline.
    bulk_aging_s: float = 0.25
    # What to maximise when not everything can finish in time.
    objective: Objective = Objective.ON_TIME_REQUESTS
    # Recent arrivals the batch-duration horizon is chosen from (see ``horizon``);
    # ``horizon_s`` fixes it instead.
    deadline_window: int = 1024
    horizon_s: float | None = None
    # Prior for replicas added without their own cost model (refined by every batch).
    prior_intercept_s: float = 0.010
    prior_slope_s_per_token: float = 0.00005
    # Seconds per decode step of a batch's longest output (0: learned from data alone).
    prior_step_s: float = 0.0

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise ValueError("tick must be positive")
        if self.linger_s < 0 or self.bulk_aging_s < 0:
            raise ValueError("linger and bulk aging must be non-negative")
        if self.max_batch_items < 1 or self.max_batch_tokens < 1 or self.max_queue < 1:
            raise ValueError("batch and queue ceilings must be at least 1")
        if self.deadline_window < 1:
            raise ValueError("the deadline window must hold at least one arrival")
        if self.horizon_s is not None and self.horizon_s <= 0:
            raise ValueError("horizon must be positive")
