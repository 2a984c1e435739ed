"""Which queued requests run in which batch, and which must be let go: the batch plan.

What it decides: given everything queued (earliest deadline first, interactive before bulk),
the execution slots and when each frees up, and each slot's cost model, it lays out the
predicted sequence of batches — and, when that schedule would make someone late, which
request to drop so that the most requests (or tokens) still finish in time.

Why this shape:

* **Batches grow greedily in EDF order** while three things hold: the batch's conservative
  completion stays within every member's deadline, its expected duration stays within the
  *horizon*, and the device's size/token ceilings are respected. So urgent work gets small,
  early batches and relaxed work rides large ones; batch size falls out of the deadlines.
* **The horizon** caps one batch's expected duration. A request that arrives just after a
  batch starts must wait for that batch *and* then ride the next one; if the tightest deadline
  the batcher sees is ``T``, two back-to-back batches must fit in ``T``, so with ``k`` slots a
  batch may last ``T·k/(k+1)``. Without it, a deep relaxed backlog would be served in one huge
  batch and every urgent arrival during it would be lost. The batcher computes it from the
  deadlines it observes; the planner just applies it.
* **Moore–Hodgson, batched.** Maximising the number of on-time jobs on one machine is solved
  optimally by walking jobs in EDF order and, whenever the running schedule misses a deadline,
  dropping the longest job scheduled so far. Here "longest" is the most tokens (a batch's cost
  is affine in its tokens, so removing a member saves its marginal cost, or the whole batch if
  it was alone) — or, on a device with a per-decode-step cost, the most ``slope × tokens +
  step × output``, the member's cost bound — and the walk continues from the shortened
  schedule instead of restarting. For the
  on-time-tokens objective the rule changes to: drop the *smallest* request whose removal
  alone repairs the overrun (the newcomer always qualifies), so large requests are not
  systematically the ones shed. Unpromoted bulk work is always shed before interactive work.
* **Unprotected classes ride along.** When the horizon does not protect a deadline class
  (protecting it would cost more than it saves, see ``horizon``), its requests are served when
  a batch happens to end in time for them, but they never cut a batch short nor make others be
  shed for them: under backlog a batch that outgrows their deadline sheds them instead.
* **A batch decodes for its longest output.** Its cost is ``(intercept + step × longest) +
  slope × tokens`` (see ``cost_model``), so growing it by a request of ``w`` tokens and output
  budget ``o`` costs ``slope × w + step × max(0, o − longest)``: not additive in its members.
  The open batch keeps its ``longest`` and prices each candidate against it; a member's removal
  re-derives the batch's ``longest`` from those that stay. When no slot prices a decode step
  (a device without a decode loop), output budgets change nothing and are not read at all —
  the plan is then exactly the two-term model's, at the two-term model's cost.
* **Conservative where lateness costs.** Each slot's chain of batches is timed with expected
  costs, and every completion is checked against expected time plus a margin that grows like
  the square root of the summed per-batch spread (independent errors add in quadrature), so a
  plan 15 batches deep is not 15 spreads pessimistic, while the batch about to run carries its
  full spread. A late request is worse than a shed one: it burns device time and still fails.

Cost: one pass over the queue, plus ``O(n)`` per drop (finding the victim), and the caller
reuses the result between dispatches. The pass runs on every dispatch and every few
admissions, so a request that simply joins the open batch takes a short fast path. The planner
is a pure function of its inputs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Generic

from gateway.batching.cost_model import OnlineCostModel
from gateway.batching.records import BatchItem, DropReason, Lane, Objective, P


@dataclass(slots=True)
class SlotView:
    """One execution slot as the planner sees it: when it frees and how it prices work."""

    replica_id: str
    model: OnlineCostModel
    free_at: float  # expected time the slot can start new work (never before now)
    variance: float  # squared margin of the work still ahead of it on this slot


@dataclass(slots=True, eq=False)
class PlannedBatch(Generic[P]):
    """A batch in the plan. Times are expected, except ``upper_end`` (conservative)."""

    slot: int
    start: float
    variance_before: float
    items: list[BatchItem[P]]
    tokens: int
    cost: float
    upper_end: float
    min_deadline: float
    # Ordering key of the last member ((0, deadline) interactive, (1, deadline) bulk), so the
    # batcher can tell which planned batch a newcomer would fall into.
    last_key: tuple[int, float]
    # The largest output budget among its items: the decode steps it runs.
    longest: int = 0


@dataclass(slots=True)
class Plan(Generic[P]):
    """The planner's answer."""

    batches: list[PlannedBatch[P]]
    # (item, reason, conservative completion it would have had) for every request let go.
    drops: list[tuple[BatchItem[P], DropReason, float]]
    # True when the first batch stopped growing because the next request could not join
    # (a ceiling or a deadline) rather than because the queue ran out.
    first_full: bool
    # Slot pointers after the last planned batch (expected free time and squared margin).
    free_after: list[float]
    variance_after: list[float]
    # Earliest time at which some queued request stops being servable even alone.
    earliest_hopeless: float


