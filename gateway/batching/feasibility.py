"""Feasibility at admission: can a request still finish in time, and who yields if not.

What it decides: for a request checked against the cached plan (``_admit``), its expected
completion — the start of the planned batch its EDF position falls into, the cost of the members
ahead of it and its own, decode steps included, the batch's margin and the expected overtaking
delay — or a ``DEADLINE_UNREACHABLE`` refusal with the prediction split into what it waits for
(``_unreachable_parts``). When it would be late only because a larger request is queued ahead,
that one is shed instead (``_swap_victim``, Moore–Hodgson) and the cached plan shortened
(``_shed_from_plan``). A request arriving to an idle slot and an empty queue is priced alone
(``_admit_alone``).

Why on its own: this is the per-request hot path; it reads the plan that ``capacity`` builds
and grows it in place, but never re-plans or dispatches.
"""

from __future__ import annotations

import math

from gateway.batching.capacity import _CapacityPlanner
from gateway.batching.cost_model import OnlineCostModel
from gateway.batching.lanes import _BULK, _OUTPUT, _TOKENS
from gateway.batching.planner import (
    Plan,
    PlannedBatch,
    member_saving,
    overtake_delay,
    overtake_slope,
)
from gateway.batching.records import (
    BatchItem,
    DropReason,
    Objective,
    P,
    PredictionParts,
    Rejected,
)


class _Feasibility(_CapacityPlanner[P]):
    """Admission checks against the cached plan, and the swaps that make room."""

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
