"""The deadline-aware batcher for one (model, version): admit, wait, flush, shed, drain.

What it decides, for every request and every free replica slot — and where each part lives:

* **Admission** (``submit``, here; the check in ``feasibility``): queue the request, or refuse
  it at once with a typed reason and the evidence — ``DEADLINE_UNREACHABLE`` with the predicted
  completion when, counting the work queued ahead of it under EDF, the work sharing its batch
  and the work on the device, it would finish too late; ``QUEUE_FULL`` or ``NO_CAPACITY``
  otherwise. When it is late only because a *larger* request is queued ahead, that one is shed
  instead (Moore–Hodgson). Under sustained overload a request above the learned size limit
  (``shed_threshold``) is refused as ``SHED_FOR_GOODPUT``.
* **Dispatch** (``take_batch``, in ``dispatch``): for a replica with a free slot, the first
  batch of the current plan and why it leaves now (``capacity``, ``full``, ``deadline``,
  ``linger``), or ``None``: keep waiting until ``next_wakeup`` (here).
* **Capacity and planning** (``capacity``): replicas and their slots, the horizon, the
  straggler cap and the whole-queue re-plan whose drops — ``DEADLINE_MISSED`` the moment a
  request cannot make it even alone, ``SHED_FOR_GOODPUT`` when dropping it lets more finish in
  time — are handed out by ``take_dropped`` so each caller gets an answer.
* **The EDF lanes** (``lanes``): interactive and bulk, each sorted by deadline; aged bulk work
  is promoted. The shared state of the batcher lives there too.
* **Retries avoid where they failed** (``dispatch``): a request submitted with ``avoid`` is
  held out of batches for those replicas while any other replica is in service (ADR 0011).
* **Learning and pricing**: ``complete`` (here) feeds the measured device time to that
  replica's own :class:`~gateway.batching.cost_model.OnlineCostModel`; every batch costs
  ``(intercept + step × longest) + slope × tokens``, ``longest`` its largest output budget.
* **Shutdown** (here): ``close`` stops admission (queued work keeps being dispatched);
  ``drain`` returns everything still queued. Nothing is dropped silently.

The batcher is pure policy: no I/O, no timers of its own, time from an injected ``Clock``
(seconds). The simulator and the gateway drive the same class: the simulator with one replica
of one slot, the gateway with many replicas of several slots each.

Cost: admission is ``O(log n + b)`` against the cached plan (``b`` = planned batches, a
handful); the plan is rebuilt in one ``O(n)`` pass on every dispatch and after every few
admissions, because incremental updates cannot move batch boundaries the way a fresh plan does.
Both run thousands of times a second, so their constant factors matter too: the hot paths read
each value once and spell out ``min``/``max`` where a comparison gives the same result.

This module keeps the public class, :class:`DeadlineBatcher` (built on ``_Feasibility`` and
``_Dispatcher``, both on ``_CapacityPlanner`` on ``_LaneQueue``), and re-exports the moved
names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.batching.capacity import _RECHOOSE_EVERY, _THRESHOLD_FLOOR, _CapacityPlanner
from gateway.batching.cost_model import CostSnapshot
from gateway.batching.dispatch import _Dispatcher
from gateway.batching.feasibility import _Feasibility
from gateway.batching.lanes import (
    _ARRIVAL,
    _BULK,
    _EPSILON,
    _FREE_AT,
    _INTERACTIVE,
    _OUTPUT,
    _TOKENS,
    _LaneQueue,
    _Replica,
)
from gateway.batching.records import (
    Accepted,
    Batch,
    BatchItem,
    Dropped,
    DropReason,
    Lane,
    P,
    PredictionParts,
    Rejected,
)

__all__ = [
    "_ARRIVAL",
    "_BULK",
    "_EPSILON",
    "_FREE_AT",
    "_INTERACTIVE",
    "_OUTPUT",
    "_RECHOOSE_EVERY",
    "_THRESHOLD_FLOOR",
    "_TOKENS",
    "BatcherSnapshot",
    "DeadlineBatcher",
    "_CapacityPlanner",
    "_Dispatcher",
    "_Feasibility",
    "_LaneQueue",
    "_Replica",
]

# Admissions checked against a cached plan before it is rebuilt: the cached plan is updated
# incrementally, but batch boundaries drift from what a fresh plan would choose.
_REPLAN_EVERY = 8


@dataclass(frozen=True, slots=True)
class BatcherSnapshot:
    """Counters and state for metrics (``halcyon_batcher_*``)."""

    queued: int
    queued_tokens: int
    in_flight_batches: int
    horizon_s: float | None
    flushes: dict[str, int]
    drops: dict[str, int]
    dispatched_items: int
    completed_batches: int
    failed_batches: int
    cost_models: dict[str, CostSnapshot] = field(default_factory=dict)


class DeadlineBatcher(_Feasibility[P], _Dispatcher[P]):
    """Earliest-deadline-first batching with feasibility, goodput shedding and per-replica cost.

    Usage is documented in the package docstring (:mod:`gateway.batching`).
    """

    def submit(
        self,
        payload: P,
        *,
        tokens: int,
        deadline: float,
        lane: Lane = Lane.INTERACTIVE,
        avoid: frozenset[str] = frozenset(),
        output_tokens: int = 0,
    ) -> Accepted[P] | Rejected:
        """Queues a request, or refuses it at once with a typed reason.

        ``tokens`` is its work (input plus output budget); ``output_tokens`` its output budget
        alone (0 when unknown), which decides how many decode steps a batch holding it runs.
        ``avoid`` names replicas the request must not be batched onto while another replica is
        in service (those its earlier attempts failed on).
        """
        if tokens < 1:
            raise ValueError(f"a request needs at least one token, got {tokens}")
        if output_tokens < 0:
            raise ValueError(f"an output budget cannot be negative, got {output_tokens}")
        now = self._clock.now()
        if self._closed:
            return self._reject(DropReason.CLOSED, None, None)
        if self._free_total == 0 and self._busy_total == 0:
            return self._reject(DropReason.NO_CAPACITY, None, None)
        if len(self._int) + len(self._bulk) >= self._cfg.max_queue:
            return self._reject(DropReason.QUEUE_FULL, None, self._drain_estimate(now))
        relative = deadline - now
        self._mix.add(relative, tokens, now)
        if tokens > self._largest_seen:
            self._largest_seen = tokens
        self._seq += 1
        item = BatchItem(payload, tokens, deadline, lane, now, self._seq)
        if output_tokens:
            item.output_tokens = output_tokens
        if deadline <= now:
            return self._reject(
                DropReason.DEADLINE_UNREACHABLE, now, None, PredictionParts(deadline - now)
            )
        threshold = self._threshold
        if threshold is not None and tokens > threshold.theta and self._backlogged(now):
            return self._reject(DropReason.SHED_FOR_GOODPUT, None, self._drain_estimate(now))

        if self._free_total > 0 and not self._int and not self._bulk:
            # Nothing queued and a slot idle: the request would run alone, now.
            verdict = self._admit_alone(item, now)
        else:
            plan = self._plan
            # An idle slot makes the plan's start times go stale as the clock moves; within a
            # tick (a burst of arrivals handled together) the plan, grown in place by _admit,
            # still describes the queue, and re-planning per arrival would cost O(n^2).
            stale = self._free_total > 0 and now - self._planned_at >= self._tick
            if plan is None or stale or self._since_replan >= _REPLAN_EVERY:
                plan = self._replan(now, None)
            self._since_replan += 1
            verdict = self._admit(plan, item, now)
        if isinstance(verdict, Rejected):
            return verdict
        if self._withheld_idle:
            self._withheld_idle.clear()
        if avoid:
            item.avoid = avoid
            self._avoiders.append(item)
        self._insert(item)
        self._overtaking.add(relative, tokens, now)
        return Accepted(item, verdict)

    # -- outcomes ------------------------------------------------------------------------

    def complete(self, batch: Batch[P] | int, measured_seconds: float) -> None:
        """A batch finished: its slot frees and its replica's cost model learns the timing."""
        replica, found = self._finish(batch)
        replica.model.observe(found.tokens, measured_seconds, found.longest)
        self._completed += 1

    def fail(self, batch: Batch[P] | int, *, requeue: bool = False) -> list[BatchItem[P]]:
        """A batch failed: its slot frees, the cost model is untouched.

        With ``requeue`` its requests go back into the queue (the plan then decides whether
        they can still make it) and nothing is returned; otherwise they are returned for the
        caller to answer.
        """
        _replica, found = self._finish(batch)
        self._failed += 1
        if not requeue:
            return list(found.items)
        for item in found.items:
            self._insert(item)
        return []

    def _finish(self, batch: Batch[P] | int) -> tuple[_Replica[P], Batch[P]]:
        batch_id = batch if isinstance(batch, int) else batch.batch_id
        replica = self._in_flight.pop(batch_id, None)
        if replica is None:
            raise KeyError(f"batch {batch_id} is not in flight")
        found = replica.in_flight.pop(batch_id)
        if replica.removed:
            if not replica.in_flight and self._replicas.get(replica.replica_id) is replica:
                del self._replicas[replica.replica_id]
        elif self._queued():
            replica.capacity_credit += 1
        self._refresh_capacity()
        self._plan = None
        self._horizon_stale = True
        self._withheld_idle.clear()
        return replica, found

    def take_dropped(self) -> list[Dropped[P]]:
        """Requests shed or evicted since the last call; answer each one."""
        dropped, self._dropped = self._dropped, []
        return dropped

    # -- time ----------------------------------------------------------------------------

    def next_wakeup(self, now: float | None = None) -> float | None:
        """When to call ``poll``/``take_batch`` next without any other event; never within a tick.

        ``None`` when nothing is queued. After any event (submit, complete, fail) callers
        should offer each free replica a ``take_batch`` first.
        """
        if not self._int and not self._bulk:
            return None
        if now is None:
            now = self._clock.now()
        plan = self._plan
        if plan is None:
            plan = self._replan(now, None)
        wake = self._hopeless_at
        if plan.batches and self._free_total > 0 and not self._free_wait_for_others():
            first = plan.batches[0]
            if plan.first_full or any(r.capacity_credit > 0 for r in self._replicas.values()):
                wake = now
            else:
                flush_by = first.start + (first.min_deadline - first.upper_end) - self._tick
                linger_by = min(map(_ARRIVAL, first.items)) + self._cfg.linger_s
                wake = min(wake, flush_by, linger_by)
        if self._bulk_fifo:
            wake = min(wake, self._bulk_fifo[0].arrival + self._cfg.bulk_aging_s)
        if not self._int and not self._bulk:
            return None
        earliest = now + self._tick
        return earliest if earliest > wake else wake  # max(wake, earliest)

    def _free_wait_for_others(self) -> bool:
        """Whether every free replica was offered the queue since the last change and could
        take nothing but retries that avoid it (so only another replica freeing helps)."""
        if not self._withheld_idle:
            return False
        for r in self._replicas.values():
            if not r.removed and r.free_slots() > 0 and r.replica_id not in self._withheld_idle:
                return False
        return True

    def poll(self) -> None:
        """Promotes aged bulk work and evicts work that can no longer make its deadline."""
        now = self._clock.now()
        fifo = self._bulk_fifo
        if (
            self._plan is None
            or now >= self._hopeless_at
            or (fifo and now - fifo[0].arrival >= self._cfg.bulk_aging_s - _EPSILON)
        ):
            self._replan(now, None)

    # -- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        """Stops admitting (``CLOSED``); queued work is still dispatched until drained."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def drain(self) -> list[BatchItem[P]]:
        """Removes and returns everything still queued, in plan order, for the caller to answer."""
        items = self._int + self._bulk
        self._int, self._int_d, self._bulk, self._bulk_d = [], [], [], []
        self._bulk_fifo.clear()
        self._queued_tokens = 0
        self._plan = None
        return items

    # -- observability -------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return len(self._int) + len(self._bulk)

    @property
    def horizon(self) -> float:
        """The current cap on one batch's expected duration (``inf`` before any traffic)."""
        return self._horizon

    def queued_items(self) -> list[BatchItem[P]]:
        """Everything queued, in plan order (interactive EDF, then bulk EDF)."""
        return self._int + self._bulk

    def snapshot(self) -> BatcherSnapshot:
        return BatcherSnapshot(
            queued=self._queued(),
            queued_tokens=self._queued_tokens,
            in_flight_batches=len(self._in_flight),
            horizon_s=None if math.isinf(self._horizon) else self._horizon,
            flushes=dict(self._flushes),
            drops=dict(self._drops),
            dispatched_items=self._dispatched_items,
            completed_batches=self._completed,
            failed_batches=self._failed,
            cost_models={r.replica_id: r.model.snapshot() for r in self._replicas.values()},
        )
