"""Slot accounting: how many batches the device runs at once, and when one frees up.

What it decides: whether a new batch may start now. A replica has a fixed number of slots;
when all are taken the answer is *immediately* "busy" (no device-side queue — queueing is the
gateway's job, where deadlines are known), together with a computed retry delay: the
predicted time until the earliest running batch finishes (design section 3: every RetryInfo
is computed, never a constant). A batch already past its prediction gives the floor delay.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.clock import Clock

__all__ = ["SlotLease", "SlotTable", "SlotsBusy"]


class SlotsBusy(Exception):
    """Every slot is running a batch; ``retry_after_s`` predicts when one frees up."""

    def __init__(self, retry_after_s: float, busy: int, capacity: int) -> None:
        super().__init__(f"all {capacity} slots busy; one frees in ~{retry_after_s * 1000:.1f} ms")
        self.retry_after_s = retry_after_s
        self.busy = busy
        self.capacity = capacity


@dataclass(eq=False)
class SlotLease:
    """One running batch's hold on a slot."""

    batch_id: str
    started_at: float
    predicted_s: float

    @property
    def predicted_end(self) -> float:
        return self.started_at + self.predicted_s


class SlotTable:
    """A fixed number of slots, each held by at most one running batch."""

    def __init__(self, capacity: int, clock: Clock, min_retry_s: float = 0.001) -> None:
        if capacity < 1:
            raise ValueError("a replica needs at least one slot")
        self.capacity = capacity
        self._clock = clock
        self._min_retry_s = min_retry_s
        self._leases: set[SlotLease] = set()

    @property
    def busy(self) -> int:
        return len(self._leases)

    @property
    def free(self) -> int:
        return self.capacity - len(self._leases)

    def acquire(self, batch_id: str, predicted_s: float) -> SlotLease:
        """Take a slot now, or raise :class:`SlotsBusy` at once."""
        if len(self._leases) >= self.capacity:
            raise SlotsBusy(self.retry_after_s(), len(self._leases), self.capacity)
        lease = SlotLease(batch_id, self._clock.now(), max(0.0, predicted_s))
        self._leases.add(lease)
        return lease

    def release(self, lease: SlotLease) -> None:
        """Give the slot back (idempotent)."""
        self._leases.discard(lease)

    def retry_after_s(self) -> float:
        """Predicted wait until a slot frees: zero when one is free now."""
        if len(self._leases) < self.capacity:
            return 0.0
        earliest = min(lease.predicted_end for lease in self._leases)
        return max(self._min_retry_s, earliest - self._clock.now())
