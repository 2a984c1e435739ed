"""Replica capacity and the plan over it: slots, horizon, balance, backlog and re-planning.

What it decides: which replicas (and how many of their slots) the queue is planned onto and
when each slot frees (``_slot_views``); how long one batch may run (the horizon, chosen from the
arrival mix by ``horizon.choose_horizon``, and the straggler cap ``_balance_cap``); whether the
queue is backlogged (the shed threshold's precondition and the plan's risk allowance); and the
whole-queue re-plan (``_replan``) that applies the planner's drops and caches the result, with
the time queued work may next become unservable.

Why on its own: admission and dispatch both read the cached plan and the capacity behind it,
but neither decides it; membership changes (``add_replica`` / ``remove_replica``) only
invalidate it here.
"""

from __future__ import annotations

import math

from gateway.batching.cost_model import OnlineCostModel
from gateway.batching.horizon import choose_horizon, protecting_horizon
from gateway.batching.lanes import _FREE_AT, _OUTPUT, _LaneQueue, _Replica
from gateway.batching.planner import Plan, SlotView, plan_batches
from gateway.batching.records import DropReason, P, Seat

# Arrivals between two choices of which deadline class the horizon protects (one window).
_RECHOOSE_EVERY = 1024
# The shed threshold never falls below this share of the fluid estimate's size cut.
_THRESHOLD_FLOOR = 0.5


