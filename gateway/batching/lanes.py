"""The batcher's state, and the two EDF lanes it queues requests in.

What it decides: where a queued request sits — the interactive lane or the bulk lane, each a
pair of parallel lists sorted by deadline (earliest first) — and when an aged bulk request is
promoted into the interactive lane. It also holds the bookkeeping every other part shares: the
replica record (``_Replica``), the refusal and drop counters, and the overflow record the shed
threshold learns from.

Why on its own: every other part of :class:`~gateway.batching.batcher.DeadlineBatcher` reads
and edits the lanes (admission inserts, planning drops, dispatch slices a prefix off), so they
build on this one base; keeping the lane invariants (sorted, the FIFO of bulk arrivals, the
queued-token count) in one place keeps them consistent.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from operator import attrgetter
from typing import Generic

from common.clock import Clock
from gateway.batching.config import BatcherConfig
from gateway.batching.cost_model import OnlineCostModel
from gateway.batching.deadline_mix import ArrivalMix, ArrivalWindow
from gateway.batching.planner import Plan, SlotView
from gateway.batching.records import (
    Batch,
    BatchItem,
    Dropped,
    DropReason,
    FlushReason,
    Lane,
    Objective,
    P,
    PredictionParts,
    Rejected,
    Seat,
)
from gateway.batching.shed_threshold import ShedThreshold

# Float slack: times are sums of seconds, so "exactly one tick" must compare as one tick.
_EPSILON = 1e-9
# Enum members read on every request, bound once: on Python 3.11 ``Lane.BULK`` is a descriptor
# call, several times dearer than reading a module global.
_INTERACTIVE = Lane.INTERACTIVE
_BULK = Lane.BULK


class _Replica(Generic[P]):
    """A replica the batcher plans onto: its record (by reference) and what is the batcher's
    own — its batches in flight, its cost model, whether it left planning."""

    __slots__ = ("capacity_credit", "in_flight", "model", "removed", "replica_id", "seat")

    def __init__(self, seat: Seat, model: OnlineCostModel) -> None:
        self.seat = seat
        self.replica_id = seat.replica_id
        self.model = model
        self.in_flight: dict[int, Batch[P]] = {}
        self.removed = False
        # Slots that freed while work was waiting; the next batch they take is "capacity".
        self.capacity_credit = 0

    @property
    def slots(self) -> int:
        return self.seat.slots

    def free_slots(self) -> int:
        return 0 if self.removed else self.seat.slots - len(self.in_flight)


class _LaneQueue(Generic[P]):
    """The batcher's state and its EDF lanes (the base of ``DeadlineBatcher``)."""

    def __init__(self, clock: Clock, config: BatcherConfig | None = None) -> None:
        self._clock = clock
        self._cfg = config or BatcherConfig()
        cfg = self._cfg
        self._tick = cfg.tick_s
        # Two EDF lanes as parallel sorted lists (deadlines, items). Aged bulk items move to
        # the interactive lists; ``_bulk_fifo`` finds them in arrival order.
        self._int_d: list[float] = []
        self._int: list[BatchItem[P]] = []
        self._bulk_d: list[float] = []
        self._bulk: list[BatchItem[P]] = []
        self._bulk_fifo: deque[BatchItem[P]] = deque()
        self._queued_tokens = 0
        self._seq = 0
        self._replicas: dict[str, _Replica[P]] = {}
        self._in_flight: dict[int, _Replica[P]] = {}
        self._next_batch_id = 1
        # Every arrival (for the horizon choice) and every admitted request (for the rate at
        # which work that overtakes under EDF arrives).
        self._mix = ArrivalWindow(cfg.deadline_window)
        self._overtaking = ArrivalMix(cfg.deadline_window)
        # (protected budget s, its tokens/s, horizon stretch): see ``horizon.choose_horizon``.
        self._protected: tuple[float, float, float] | None = None
        self._protected_at = -1  # ``self._mix.added`` when it was chosen
        self._slots_total = 0  # slots of replicas still in service
        self._free_total = 0  # of which free right now
        self._busy_total = 0  # batches in flight on replicas still in service
        self._plan: Plan[P] | None = None
        self._hopeless_at = math.inf  # when queued work may next become unservable
        self._horizon_stale = True
        self._risk_ok = True  # whether the last plan could afford risky requests
        self._since_replan = 0  # admissions checked against the cached plan since it was made
        self._planned_at = -math.inf
        self._plan_slots: list[SlotView] = []
        self._horizon = math.inf
        self._dropped: list[Dropped[P]] = []
        self._closed = False
        self._flushes = {reason.value: 0 for reason in FlushReason}
        self._drops = {reason.value: 0 for reason in DropReason}
        self._dispatched_items = 0
        self._completed = 0
        self._failed = 0
        self._threshold: ShedThreshold | None = (
            ShedThreshold() if cfg.objective is Objective.ON_TIME_REQUESTS else None
        )
        # Largest request dropped to resolve an overflow since the last dispatch (0: none).
        self._forced_since_dispatch = 0
        self._forced_count = 0
        self._largest_seen = 0
        # Queued (or since departed) items submitted with an ``avoid`` set; pruned lazily.
        self._avoiders: list[BatchItem[P]] = []
        self.withheld = 0
        """How many retries the last ``take_batch`` held back from its replica."""
        # Free replicas offered the queue that could take nothing but retries avoiding them:
        # until something changes, waking up for them would only spin (see ``next_wakeup``).
        self._withheld_idle: set[str] = set()

    def _queued(self) -> int:
        return len(self._int) + len(self._bulk)

    def _insert(self, item: BatchItem[P]) -> None:
        if item.lane is _INTERACTIVE or item.promoted:
            pos = bisect.bisect_right(self._int_d, item.deadline)
            self._int_d.insert(pos, item.deadline)
            self._int.insert(pos, item)
        else:
            pos = bisect.bisect_right(self._bulk_d, item.deadline)
            self._bulk_d.insert(pos, item.deadline)
            self._bulk.insert(pos, item)
            self._bulk_fifo.append(item)
        self._queued_tokens += item.tokens

    def _remove(self, item: BatchItem[P]) -> None:
        found = self._find(item)
        if found is None:  # pragma: no cover - callers remove only what is queued
            raise KeyError("item is not queued")
        deadlines, items, pos = found
        del deadlines[pos]
        del items[pos]
        self._queued_tokens -= item.tokens

    def _is_queued(self, item: BatchItem[P]) -> bool:
        return self._find(item) is not None

    def _find(self, item: BatchItem[P]) -> tuple[list[float], list[BatchItem[P]], int] | None:
        """The lane holding ``item`` (deadlines, items) and its index there, if queued."""
        if item.lane is _INTERACTIVE or item.promoted:
            deadlines, items = self._int_d, self._int
        else:
            deadlines, items = self._bulk_d, self._bulk
        pos = bisect.bisect_left(deadlines, item.deadline)
        while pos < len(items) and deadlines[pos] == item.deadline:
            if items[pos] is item:
                return deadlines, items, pos
            pos += 1
        return None

    def _promote_aged(self, now: float) -> None:
        fifo = self._bulk_fifo
        aging = self._cfg.bulk_aging_s - _EPSILON
        while fifo and now - fifo[0].arrival >= aging:
            item = fifo.popleft()
            pos = bisect.bisect_left(self._bulk_d, item.deadline)
            while pos < len(self._bulk) and self._bulk[pos] is not item:
                pos += 1
            if pos == len(self._bulk):
                continue  # already dispatched or dropped
            del self._bulk_d[pos]
            del self._bulk[pos]
            self._queued_tokens -= item.tokens
            item.promoted = True
            self._insert(item)

    def _reject(
        self,
        reason: DropReason,
        predicted: float | None,
        retry_after: float | None,
        parts: PredictionParts | None = None,
    ) -> Rejected:
        self._drops[reason.value] += 1
        return Rejected(reason, predicted, retry_after, parts)

    def _record_drop(self, item: BatchItem[P], reason: DropReason, predicted: float) -> None:
        self._drops[reason.value] += 1
        self._dropped.append(Dropped(item, reason, self._clock.now(), predicted))

    def _note_forced(self, tokens: int) -> None:
        """An overflow had to be resolved by shedding a request of ``tokens``."""
        self._forced_count += 1
        if tokens > self._forced_since_dispatch:
            self._forced_since_dispatch = tokens


# Sort and min/max keys, evaluated in C.
_FREE_AT = attrgetter("free_at")
_ARRIVAL = attrgetter("arrival")
_TOKENS = attrgetter("tokens")
_OUTPUT = attrgetter("output_tokens")
