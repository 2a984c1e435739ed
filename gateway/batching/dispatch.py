"""Dispatch and flush: which batch leaves on a free slot, and why now.

What it decides: for a replica with a free slot, whether the first batch of a fresh plan
leaves now and with which ``FlushReason`` — ``capacity`` (the slot freed with work waiting),
``full``, ``deadline`` (one more tick would breach a member) or ``linger`` — or ``None`` to keep
waiting (``_take``); the bookkeeping of a dispatched batch (``_dispatch``: the lanes lose the
batch's prefix, the shed threshold learns from the overflows since the last dispatch); and
which retries are held out of a replica they avoid (``_withhold``).

Why on its own: dispatch consumes the plan that ``capacity`` builds and is the only place a
batch is created; admission never dispatches.
"""

from __future__ import annotations

from gateway.batching.capacity import _CapacityPlanner
from gateway.batching.lanes import _ARRIVAL, _EPSILON, _TOKENS, _Replica
from gateway.batching.planner import Plan, PlannedBatch
from gateway.batching.records import Batch, BatchItem, FlushReason, P


class _Dispatcher(_CapacityPlanner[P]):
    """Taking batches for free slots, and the retries held out of them."""

    def take_batch(self, replica_id: str) -> Batch[P] | None:
        """The batch to run now on a free slot of ``replica_id``, or ``None`` to keep waiting.

        Retries that avoid ``replica_id`` are held out of it (``withheld`` says how many), so
        ``None`` may mean "nothing for this replica": offer another one.
        """
        self.withheld = 0
        replica = self._replicas.get(replica_id)
        if replica is None or replica.free_slots() <= 0:
            return None
        if not self._queued():
            replica.capacity_credit = 0
            return None
        if not self._avoiders:
            return self._take(replica)
        held = self._withhold(replica_id)
        if not held:
            return self._take(replica)
        self.withheld = len(held)
        try:
            if not self._queued():
                replica.capacity_credit = 0
                self._withheld_idle.add(replica_id)
                return None
            return self._take(replica)
        finally:
            for item in held:
                # A bulk item gets a second aging entry; the first one left (or still there)
                # is skipped once it is promoted or gone.
                self._insert(item)
            self._plan = None  # planned without them: no longer a description of the queue

    def _withhold(self, replica_id: str) -> list[BatchItem[P]]:
        """Takes out of the lanes the queued retries that avoid ``replica_id`` while another
        replica could serve them; forgets avoiders that are no longer queued."""
        others = [r.replica_id for r in self._replicas.values() if not r.removed]
        held: list[BatchItem[P]] = []
        keep: list[BatchItem[P]] = []
        for item in self._avoiders:
            if not self._is_queued(item):
                continue
            keep.append(item)
            if replica_id in item.avoid and any(o not in item.avoid for o in others):
                self._remove(item)
                held.append(item)
        self._avoiders = keep
        return held

    def _take(self, replica: _Replica[P]) -> Batch[P] | None:
        now = self._clock.now()
        plan = self._replan(now, replica, self._balance_cap(replica))
        if not plan.batches:
            replica.capacity_credit = 0
            return None
        first = plan.batches[0]
        reason: FlushReason | None = None
        if replica.capacity_credit > 0:
            reason = FlushReason.CAPACITY
        elif plan.first_full:
            reason = FlushReason.FULL
        elif first.min_deadline - first.upper_end <= self._tick + _EPSILON:
            reason = FlushReason.DEADLINE
        elif now - min(map(_ARRIVAL, first.items)) >= self._cfg.linger_s - _EPSILON:
            # With no linger configured nothing waited on purpose: the batch left because a
            # replica was free, which is what CAPACITY means.
            reason = FlushReason.LINGER if self._cfg.linger_s > 0 else FlushReason.CAPACITY
        if reason is None:
            return None
        return self._dispatch(plan, first, replica, reason, now)

    def _dispatch(
        self,
        plan: Plan[P],
        first: PlannedBatch[P],
        replica: _Replica[P],
        reason: FlushReason,
        now: float,
    ) -> Batch[P]:
        items = first.items
        # The first planned batch is a prefix of the lanes in plan order (interactive, then
        # bulk): remove it by slicing rather than item by item.
        n_int = min(len(items), len(self._int))
        del self._int[:n_int]
        del self._int_d[:n_int]
        n_bulk = len(items) - n_int
        if n_bulk:
            del self._bulk[:n_bulk]
            del self._bulk_d[:n_bulk]
        self._queued_tokens -= first.tokens
        model = replica.model
        batch = Batch(
            batch_id=self._next_batch_id,
            replica_id=replica.replica_id,
            items=items,
            tokens=first.tokens,
            reason=reason,
            dispatched_at=now,
            predicted_seconds=first.cost,
            predicted_upper_seconds=first.cost * model.upper_factor,
        )
        self._next_batch_id += 1
        replica.in_flight[batch.batch_id] = batch
        self._in_flight[batch.batch_id] = replica
        self._refresh_capacity()
        if replica.capacity_credit > 0:
            replica.capacity_credit -= 1
        if self._threshold is not None:
            largest = max(map(_TOKENS, self._int), default=0)
            self._threshold.after_dispatch(
                self._forced_count,
                self._forced_since_dispatch,
                self._has_spare(plan, now),
                largest,
                self._largest_seen,
            )
        self._forced_since_dispatch = 0
        self._forced_count = 0
        self._flushes[reason.value] += 1
        self._dispatched_items += len(items)
        # The rest of the plan already assumes this batch runs on this slot from now on.
        del plan.batches[0]
        self._hopeless_at = self._hopeless_time(plan, self._plan_slots)
        return batch