_BULK = Lane.BULK  # bound once: an Enum member lookup is a descriptor call on Python 3.11


def _is_shed_first(item: BatchItem[P]) -> bool:
    return item.lane is _BULK and not item.promoted


def plan_batches(
    lanes: Sequence[Sequence[BatchItem[P]]],
    slots: Sequence[SlotView],
    *,
    now: float,
    horizon: float,
    max_items: int,
    max_tokens: int,
    objective: Objective,
    overtaking: tuple[Sequence[float], Sequence[float]] = ((), ()),
    allow_risk: bool = False,
    opportunistic_below: float = 0.0,
) -> Plan[P]:
    """Lays out the batches for ``lanes`` (each EDF-sorted, in priority order) on ``slots``.

    ``slots[0]`` is preferred for the first batch when several are free at the same time, so
    a caller asking for a batch for a particular replica lists that replica's free slot first.
    ``overtaking`` is ``ArrivalMix.overtaking_rates``: work still to arrive that EDF will put
    ahead of a request delays every batch that starts later than now, so each deadline check
    of a later batch includes the expected delay (see :func:`overtake_delay`).
    With ``allow_risk`` (the caller has capacity to spare) a request whose conservative
    completion misses its deadline but whose expected completion makes it is kept, alone in
    its batch, rather than dropped: with no backlog, trying costs nothing anyone else needed.
    Requests whose whole budget (deadline minus arrival) is under ``opportunistic_below``
    belong to a class the horizon does not protect: they ride a batch if it happens to end in
    time, but never cut one short — while the queue is backlogged, a batch that would outgrow
    their deadline sheds them instead of stopping, and one that cannot take them in time does
    not shed others for them.
    The returned drops are decisions, not side effects: the caller removes them from its queue.
    """
    k = len(slots)
    if k == 0:
        raise ValueError("planning needs at least one slot")
    # Per-slot state and prices, read from the views once (one pass: this runs on every
    # dispatch and every few admissions).
    free: list[float] = []
    var: list[float] = []
    intercepts: list[float] = []
    slopes: list[float] = []
    steps: list[float] = []
    o_slopes: list[float] = []  # device-seconds per overtaking token (``overtake_slope``)
    spreads: list[float] = []
    for view in slots:
        model = view.model
        a, b, step, factor = model.coefficients()
        at = view.free_at
        free.append(at if at > now else now)
        var.append(view.variance)
        intercepts.append(a)
        slopes.append(b)
        steps.append(step)
        # Displaced work pays the batch's fixed cost, decode steps included.
        o_slopes.append(overtake_slope(a + step * model.mean_longest, b, horizon, k))
        spreads.append(factor - 1.0)
    earliest_start = min(free)
    # "Hopeless" is judged on the slot that would serve the item soonest and cheapest.
    h_a, h_b, h_c, h_f = slots[0].model.coefficients()
    # Output budgets matter only where a decode step costs something: without, every item is
    # planned as if it had none (step × anything = 0), and the per-item path stays as short.
    decode = False
    for step in steps:
        if step > 0.0:
            decode = True
    sqrt = math.sqrt
    inf = math.inf
    bounds, rates = overtaking
    requests_objective = objective is Objective.ON_TIME_REQUESTS

    batches: list[PlannedBatch[P]] = []
    drops: list[tuple[BatchItem[P], DropReason, float]] = []
    has_bulk = False
    first_full = False
    earliest_hopeless = math.inf

    # The open batch lives in locals while it grows (this loop runs once per queued request
    # on every dispatch); it is written back to its PlannedBatch when it closes.
    cur: PlannedBatch[P] | None = None
    cur_a = cur_b = cur_c = cur_q = cur_o = 0.0
    # c_base: the open batch's fixed cost, intercept + step × its longest output.
    c_start = c_var0 = c_cost = c_up = c_md = c_delay = c_last_d = c_base = 0.0
    c_tokens = c_n = c_rank = c_long = 0
    c_items: list[BatchItem[P]] = []
    # Whether another slot was idle when the open batch opened. ``free`` only changes while no
    # batch is open, so this stays true to it, and the per-request idle-slot check is skipped
    # when no slot could pass it (always, under load).
    c_idle = False

    shed_opportunistic = opportunistic_below > 0.0 and not allow_risk
    c_opp = math.inf  # earliest deadline among the open batch's opportunistic members
    # A batch is open and neither opportunistic members nor idle slots are in play: a request
    # whose deadline binds nothing new joins on the growth check alone (see the fast path).
    fast = False
    for rank, lane in enumerate(lanes):
        for x in lane:
            w = x.tokens
            d = x.deadline
            if fast and d >= c_md:
                # Fast path for the common case: x's deadline binds nothing new, so only the
                # batch's growth decides. Exactly the join the general path below would make
                # (with md = c_md, delay = c_delay); anything else falls through to it.
                nt = c_tokens + w
                if decode:
                    # When x makes the batch decode longer, its fixed part grows by the steps.
                    o = x.output_tokens
                    c = (cur_a + cur_c * o if o > c_long else c_base) + cur_b * nt
                else:
                    c = c_base + cur_b * nt
                m = cur_q * c
                up = c_start + c + sqrt(c_var0 + m * m) + c_delay
                if c <= horizon and c_n < max_items and nt <= max_tokens and up <= c_md:
                    c_items.append(x)
                    c_tokens = nt
                    c_cost = c
                    c_up = up
                    c_n += 1
                    c_rank = rank
                    c_last_d = d
                    if rank > 0 and not x.promoted:
                        has_bulk = True
                    if decode:
                        if o > c_long:
                            c_long = o
                            c_base = cur_a + cur_c * o
                        hopeless = d - ((h_a + h_c * o) + h_b * w) * h_f
                    else:
                        hopeless = d - (h_a + h_b * w) * h_f
                    if hopeless < earliest_hopeless:
                        earliest_hopeless = hopeless
                    continue
            o = x.output_tokens if decode else 0
            # When x stops being servable even alone (counted only if x stays in the plan).
            hopeless = d - ((h_a + h_c * o if o else h_a) + h_b * w) * h_f
            opportunistic = shed_opportunistic and d - x.arrival < opportunistic_below
            if cur is not None and not opportunistic and c_opp < inf:
                # Would growing this batch make its opportunistic members late? Then they go.
                nt = c_tokens + w
                c = (cur_a + cur_c * o if o > c_long else c_base) + cur_b * nt
                m = cur_q * c
                if c_start + c + sqrt(c_var0 + m * m) + c_delay > c_opp and c <= horizon:
                    c_opp = inf
                    for member in list(c_items):
                        if member.deadline - member.arrival < opportunistic_below:
                            c_items.remove(member)
                            c_tokens -= member.tokens
                            c_n -= 1
                            drops.append((member, DropReason.SHED_FOR_GOODPUT, c_up))
                    if decode:
                        c_long = _longest(c_items)
                        c_base = cur_a + cur_c * c_long
                    c_cost = c_base + cur_b * c_tokens
                    if not c_items:
                        batches.remove(cur)
                        cur = None
            if cur is not None:
                nt = c_tokens + w
                c = (cur_a + cur_c * o if o > c_long else c_base) + cur_b * nt
                if (
                    c <= horizon
                    and c_n < max_items
                    and nt <= max_tokens
                    and not (
                        c_idle
                        and _idle_slot_sooner(
                            free, cur.slot, now, c_start + c, w, o, intercepts, slopes, steps
                        )
                    )
                ):
                    if opportunistic:
                        md = c_md  # it may ride along, but its deadline binds nobody
                        delay = c_delay
                    elif d < c_md:  # only across lanes: each lane is EDF-sorted
                        md = d
                        delay = (
                            overtake_delay(bounds, rates, cur_o, md - now, c_start - now)
                            if bounds and c_start > now
                            else 0.0
                        )
                    else:
                        md = c_md
                        delay = c_delay
                    m = cur_q * c
                    up = c_start + c + sqrt(c_var0 + m * m) + delay
                    if up <= md and (not opportunistic or up <= d):
                        if opportunistic and d < c_opp:
                            c_opp = d
                        c_items.append(x)
                        c_tokens = nt
                        if o > c_long:
                            c_long = o
                            c_base = cur_a + cur_c * o
                        c_cost = c
                        c_up = up
                        c_md = md
                        c_delay = delay
                        c_n += 1
                        c_rank = rank
                        c_last_d = d
                        if rank > 0 and not x.promoted:
                            has_bulk = True
                        if hopeless < earliest_hopeless:
                            earliest_hopeless = hopeless
                        continue
                if opportunistic:
                    # It would be late in the open batch and must not cut it short.
                    drops.append((x, _reason(x, earliest_start, h_a, h_b, h_c, h_f), up))
                    continue
                # x cannot join: close the current batch on its slot.
                cur.tokens = c_tokens
                cur.longest = c_long
                cur.cost = c_cost
                cur.upper_end = c_up
                cur.min_deadline = c_md
                cur.last_key = (c_rank, c_last_d)
                if cur is batches[0]:
                    first_full = True
                s = cur.slot
                free[s] = c_start + c_cost
                m = cur_q * c_cost
                var[s] = c_var0 + m * m
                cur = None
                fast = False

            # Open a new batch for x, dropping work (Moore–Hodgson) while x would be late.
            while True:
                s = 0  # the slot that frees first (the lowest on a tie)
                for i in range(1, k):
                    if free[i] < free[s]:
                        s = i
                start = free[s]
                c = (intercepts[s] + steps[s] * o if o else intercepts[s]) + slopes[s] * w
                m = spreads[s] * c
                delay = (
                    overtake_delay(bounds, rates, o_slopes[s], d - now, start - now)
                    if bounds and start > now
                    else 0.0
                )
                up = start + c + sqrt(var[s] + m * m) + delay
                if up <= d or (allow_risk and start + c + delay <= d) or opportunistic:
                    break
                # Everything placed so far, in plan order: the batches' items, concatenated
                # (built only here, where a victim is needed, rather than kept per request).
                placed = list(chain.from_iterable(pb.items for pb in batches))
                victim = _choose_victim(
                    placed, batches, x, up - d, slopes[s], steps[s], requests_objective, has_bulk
                )
                if victim is x:
                    break
                vb = next(pb for pb in batches if victim in pb.items)
                reason = _reason(victim, earliest_start, h_a, h_b, h_c, h_f)
                drops.append((victim, reason, vb.upper_end))
                vb.items.remove(victim)
                old_cost = vb.cost
                vb.tokens -= victim.tokens
                if vb.items:
                    vs = vb.slot
                    if decode:
                        if victim.output_tokens >= vb.longest:
                            vb.longest = _longest(vb.items)
                        fixed = intercepts[vs] + steps[vs] * vb.longest
                    else:
                        fixed = intercepts[vs]
                    vb.cost = fixed + slopes[vs] * vb.tokens
                else:
                    vb.cost = 0.0
                    batches.remove(vb)
                free[vb.slot] -= old_cost - vb.cost
            if up > d and not (allow_risk and start + c + delay <= d):
                drops.append((x, _reason(x, earliest_start, h_a, h_b, h_c, h_f), up))
                continue
            c_items = [x]
            cur = PlannedBatch(s, start, var[s], c_items, w, c, up, d, (rank, d), o)
            cur_a, cur_b, cur_q, cur_o = intercepts[s], slopes[s], spreads[s], o_slopes[s]
            cur_c = steps[s]
            c_long = o
            c_base = cur_a + cur_c * o
            c_start, c_var0, c_cost, c_up, c_md, c_delay = start, var[s], c, up, d, delay
            c_opp = inf
            if opportunistic:
                c_md, c_opp = inf, d
            c_idle = False  # is another slot idle (see ``_idle_slot_sooner``)?
            for i in range(k):
                if i != s and free[i] <= now:
                    c_idle = True
                    break
            fast = not shed_opportunistic and not c_idle
            c_tokens, c_n, c_rank, c_last_d = w, 1, rank, d
            batches.append(cur)
            if hopeless < earliest_hopeless:
                earliest_hopeless = hopeless
            if rank > 0 and not x.promoted:
                has_bulk = True

    if cur is not None:
        cur.tokens = c_tokens
        cur.longest = c_long
        cur.cost = c_cost
        cur.upper_end = c_up
        cur.min_deadline = c_md
        cur.last_key = (c_rank, c_last_d)
        s = cur.slot
        free[s] = c_start + c_cost
        m = cur_q * c_cost
        var[s] = c_var0 + m * m
    return Plan(batches, drops, first_full, free, var, earliest_hopeless)


