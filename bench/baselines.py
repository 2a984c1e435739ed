"""The strategies Halcyon is measured against, rebuilt from their published descriptions.

What this decides: how the comparison rows of the benchmark table schedule work. None of this
is Halcyon's batcher (that lives in ``gateway.batching`` and the simulator drives it directly);
these exist so that every figure in the table is produced by the same simulator, on the same
trace, on the same device.

* ``FixedBatchScheduler`` — FIFO, a bounded queue that rejects when full, a batch of at most
  ``max_items`` dispatched when the device is free and either the batch is full or the oldest
  request has lingered ``linger_ms``. Deadline-blind: it serves late work rather than dropping
  it. With ``max_items=1, linger_ms=0`` it is the "no batching" row.
* ``SeedDeadlineScheduler`` — the original deadline-aware algorithm as the seed describes it:
  earliest-deadline-first, batches capped at 32 items / 16,384 tokens, a 25 ms linger ceiling,
  a 4 ms safety margin, a slack test on the queue head, and an *optimistic* admission test that
  counts queued work ahead of the newcomer but not the work that will share its batch beyond
  its own, and that evicts queued work only once its deadline has already passed. Its cost model
  is the seed's decayed ordinary-least-squares fit, which refuses to refit when batch sizes are
  too uniform. Reproducing it (rather than quoting its numbers) keeps every comparison on the
  same footing and lets the reader see its defects in action.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable

from bench.workload import TraceRequest


class FixedBatchScheduler:
    """FIFO batching with a size cap, a linger timeout and a bounded queue."""

    def __init__(self, *, max_items: int, linger_ms: float, max_queue: int) -> None:
        if max_items < 1 or max_queue < 1 or linger_ms < 0:
            raise ValueError("fixed batching needs max_items >= 1, max_queue >= 1, linger >= 0")
        self._max_items = max_items
        self._linger = linger_ms
        self._max_queue = max_queue
        self._queue: deque[TraceRequest] = deque()
        self._enqueued: deque[float] = deque()

    def submit(self, request: TraceRequest, now: float) -> bool:
        if len(self._queue) >= self._max_queue:
            return False
        self._queue.append(request)
        self._enqueued.append(now)
        return True

    def take(self, now: float) -> list[TraceRequest] | None:
        queue = self._queue
        if not queue:
            return None
        if len(queue) < self._max_items and now < self._enqueued[0] + self._linger:
            return None
        count = min(self._max_items, len(queue))
        batch = [queue.popleft() for _ in range(count)]
        for _ in range(count):
            self._enqueued.popleft()
        return batch

    def next_wakeup(self, now: float, device_free: bool) -> float | None:
        if not device_free or not self._queue:
            return None  # the device's completion (or the next arrival) is the next decision
        return self._enqueued[0] + self._linger

    def wake(self, now: float) -> None:
        return None

    def completed(self, tokens: int, duration_ms: float, now: float) -> None:
        return None

    def take_dropped(self) -> list[TraceRequest]:
        return []


class SeedCostModel:
    """The seed's batch cost fit: exponentially decayed ordinary least squares.

    Kept as published, defects included: it refits only once the decayed sample weight reaches
    four and the spread of batch sizes passes a conditioning test (so with near-uniform batches
    it never learns), and it clamps a negative slope or intercept by re-solving with that
    coefficient held at zero.
    """

    def __init__(self, intercept: float, slope: float, forgetting: float = 0.98) -> None:
        self.intercept = intercept
        self.slope = slope
        self._g = forgetting
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe(self, tokens: float, duration: float) -> None:
        g = self._g
        self._n = self._n * g + 1.0
        self._sx = self._sx * g + tokens
        self._sy = self._sy * g + duration
        self._sxx = self._sxx * g + tokens * tokens
        self._sxy = self._sxy * g + tokens * duration
        if self._n < 4.0:
            return
        n, sx = self._n, self._sx
        spread = n * self._sxx - sx * sx
        mean_x = sx / n
        if spread < 1e-3 * n * n * max(1.0, mean_x * mean_x):
            return
        slope = (n * self._sxy - sx * self._sy) / spread
        intercept = (self._sy - slope * sx) / n
        if slope < 0.0:
            slope, intercept = 0.0, self._sy / n
        if intercept < 0.0:
            intercept = 0.0
            slope = self._sxy / self._sxx if self._sxx > 0 else 0.0
        self.slope, self.intercept = slope, intercept

    def predict(self, tokens: float) -> float:
        return self.intercept + self.slope * tokens


class SeedDeadlineScheduler:
    """The original deadline-aware batcher (EDF, optimistic feasibility), one device."""

    POLL_MS = 5.0  # re-check cadence while the device is busy (expiry of overdue work)
    QUANTUM_MS = 1.0  # shortest timer the seed would arm

    def __init__(
        self,
        *,
        device_remaining_ms: Callable[[float], float],
        prior_intercept_ms: float,
        prior_ms_per_token: float,
        max_items: int = 32,
        max_tokens: int = 16_384,
        max_queue: int = 512,
        linger_ms: float = 25.0,
        margin_ms: float = 4.0,
    ) -> None:
        self._remaining = device_remaining_ms
        self._model = SeedCostModel(prior_intercept_ms, prior_ms_per_token)
        self._max_items = max_items
        self._max_tokens = max_tokens
        self._max_queue = max_queue
        self._linger = linger_ms
        self._margin = margin_ms
        # EDF queue as parallel lists sorted by deadline (ties keep arrival order).
        self._deadlines: list[float] = []
        self._tokens: list[int] = []
        self._items: list[TraceRequest] = []
        self._enqueued: list[float] = []
        self._dropped: list[TraceRequest] = []
        self._wake: float | None = None

    # -- the simulator's interface -------------------------------------------------------

    def submit(self, request: TraceRequest, now: float) -> bool:
        if len(self._items) >= self._max_queue:
            return False
        deadline = request.deadline_ms
        pos = bisect.bisect_right(self._deadlines, deadline)
        ahead_tokens = sum(self._tokens[:pos]) + request.tokens
        ahead_count = pos + 1
        batches = max(
            1, math.ceil(ahead_count / self._max_items), math.ceil(ahead_tokens / self._max_tokens)
        )
        projected = (
            batches * self._model.intercept
            + self._model.slope * ahead_tokens
            + self._remaining(now)
        )
        if deadline - now < projected + self._margin:
            return False
        self._deadlines.insert(pos, deadline)
        self._tokens.insert(pos, request.tokens)
        self._items.insert(pos, request)
        self._enqueued.insert(pos, now)
        return True

    def take(self, now: float) -> list[TraceRequest] | None:
        self._expire(now)
        self._wake = None
        if not self._items:
            return None
        size, tokens, capped = self._project()
        if capped or size >= self._max_items or tokens >= self._max_tokens:
            return self._flush(size)
        slack = self._deadlines[0] - now - (self._model.predict(tokens) + self._margin)
        linger_left = self._linger - (now - min(self._enqueued))
        if slack <= 0.0 or linger_left <= 0.0:
            return self._flush(size)
        wait = min(slack, linger_left)
        if wait < self.QUANTUM_MS:
            return self._flush(size)
        self._wake = now + wait
        return None

    def next_wakeup(self, now: float, device_free: bool) -> float | None:
        if not self._items:
            return None
        if not device_free:
            # Busy device: poll for overdue work, or wake at the head's deadline if sooner.
            until_expiry = self._deadlines[0] - now
            return now + max(self.QUANTUM_MS, min(self.POLL_MS, until_expiry))
        return self._wake

    def wake(self, now: float) -> None:
        self._expire(now)

    def completed(self, tokens: int, duration_ms: float, now: float) -> None:
        self._model.observe(tokens, duration_ms)

    def take_dropped(self) -> list[TraceRequest]:
        dropped, self._dropped = self._dropped, []
        return dropped

    # -- internals -----------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        """Evicts work whose deadline has *already passed* — the seed's (late) rule."""
        cut = bisect.bisect_right(self._deadlines, now)
        if cut:
            self._dropped.extend(self._items[:cut])
            del self._deadlines[:cut], self._tokens[:cut], self._items[:cut]
            del self._enqueued[:cut]

    def _project(self) -> tuple[int, int, bool]:
        size = tokens = 0
        for t in self._tokens:
            if size + 1 > self._max_items or (size > 0 and tokens + t > self._max_tokens):
                return size, tokens, True
            size += 1
            tokens += t
        return size, tokens, False

    def _flush(self, size: int) -> list[TraceRequest]:
        batch = self._items[:size]
        del self._deadlines[:size], self._tokens[:size], self._items[:size]
        del self._enqueued[:size]
        return batch
