"""The deadline-aware batcher for one (model, version): admit, wait, flush, shed, drain.

What it decides, for every request and every free replica slot:

* **Admission** (``submit``): queue the request, or refuse it at once with a typed reason and
  the evidence — ``DEADLINE_UNREACHABLE`` with the predicted completion when, counting the work
  queued ahead of it under EDF, the work that will share its batch and the work already on the
  device, it would finish too late; ``QUEUE_FULL`` or ``NO_CAPACITY`` otherwise. When it would
  be late only because a *larger* request is queued ahead, the larger one is shed instead
  (Moore–Hodgson: that keeps more requests on time). Under sustained overload a request above
  the learned size limit (``shed_threshold``) is refused as ``SHED_FOR_GOODPUT``.
* **Dispatch** (``take_batch``): for a replica with a free slot, the first batch of the current
  plan (see ``planner``), and why it leaves now — ``capacity`` when the slot freed with work
  waiting, ``full`` when nothing more can join, ``deadline`` when waiting one more tick would
  breach a member's deadline, ``linger`` when the oldest member has waited the ceiling.
  Otherwise ``None``: keep waiting until ``next_wakeup``.
* **Shedding and eviction**: every plan drops the requests that cannot all finish in time —
  ``DEADLINE_MISSED`` when a request cannot make it even alone on the first free slot (decided
  the moment that becomes true, not when the deadline passes), ``SHED_FOR_GOODPUT`` when it is
  dropped so that more requests (or tokens, per the objective) finish in time. They are handed
  out by ``take_dropped`` so each caller gets an answer.
* **Retries avoid where they failed**, per request: a request submitted with ``avoid`` (the
  replicas its earlier attempts failed on) is held out of the batches taken for those
  replicas while any other replica is in service, and planned normally everywhere else. A
  replica that failed one request's batch keeps serving everyone else's (ADR 0011); with no
  other replica left, a retry where it failed beats no retry.
* **Learning**: ``complete`` feeds the measured device time (with the batch's tokens and
  longest output budget) to that replica's own
  :class:`~gateway.batching.cost_model.OnlineCostModel`.
* **Pricing**: every batch cost is the cost model's ``(intercept + step × longest) + slope ×
  tokens``, where ``longest`` is the batch's largest output budget (``submit(output_tokens=)``;
  0 when unknown): an autoregressive batch decodes until its longest output is done, so a
  request that lengthens the decode pays ``step`` per extra step on top of its tokens.
* **Shutdown**: ``close`` stops admission (queued work keeps being dispatched); ``drain``
  returns everything still queued. Nothing is dropped silently.

The batcher is pure policy: no I/O, no timers of its own, time from an injected ``Clock``
(seconds). The simulator and the gateway drive the same class: the simulator with one replica
of one slot, the gateway with many replicas of several slots each.

Cost: admission is ``O(log n + b)`` against the cached plan (``b`` = planned batches, a
handful); the plan is rebuilt in one ``O(n)`` pass on every dispatch and after every few
admissions, because incremental updates cannot move batch boundaries the way a fresh plan does.
Both run thousands of times a second, so their constant factors matter too: the hot paths read
each value once and spell out ``min``/``max`` where a comparison gives the same result.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Generic

from common.clock import Clock
from gateway.batching.config import BatcherConfig
from gateway.batching.cost_model import CostSnapshot, OnlineCostModel
from gateway.batching.deadline_mix import ArrivalMix, ArrivalWindow
from gateway.batching.horizon import choose_horizon, protecting_horizon
from gateway.batching.planner import (
    Plan,
    PlannedBatch,
    SlotView,
    member_saving,
    overtake_delay,
    overtake_slope,
    plan_batches,
)
from gateway.batching.records import (
    Accepted,
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
)
from gateway.batching.shed_threshold import ShedThreshold

# Arrivals between two choices of which deadline class the horizon protects (one window).
_RECHOOSE_EVERY = 1024
# Admissions checked against a cached plan before it is rebuilt: the cached plan is updated
# incrementally, but batch boundaries drift from what a fresh plan would choose.
_REPLAN_EVERY = 8
# Float slack: times are sums of seconds, so "exactly one tick" must compare as one tick.
_EPSILON = 1e-9
# The shed threshold never falls below this share of the fluid estimate's size cut.
_THRESHOLD_FLOOR = 0.5
# Enum members read on every request, bound once: on Python 3.11 ``Lane.BULK`` is a descriptor
# call, several times dearer than reading a module global.
_INTERACTIVE = Lane.INTERACTIVE
_BULK = Lane.BULK


class _Replica(Generic[P]):
    __slots__ = ("capacity_credit", "in_flight", "model", "removed", "replica_id", "slots")

    def __init__(self, replica_id: str, slots: int, model: OnlineCostModel) -> None:
        self.replica_id = replica_id
        self.slots = slots
        self.model = model
        self.in_flight: dict[int, Batch[P]] = {}
        self.removed = False
        # Slots that freed while work was waiting; the next batch they take is "capacity".
        self.capacity_credit = 0

    def free_slots(self) -> int:
        return 0 if self.removed else self.slots - len(self.in_flight)


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


class DeadlineBatcher(Generic[P]):
    """Earliest-deadline-first batching with feasibility, goodput shedding and per-replica cost.

    Usage is documented in the package docstring (:mod:`gateway.batching`).
    """

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

    # -- replicas ------------------------------------------------------------------------

    def add_replica(
        self, replica_id: str, *, slots: int = 1, cost_model: OnlineCostModel | None = None
    ) -> None:
        """Adds (or re-adds) a replica with ``slots`` concurrent batches and its own cost model."""
        if slots < 1:
            raise ValueError("a replica needs at least one slot")
        existing = self._replicas.get(replica_id)
        if existing is not None and not existing.removed:
            existing.slots = slots
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
            replica: _Replica[P] = _Replica(replica_id, slots, model)
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

    # -- admission -----------------------------------------------------------------------

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

    def _admit(self, plan: Plan[P], x: BatchItem[P], now: float) -> float | Rejected:
        """Checks ``x`` against the cached plan; returns its expected completion or a refusal.

        ``x`` lands in the planned batch its EDF position falls into. Its completion is then at
        least that batch's start plus the cost of the members ahead of it and its own tokens
        (members with later deadlines can be moved to the next batch, so they do not count) —
        decoding for the longest output among them and ``x`` — plus the batch's margin and the
        expected overtaking delay. A newcomer due after everything planned joins the last
        batch if it fits there, or opens one after it. On success the cached plan grows in
        place (later batches on the same slot shift by its marginal cost, decode steps
        included); on failure, a larger request ahead may be shed in its favour.
        """
        batches = plan.batches
        bulk = x.lane is _BULK
        w = x.tokens
        o = x.output_tokens
        d = x.deadline
        key = (1 if bulk else 0, d)
        j = -1
        target: PlannedBatch[P] | None = None
        ahead_tokens = 0
        ahead_longest = 0  # the largest output budget among the members ahead of x
        priced = -1  # the slot whose model's coefficients are loaded below
        if batches and batches[-1].last_key >= key:
            for idx, pb in enumerate(batches):
                if pb.last_key >= key:
                    j = idx
                    break
            target = batches[j]
            priced = target.slot
            intercept, slope, step, factor = self._plan_slots[priced].model.coefficients()
            if step > 0.0:
                for item in target.items:
                    if item.deadline <= d and (bulk or item.lane is not _BULK or item.promoted):
                        ahead_tokens += item.tokens
                        if item.output_tokens > ahead_longest:
                            ahead_longest = item.output_tokens
            else:
                for item in target.items:
                    if item.deadline <= d and (bulk or item.lane is not _BULK or item.promoted):
                        ahead_tokens += item.tokens
        elif batches:
            last = batches[-1]
            priced = last.slot
            intercept, slope, step, factor = self._plan_slots[priced].model.coefficients()
            if step > 0.0 and o > last.longest:  # x makes the batch decode longer
                added = slope * w + step * (o - last.longest)
            else:
                added = slope * w
            cost = last.cost + added
            grow = added * factor
            cfg = self._cfg
            # min(last.min_deadline, d), spelled out: on this per-request path a builtin call
            # costs more than the comparison (and the result is the same, ties included).
            binding = d if d < last.min_deadline else last.min_deadline
            if (
                cost <= self._horizon
                and len(last.items) < cfg.max_batch_items
                and last.tokens + w <= cfg.max_batch_tokens
                and last.upper_end + grow <= binding
            ):
                target = last
                j = len(batches) - 1
                ahead_tokens = last.tokens
                ahead_longest = last.longest
        if target is not None:
            s = target.slot
            start = target.start
            variance = target.variance_before
        else:
            # A new batch after everything planned, on the slot that frees first.
            free = plan.free_after
            s = 0
            for i in range(1, len(free)):
                if free[i] < free[s]:
                    s = i
            start = now if now > free[s] else free[s]  # max(free[s], now)
            variance = plan.variance_after[s]
        if s != priced:
            intercept, slope, step, factor = self._plan_slots[s].model.coefficients()
        decode = o if o > ahead_longest else ahead_longest  # x's batch decodes this long
        if step > 0.0:
            cost = (intercept + step * decode) + slope * (ahead_tokens + w)
        else:
            cost = intercept + slope * (ahead_tokens + w)
        margin = (factor - 1.0) * cost
        upper = start + cost + math.sqrt(variance + margin * margin)
        if start > now:
            # Read even when unused below: the rate table refreshes on a read, and when it
            # does must not depend on which admissions needed it.
            bounds, rates = self._overtaking.overtaking_rates(now)
            wait = start - now
            # The expected overtaking delay is at most 9 waits (ρ ≤ 0.9 in overtake_delay):
            # when even 10 fit, it cannot change the verdict below, so it is not computed.
            if bounds and upper + 10.0 * wait > d:
                fixed = intercept + step * self._plan_slots[s].model.mean_longest
                o_slope = overtake_slope(fixed, slope, self._horizon, self._slots_total)
                upper += overtake_delay(bounds, rates, o_slope, d - now, wait)
        if upper > d and self._risk_ok and start + cost <= d:
            upper = d  # spare capacity: try it on the expected cost (see ``plan_batches``)
        if upper > d:
            if target is not None:
                ahead = [item for pb in batches[:j] for item in pb.items]
                ahead += [
                    item
                    for item in target.items
                    if item.deadline <= d and (bulk or item.lane is not _BULK or item.promoted)
                ]
            else:
                ahead = [item for pb in batches for item in pb.items]
            victim = self._swap_victim(plan, ahead, x, upper - d, slope, step)
            if victim is None:
                return self._reject(
                    DropReason.DEADLINE_UNREACHABLE,
                    upper,
                    max(0.0, start - now),
                    self._unreachable_parts(
                        x, now, batches, s, start, intercept, slope, step, upper, target
                    ),
                )
            in_target = target is not None and victim in target.items
            saved = self._shed_from_plan(plan, victim)
            self._note_forced(victim.tokens)
            if in_target and target is not None:
                # x's own prefix of the batch loses the victim's tokens, and the decode steps
                # by which the victim was the longest of that prefix (not of the whole batch).
                if step > 0.0 and victim.output_tokens >= decode:
                    rest = o
                    for item in target.items:
                        if (
                            item.deadline <= d
                            and (bulk or item.lane is not _BULK or item.promoted)
                            and item.output_tokens > rest
                        ):
                            rest = item.output_tokens
                    cost -= slope * victim.tokens + step * (decode - rest)
                else:
                    cost -= slope * victim.tokens
            else:
                start -= saved
        expected = start + cost
        if target is not None:
            # x joins ``target``; later batches on the same slot start later by its marginal
            # cost (its tokens, and the decode steps by which it outlasts the batch).
            if o > target.longest:
                added = slope * w + step * (o - target.longest) if step > 0.0 else slope * w
                target.longest = o
            else:
                added = slope * w
            target.items.append(x)
            target.tokens += w
            target.cost += added
            target.upper_end += added * factor
            if d < target.min_deadline:
                target.min_deadline = d
            if target is not batches[-1]:
                for later in batches[j + 1 :]:
                    if later.slot == s:
                        later.start += added
                        later.upper_end += added * factor
            plan.free_after[s] += added
        else:
            margin = (factor - 1.0) * cost
            upper = start + cost + math.sqrt(variance + margin * margin)
            batches.append(PlannedBatch(s, start, variance, [x], w, cost, upper, d, key, o))
            plan.free_after[s] = start + cost
            plan.variance_after[s] = variance + margin * margin
        return expected

    def _admit_alone(self, x: BatchItem[P], now: float) -> float | Rejected:
        best: OnlineCostModel | None = None
        w, o = x.tokens, x.output_tokens
        for replica in self._replicas.values():
            if replica.free_slots() > 0 and (
                best is None or replica.model.predict(w, o) < best.predict(w, o)
            ):
                best = replica.model
        assert best is not None  # callers check a free slot exists
        # An idle slot means nothing else is waiting: a request that makes its deadline on
        # the expected cost is worth trying even if the conservative estimate says no.
        expected = now + best.predict(w, o)
        if expected > x.deadline:
            own = expected - now
            return self._reject(
                DropReason.DEADLINE_UNREACHABLE,
                expected,
                None,
                PredictionParts(x.deadline - now, own=own),
            )
        self._plan = None  # the cached plan no longer describes the queue
        return expected

    def _swap_victim(
        self,
        plan: Plan[P],
        candidates: list[BatchItem[P]],
        x: BatchItem[P],
        overrun: float,
        slope: float,
        step: float,
    ) -> BatchItem[P] | None:
        """A queued request ahead of ``x`` to shed so that ``x`` fits, if that trade is better.

        On-time requests: the largest request ahead, if it is larger than ``x`` and its
        removal buys back the overrun. On-time tokens: the smallest request ahead that buys it
        back and is still smaller than ``x``. With a decode-step cost, "larger" is the most a
        request can add to a batch (``slope × tokens + step × output``) and what its removal
        buys is judged against its planned batch (its tokens, plus the decode steps by which
        it is that batch's longest).
        """
        if not candidates:
            return None
        if step > 0.0:
            return self._swap_victim_decoding(plan, candidates, x, overrun, slope, step)
        if slope <= 0.0:
            return None
        need = overrun / slope  # tokens that must leave the work ahead of x
        if self._cfg.objective is Objective.ON_TIME_REQUESTS:
            best = max(candidates, key=_TOKENS)
            if best.tokens <= x.tokens or best.tokens < need:
                return None
            return best
        found: BatchItem[P] | None = None
        for item in candidates:
            if need <= item.tokens < x.tokens and (found is None or item.tokens < found.tokens):
                found = item
        return found

    def _swap_victim_decoding(
        self,
        plan: Plan[P],
        candidates: list[BatchItem[P]],
        x: BatchItem[P],
        overrun: float,
        slope: float,
        step: float,
    ) -> BatchItem[P] | None:
        """``_swap_victim`` on a device whose batches pay per decode step (``step > 0``)."""

        def buys(item: BatchItem[P]) -> bool:
            if slope * item.tokens + step * item.output_tokens < overrun:
                return False  # not even its whole cost bound
            for pb in plan.batches:
                if item in pb.items:
                    return member_saving(pb.items, item, slope, step) >= overrun
            return False  # pragma: no cover - candidates come from the plan

        if self._cfg.objective is Objective.ON_TIME_REQUESTS:
            best = max(candidates, key=lambda i: slope * i.tokens + step * i.output_tokens)
            size = slope * best.tokens + step * best.output_tokens
            if size <= slope * x.tokens + step * x.output_tokens or not buys(best):
                return None
            return best
        found: BatchItem[P] | None = None
        for item in candidates:
            if (
                item.tokens < x.tokens
                and (found is None or item.tokens < found.tokens)
                and buys(item)
            ):
                found = item
        return found

    def _shed_from_plan(self, plan: Plan[P], victim: BatchItem[P]) -> float:
        """Sheds ``victim`` and shortens the cached plan; returns the seconds it saves."""
        idx = next((i for i, pb in enumerate(plan.batches) if victim in pb.items), -1)
        if idx < 0:  # pragma: no cover - the victim always comes from the plan
            raise RuntimeError("victim not in plan")
        pb = plan.batches[idx]
        model = self._plan_slots[pb.slot].model
        step = model.step
        if step > 0.0:
            saved = member_saving(pb.items, victim, model.slope, step)
            pb.items.remove(victim)
            if victim.output_tokens >= pb.longest:
                pb.longest = max(map(_OUTPUT, pb.items), default=0)
        else:
            pb.items.remove(victim)
            saved = model.slope * victim.tokens
        pb.tokens -= victim.tokens
        pb.cost -= saved
        pb.upper_end -= saved * model.upper_factor
        for later in plan.batches[idx + 1 :]:
            if later.slot == pb.slot:
                later.start -= saved
                later.upper_end -= saved * model.upper_factor
        plan.free_after[pb.slot] -= saved
        self._remove(victim)
        self._record_drop(victim, DropReason.SHED_FOR_GOODPUT, pb.upper_end)
        return saved

    # -- dispatch ------------------------------------------------------------------------

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

    # -- internals -----------------------------------------------------------------------

    def _queued(self) -> int:
        return len(self._int) + len(self._bulk)

    def _refresh_capacity(self) -> None:
        slots = free = busy = 0
        for replica in self._replicas.values():
            if not replica.removed:
                slots += replica.slots
                free += replica.free_slots()
                busy += len(replica.in_flight)
        self._slots_total, self._free_total, self._busy_total = slots, free, busy

    def _reject(
        self,
        reason: DropReason,
        predicted: float | None,
        retry_after: float | None,
        parts: PredictionParts | None = None,
    ) -> Rejected:
        self._drops[reason.value] += 1
        return Rejected(reason, predicted, retry_after, parts)

    def _unreachable_parts(
        self,
        x: BatchItem[P],
        now: float,
        batches: list[PlannedBatch[P]],
        slot: int,
        start: float,
        intercept: float,
        slope: float,
        step: float,
        upper: float,
        target: PlannedBatch[P] | None,
    ) -> PredictionParts:
        """The prediction behind a refusal in :meth:`_admit`, split into what it waits for.

        Only on the refusal path: an admitted request pays nothing for it. The slot's first
        planned batch starts when the work on its device ends; planned batches then follow.
        """
        slot_free = start
        for planned in batches:
            if planned.slot == slot:
                slot_free = min(planned.start, start)
                break
        on_device = max(0.0, slot_free - now)
        queued_ahead = max(0.0, start - now - on_device)
        mates = 0
        shared_tokens = 0
        shared_longest = 0
        if target is not None:
            bulk = x.lane is _BULK
            for item in target.items:
                if item.deadline <= x.deadline and (
                    bulk or item.lane is not _BULK or item.promoted
                ):
                    mates += 1
                    shared_tokens += item.tokens
                    if item.output_tokens > shared_longest:
                        shared_longest = item.output_tokens
        o = x.output_tokens
        # Its own batch alone (decoding its own output), and what sharing adds: the mates'
        # tokens and the decode steps by which their longest output outlasts its own.
        own = (intercept + step * o) + slope * x.tokens
        sharing = slope * shared_tokens
        if shared_longest > o:
            sharing += step * (shared_longest - o)
        return PredictionParts(
            deadline_in=x.deadline - now,
            on_device=on_device,
            queued_ahead=queued_ahead,
            sharing_batch=sharing,
            own=own,
            margin=max(0.0, upper - start - own - sharing),
            queued_requests=len(self._int) + len(self._bulk),
            batch_mates=mates,
        )

    def _record_drop(self, item: BatchItem[P], reason: DropReason, predicted: float) -> None:
        self._drops[reason.value] += 1
        self._dropped.append(Dropped(item, reason, self._clock.now(), predicted))

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

    def _note_forced(self, tokens: int) -> None:
        """An overflow had to be resolved by shedding a request of ``tokens``."""
        self._forced_count += 1
        if tokens > self._forced_since_dispatch:
            self._forced_since_dispatch = tokens

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


# Sort and min/max keys, evaluated in C.
_FREE_AT = attrgetter("free_at")
_ARRIVAL = attrgetter("arrival")
_TOKENS = attrgetter("tokens")
_OUTPUT = attrgetter("output_tokens")