def _idle_slot_sooner(
    free: list[float],
    busy_slot: int,
    now: float,
    join_end: float,
    tokens: int,
    output: int,
    intercepts: list[float],
    slopes: list[float],
    steps: list[float],
) -> bool:
    """Would an idle slot finish this request alone before the open batch would with it?

    Parallel capacity that is idle anyway is free: spreading work over it beats growing one
    batch (under load no slot is idle and batches grow as usual).
    """
    for s, at in enumerate(free):
        if (
            s != busy_slot
            and at <= now
            and at + (intercepts[s] + steps[s] * output) + slopes[s] * tokens < join_end
        ):
            return True
    return False


def _longest(items: Sequence[BatchItem[P]]) -> int:
    """The largest output budget among ``items`` (0 for none): the decode steps they run."""
    longest = 0
    for item in items:
        if item.output_tokens > longest:
            longest = item.output_tokens
    return longest


def overtake_slope(intercept: float, slope: float, horizon: float, slots: int) -> float:
    """Device-seconds each overtaking token costs the work it overtakes, per slot.

    Its marginal cost is ``slope``, but it also displaces queued work into later batches: with
    batches capped at the horizon ``H``, every ``H − intercept`` seconds of work pays one more
    intercept, so a token effectively costs ``slope × H / (H − intercept)``. Shared over
    ``slots`` parallel slots.
    """
    factor = 1.0
    if math.isfinite(horizon) and horizon > intercept:
        factor = horizon / (horizon - intercept)
        if not factor < 3.0:
            factor = 3.0
    return slope * factor / (slots if slots > 1 else 1)