class _CapacityPlanner(_LaneQueue[P]):
    """Replicas, their slots and the cached plan over them."""

    # -- replicas ------------------------------------------------------------------------

    def add_replica(self, seat: Seat, *, cost_model: OnlineCostModel | None = None) -> None:
        """Adds (or re-adds, or takes the new record of) a replica that runs ``seat.slots``
        concurrent batches, with its own cost model."""
        if seat.slots < 1:
            raise ValueError("a replica needs at least one slot")
        replica_id = seat.replica_id
        existing = self._replicas.get(replica_id)
        if existing is not None and not existing.removed:
            existing.seat = seat
            if cost_model is not None:
                existing.model = cost_model
        else:
            model = cost_model
            if model is None:
                model = (
                    existing.model
                    if existing is not None
                    else OnlineCostModel(
                        self._cfg.prior_intercept_s,
                        self._cfg.prior_slope_s_per_token,
                        prior_step_s=self._cfg.prior_step_s,
                    )
                )
            replica: _Replica[P] = _Replica(seat, model)
            if existing is not None:
                replica.in_flight = existing.in_flight
                for batch_id in replica.in_flight:
                    self._in_flight[batch_id] = replica
            self._replicas[replica_id] = replica
            if self._queued():
                replica.capacity_credit = replica.free_slots()
        self._refresh_capacity()
        self._plan = None
        self._horizon_stale = True
        self._withheld_idle.clear()

    def remove_replica(self, replica_id: str) -> None:
        """Stops planning work onto a replica. Its in-flight batches still report back."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        replica.removed = True
        replica.capacity_credit = 0
        if not replica.in_flight:
            del self._replicas[replica_id]
        self._refresh_capacity()
        self._plan = None
        self._horizon_stale = True
        self._withheld_idle.clear()

    def replica_ids(self) -> list[str]:
        return [r.replica_id for r in self._replicas.values() if not r.removed]

    def free_replicas(self) -> list[str]:
        """Replicas with a free slot, in the order they were added."""
        free: list[str] = []  # a plain loop: cheaper than a comprehension on a few replicas
        for r in self._replicas.values():
            if not r.removed and r.slots > len(r.in_flight):
                free.append(r.replica_id)
        return free

    def cost_model(self, replica_id: str) -> OnlineCostModel:
        return self._replicas[replica_id].model

    # -- capacity and the plan -----------------------------------------------------------

    def _refresh_capacity(self) -> None:
        slots = free = busy = 0
        for replica in self._replicas.values():
            if not replica.removed:
                slots += replica.slots
                free += replica.free_slots()
                busy += len(replica.in_flight)
        self._slots_total, self._free_total, self._busy_total = slots, free, busy

    def _opportunistic_below(self) -> float:
        """Budgets under this are in classes the horizon does not protect (0: none)."""
        if self._protected is None or self._cfg.horizon_s is not None:
            return 0.0
        budget, _rate, stretch = self._protected
        if math.isinf(budget):
            return 0.0
        # A stretched horizon half-protects its budget's class; otherwise classes tighter
        # than the protected one (10 % grouping, as in ``horizon.deadline_classes``).
        return budget * 1.1 if stretch > 1.0 else budget * 0.999

    def _backlogged(self, now: float) -> bool:
        """Is there more queued work than the next horizon can serve (the shed threshold's
        precondition: without a backlog there is nothing to protect by refusing work)?"""
        if self._free_total > 0:
            return False
        plan = self._plan
        if plan is None:
            return bool(self._int or self._bulk)
        return not self._has_spare(plan, now)

    def _has_spare(self, plan: Plan[P], now: float) -> bool:
        """Is the queue short of a backlog (all of it started within the protected budget)?"""
        if not plan.batches:
            return True
        budget = self._protected[0] if self._protected is not None else math.inf
        reach = budget if math.isfinite(budget) else self._horizon
        return plan.batches[-1].start - now < reach

    def _drain_estimate(self, now: float) -> float:
        """Predicted seconds until the queued work has been dispatched (for retry advice)."""
        plan = self._plan
        if plan is None or not plan.free_after:
            return self._tick
        return max(self._tick, min(plan.free_after) - now)

    def _slot_views(self, now: float, first: _Replica[P] | None) -> list[SlotView]:
        views: list[SlotView] = []
        if first is not None and first.free_slots() > 0:
            views.append(SlotView(first.replica_id, first.model, now, 0.0))
        busy_until = now + self._tick
        for replica in self._replicas.values():
            if replica.removed:
                continue
            replica_id = replica.replica_id
            model = replica.model
            in_flight = replica.in_flight
            free = replica.slots - len(in_flight) - (1 if replica is first and views else 0)
            while free > 0:
                views.append(SlotView(replica_id, model, now, 0.0))
                free -= 1
            if in_flight:
                spread = model.upper_factor - 1.0
                for batch in in_flight.values():
                    # Still busy past its predicted end: it cannot start anything within a
                    # tick.
                    end = batch.dispatched_at + batch.predicted_seconds
                    if busy_until > end:
                        end = busy_until
                    margin = spread * batch.predicted_seconds
                    views.append(SlotView(replica_id, model, end, margin * margin))
        if first is None and len(views) > 1:
            views.sort(key=_FREE_AT)
        return views

    def _update_horizon(self, slots: int, views: list[SlotView], now: float) -> None:
        cfg = self._cfg
        if cfg.horizon_s is not None:
            self._horizon = cfg.horizon_s
            return
        model = views[0].model
        intercept, slope, step, factor = model.coefficients()
        # The horizon's fluid estimates price a batch as ``fixed + slope × tokens``: with a
        # decode loop its fixed part includes the steps of a typical batch's longest output.
        intercept = intercept + step * model.mean_longest
        rechoose = self._protected is None or (
            self._mix.added - self._protected_at >= _RECHOOSE_EVERY
            # Early on, while the window fills, re-choose as often as it doubles.
            or (self._protected_at < _RECHOOSE_EVERY and self._mix.added >= 2 * self._protected_at)
        )
        if rechoose:
            # Which deadline class to protect changes only with the traffic mix: re-choose
            # once per window of arrivals, then keep the horizon tracking the cost model.
            window, span = self._mix.window(now)
            choice = choose_horizon(
                window,
                span,
                intercept=intercept,
                slope=slope,
                spread_factor=factor,
                slots=slots,
            )
            self._protected = (choice.budget, choice.budget_token_rate, choice.stretch)
            if self._threshold is not None:
                self._threshold.set_floor(choice.size_cut * _THRESHOLD_FLOOR)
            self._protected_at = self._mix.added
        assert self._protected is not None
        budget, rate, stretch = self._protected
        if math.isinf(budget) or slots == 0:
            self._horizon = math.inf
            return
        self._horizon = stretch * protecting_horizon(
            budget, rate, intercept=intercept, slope=slope, spread_factor=factor, slots=slots
        )

    def _balance_cap(self, replica: _Replica[P]) -> float:
        """How long a batch on ``replica`` may run: no longer than the fastest replica would
        take for everything queued. A straggler that frees first then takes only the share it
        can finish as soon as the fast replica would, instead of the whole queue at its own
        slow pace; the rest waits for the faster one. ``inf`` when ``replica`` is the fastest
        (or alone), so a single device is never affected."""
        active = 0
        for other in self._replicas.values():
            if not other.removed:
                active += 1
        if active < 2:
            return math.inf
        tokens = self._queued_tokens
        # Everything queued as one batch decodes for the longest output queued.
        longest = max(
            max(map(_OUTPUT, self._int), default=0), max(map(_OUTPUT, self._bulk), default=0)
        )
        fastest: float | None = None
        for other in self._replicas.values():
            if not other.removed:
                predicted = other.model.predict(tokens, longest)
                if fastest is None or predicted < fastest:
                    fastest = predicted
        if fastest is None:  # pragma: no cover - two active replicas were just counted
            return math.inf
        own = replica.model.predict(tokens, longest)
        return math.inf if own <= fastest else fastest

    def _replan(
        self, now: float, first: _Replica[P] | None, horizon_cap: float = math.inf
    ) -> Plan[P]:
        """Re-plans the whole queue, applies its drops, and caches the result.

        ``horizon_cap`` shortens the longest batch for this plan only (see ``_balance_cap``).
        """
        if self._bulk_fifo:
            self._promote_aged(now)
        views = self._slot_views(now, first)
        if not views:
            # No replica at all: nothing can be served, so everything queued is hopeless
            # once its deadline passes — hold it until then rather than lose it.
            return self._replan_without_replicas(now)
        if self._horizon_stale or first is not None:
            self._update_horizon(self._slots_total, views, now)
            self._horizon_stale = False
        cfg = self._cfg
        self._risk_ok = not self._backlogged(now)
        plan = plan_batches(
            (self._int, self._bulk),
            views,
            now=now,
            horizon=horizon_cap if horizon_cap < self._horizon else self._horizon,
            max_items=cfg.max_batch_items,
            max_tokens=cfg.max_batch_tokens,
            objective=cfg.objective,
            overtaking=self._overtaking.overtaking_rates(now),
            allow_risk=self._risk_ok,
            opportunistic_below=self._opportunistic_below(),
        )
        # The plan already excludes what it dropped; take the same items out of the queue so
        # that the plan stays a description of it (its first batch a prefix of the lanes).
        for item, reason, predicted in plan.drops:
            self._remove(item)
            self._record_drop(item, reason, predicted)
            if reason is DropReason.SHED_FOR_GOODPUT:
                self._note_forced(item.tokens)
        self._plan = plan
        self._plan_slots = views
        self._since_replan = 0
        self._planned_at = now
        self._hopeless_at = self._hopeless_time(plan, views)
        return plan

    def _hopeless_time(self, plan: Plan[P], views: list[SlotView]) -> float:
        """When queued work may next become unservable and must be evicted.

        Only if no slot frees in time to take it: while every slot is busy, wait at least
        until the first could plausibly be done (its upper estimate) — if it frees on time,
        the dispatch that follows re-plans anyway.
        """
        hopeless = plan.earliest_hopeless
        if self._free_total == 0:
            first_end: float | None = None
            for replica in self._replicas.values():
                if not replica.removed:
                    for b in replica.in_flight.values():
                        end = b.dispatched_at + b.predicted_upper_seconds
                        if first_end is None or end < first_end:
                            first_end = end
            if first_end is not None and first_end > hopeless:
                hopeless = first_end
        return hopeless

    def _replan_without_replicas(self, now: float) -> Plan[P]:
        expired = [item for item in self._int + self._bulk if item.deadline <= now + self._tick]
        for item in expired:
            self._remove(item)
            self._record_drop(item, DropReason.DEADLINE_MISSED, math.inf)
        earliest = min((item.deadline for item in self._int + self._bulk), default=math.inf)
        plan: Plan[P] = Plan([], [], False, [], [], earliest)
        self._plan = plan
        self._plan_slots = []
        self._hopeless_at = earliest
        return plan