def overtake_delay(
    bounds: Sequence[float], rates: Sequence[float], slope: float, slack: float, wait: float
) -> float:
    """Expected extra wait, for a request with ``slack`` seconds left that starts ``wait``
    seconds from now, caused by future arrivals with tighter budgets (which EDF serves first).

    Those arrive at ``slope × rates`` device-seconds per second; while the device also serves
    them, queued work progresses at ``1 − ρ`` of its speed (ρ capped at 0.9: past that the
    estimate is meaningless and admission is shedding anyway).
    """
    i = bisect.bisect_right(bounds, slack)
    if i == 0:
        return 0.0
    rho = slope * rates[i - 1]
    if rho <= 0.0:
        return 0.0
    if rho > 0.9:
        rho = 0.9
    return rho * wait / (1.0 - rho)


def _reason(
    item: BatchItem[P], earliest_start: float, a: float, b: float, c: float, factor: float
) -> DropReason:
    """Hopeless even alone on the first free slot → missed; otherwise a goodput choice."""
    if earliest_start + ((a + c * item.output_tokens) + b * item.tokens) * factor > item.deadline:
        return DropReason.DEADLINE_MISSED
    return DropReason.SHED_FOR_GOODPUT


def _tokens(item: BatchItem[P]) -> int:
    return item.tokens


def member_saving(
    items: Sequence[BatchItem[P]], victim: BatchItem[P], slope: float, step: float
) -> float:
    """Seconds a batch of ``items`` (``victim`` among them, others staying) gets shorter when
    ``victim`` leaves: its tokens, and the decode steps by which it was the longest."""
    saved = slope * victim.tokens
    out = victim.output_tokens
    if step > 0.0 and out > 0:
        rest = 0
        for item in items:
            if item is not victim and item.output_tokens > rest:
                rest = item.output_tokens
                if rest >= out:
                    return saved
        saved += step * (out - rest)
    return saved


def _choose_victim(
    placed: list[BatchItem[P]],
    batches: list[PlannedBatch[P]],
    newcomer: BatchItem[P],
    overrun: float,
    slope: float,
    step: float,
    requests_objective: bool,
    has_bulk: bool,
) -> BatchItem[P]:
    """The request to drop when ``newcomer`` would finish ``overrun`` seconds late."""
    if has_bulk or _is_shed_first(newcomer):
        # Unpromoted bulk work yields first: choose among it alone while there is any.
        bulk = [item for item in placed if _is_shed_first(item)]
        if _is_shed_first(newcomer):
            return _pick(bulk, batches, newcomer, overrun, slope, step, requests_objective)
        if bulk:
            return max(bulk, key=_size_key(slope, step) if step > 0.0 else _tokens)
    return _pick(placed, batches, newcomer, overrun, slope, step, requests_objective)


def _size_key(slope: float, step: float) -> Callable[[BatchItem[P]], float]:
    """How "long" a job is for Moore–Hodgson on a device with a decode-step cost (otherwise
    its tokens): the most it can add to a batch, ``slope × tokens + step × output``."""
    return lambda item: slope * item.tokens + step * item.output_tokens


def _pick(
    placed: list[BatchItem[P]],
    batches: list[PlannedBatch[P]],
    newcomer: BatchItem[P],
    overrun: float,
    slope: float,
    step: float,
    requests_objective: bool,
) -> BatchItem[P]:
    if not placed:
        return newcomer
    if requests_objective:
        # Moore–Hodgson: the longest job scheduled so far (the newcomer on a tie).
        if step > 0.0:
            key = _size_key(slope, step)
            longest = max(placed, key=key)
            return longest if key(longest) > key(newcomer) else newcomer
        longest = max(placed, key=_tokens)
        return longest if longest.tokens > newcomer.tokens else newcomer
    # On-time tokens: the smallest request whose removal alone buys back the overrun; the
    # newcomer always qualifies (dropping it removes the overrun entirely).
    best = newcomer
    if step > 0.0:
        # What a member's removal buys depends on its batch (only the longest output in a
        # batch shortens its decode): judged against the batch it is planned in.
        where = {id(item): pb for pb in batches for item in pb.items}
        for item in placed:
            if item.tokens < best.tokens and (
                slope * item.tokens + step * item.output_tokens >= overrun
                and member_saving(where[id(item)].items, item, slope, step) >= overrun
            ):
                best = item
        return best
    need = overrun / slope if slope > 0.0 else math.inf
    for item in placed:
        if need <= item.tokens < best.tokens:
            best = item
    return best
