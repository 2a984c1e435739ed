"""How long may one batch run? The horizon, and which deadline classes it protects.

What it decides: the cap on a batch's expected duration. Batch size is otherwise emergent
(deadlines bound it from below, the queue from above); the horizon is what keeps a deep
backlog of patient work from being served as one huge batch while tighter requests arrive and
miss.

How:

* **Protecting a deadline class of budget T.** A request of that class arriving just after a
  batch of length ``H`` starts waits ``H``, then must ride the next batch, which must hold at
  least the class's own arrivals during ``H`` plus one intercept — all at the conservative
  spread ``f``. So ``H + f·(a + b·u·H) ≤ T`` for ``u`` tokens/s of such arrivals, i.e.
  ``H = (T − f·a) / (1 + f·b·u)`` (times ``k`` with ``k`` slots, since the wait is for the
  first of ``k`` staggered slots), and never less than the even split ``T·k/(k+1)``.
* **Whether to protect it at all.** Short batches pay the intercept more often: with pairs of
  batches averaging ``T·k/(k+1)`` and planned at spread ``f``, capacity in tokens/s is
  ``k·(1 − f·a/(T·k/(k+1)))/(f·b)``. For each candidate class the batcher estimates the requests
  per second it would finish — every class at least as patient as the candidate is servable,
  shed largest-first down to capacity, tighter ones served only opportunistically (when the
  device has slack) — and picks the candidate that finishes the most. With 30 % of requests at
  120 ms and the rest at 900 ms, protecting the 120 ms class wins (≈79 ms batches); with a
  60 ms class on an 18 ms intercept device it costs so much capacity that serving the 500 ms
  class well (and 60 ms requests when there is slack) wins instead. No share threshold, no SLO
  configured: only the observed mix and the learned cost model.

* **A batch's fixed cost.** The fluid estimates price a batch as ``a + b × tokens``. On a device
  whose batches decode (a per-step cost, see ``cost_model``) a batch's fixed part also holds
  the decode steps of its longest output, so the batcher passes ``a = intercept + step ×`` the
  recent mean longest output of its batches (the intercept alone on a device without a decode
  loop).

Cost: the choice is re-made once per window of arrivals, in two sorts of the window plus
prefix sums (``O(n log n)``), not a pass over the window per candidate class.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter

# Candidate classes are considered from the tightest up; a mix with more distinct budgets than
# this has its loosest ones folded into the last candidate.
MAX_CANDIDATES = 6
# Below this many recent arrivals the mix is too thin to choose from: no horizon.
MIN_SAMPLE = 32
# Partial protection of the tightest class: horizons this many times the protecting one.
_STRETCHES = (1.5, 2.0)
# Keys of a ``(relative deadline, tokens)`` pair.
_BUDGET = itemgetter(0)
_TOKENS = itemgetter(1)


def protecting_horizon(
    tight: float,
    tight_token_rate: float,
    *,
    intercept: float,
    slope: float,
    spread_factor: float,
    slots: int,
) -> float:
    """The longest batch after which a ``tight``-budget arrival can still ride the next one."""
    k = slots if slots > 1 else 1
    even = tight * k / (k + 1)
    room = k * (tight - spread_factor * intercept)
    full = room / (1.0 + spread_factor * slope * tight_token_rate)
    return full if full > even else even


@dataclass(frozen=True, slots=True)
class HorizonChoice:
    """The chosen horizon, the deadline budget it protects, that budget's work rate, and the
    request size above which the fluid estimate says work cannot all be served (``inf`` when
    it all fits) — a floor of sanity for the shed threshold."""

    horizon: float
    budget: float
    budget_token_rate: float
    size_cut: float
    stretch: float = 1.0  # horizon = stretch x protecting_horizon(budget, budget_token_rate)


def deadline_classes(budgets: Sequence[float]) -> list[tuple[float, float]]:
    """Groups relative deadlines into classes ``(tightest, loosest)``: budgets within 10 % of a
    class's tightest member belong to it (so float noise in ``deadline − now`` does not split a
    class)."""
    ordered = sorted(budgets)
    classes: list[tuple[float, float]] = []
    i, n = 0, len(ordered)
    while i < n:
        tightest = ordered[i]
        # The class runs up to the last budget within 10 % of its tightest (at least that one
        # itself: a negative budget is less than its own 110 %).
        end = max(i + 1, bisect.bisect_right(ordered, tightest * 1.1, i))
        classes.append((tightest, ordered[end - 1]))
        i = end
    return classes


def choose_horizon(
    window: Sequence[tuple[float, int]],
    span_s: float,
    *,
    intercept: float,
    slope: float,
    spread_factor: float,
    slots: int,
) -> HorizonChoice:
    """Picks the horizon for the recent ``window`` of ``(relative deadline, tokens)`` arrivals.

    Returns a :class:`HorizonChoice`; ``span_s`` is how long the window took to arrive.
    """
    if len(window) < MIN_SAMPLE or span_s <= 0.0 or slope <= 0.0:
        return HorizonChoice(math.inf, math.inf, 0.0, math.inf)
    # Tokens are integers, so running sums of them are exact in any order: each class's work
    # rate is a prefix sum over the window sorted by budget (one sort, not a pass per class).
    by_budget = sorted(window, key=_BUDGET)
    budgets = list(map(_BUDGET, by_budget))
    work_within = list(accumulate(map(_TOKENS, by_budget), initial=0))
    classes = deadline_classes(budgets)
    if len(classes) > MAX_CANDIDATES:
        # Keep the tightest candidates (where the choice matters) and the loosest class.
        classes = [*classes[: MAX_CANDIDATES - 1], classes[-1]]
    by_size = sorted(window, key=_TOKENS)  # stable: equal sizes keep arrival order
    best = (-1.0, HorizonChoice(math.inf, math.inf, 0.0, math.inf))
    k = max(1, slots)
    f = spread_factor
    fa = f * intercept
    candidates: list[tuple[float, float, float, float, float]] = []
    for index, (tightest, loosest) in enumerate(classes):
        tight_rate = work_within[bisect.bisect_right(budgets, loosest)] / span_s
        horizon = protecting_horizon(
            tightest,
            tight_rate,
            intercept=intercept,
            slope=slope,
            spread_factor=spread_factor,
            slots=slots,
        )
        # Protecting this class: back-to-back pairs of batches average the even split of its
        # budget (the batch after a protected arrival must be short when the one before ran
        # long).
        candidates.append((tightest, tight_rate, 1.0, tightest, tightest * k / (k + 1)))
        if index == 0 and len(classes) > 1:
            # Or only half-protecting the tightest class: longer batches, run at the cap,
            # serve it when they can (opportunistically) — worth it when batches are mostly
            # intercept and a little more length buys a lot of capacity.
            looser = classes[1][0]
            for stretch in _STRETCHES:
                candidates.append((tightest, tight_rate, stretch, looser, stretch * horizon))
    # Candidates share their split of the window (several protect from the same class).
    splits: dict[float, tuple[list[int], list[tuple[float, int]], list[float]]] = {}
    for budget, rate, stretch, servable_from, batch_average in candidates:
        if batch_average <= fa:
            continue
        split = splits.get(servable_from)
        if split is None:
            # In size order: what this horizon protects, and the tighter rest (see
            # ``_opportunistic``); ``fill[i]`` is the work of the i smallest protected ones,
            # summed one by one as a greedy fill would.
            if servable_from <= budgets[0]:  # the tightest class: everything is protected
                servable = list(map(_TOKENS, by_size))
                tighter = []
            else:
                servable = [t for r, t in by_size if r >= servable_from]
                tighter = [(r, t) for r, t in by_size if r < servable_from]
            fill = list(accumulate(servable, initial=0.0))
            splits[servable_from] = split = (servable, tighter, fill)
        servable, tighter, fill = split
        capacity = k * (1.0 - fa / batch_average) / (f * slope)
        budget_tokens = capacity * span_s
        # Serve the smallest first until the next one no longer fits (``fill`` increases).
        fits = bisect.bisect_right(fill, budget_tokens, 1) - 1
        used = fill[fits]
        cut = float(servable[fits]) if fits < len(servable) else math.inf
        served = float(fits)
        served += _opportunistic(
            tighter, servable_from, used, budget_tokens, span_s, fa, f, slope, k
        )
        horizon = stretch * protecting_horizon(
            budget, rate, intercept=intercept, slope=slope, spread_factor=f, slots=slots
        )
        # Ties go to the earlier candidate (tighter protection serves patient work better).
        if served > best[0]:
            best = (served, HorizonChoice(horizon, budget, rate, cut, stretch))
    return best[1]


def _opportunistic(
    by_size: Sequence[tuple[float, int]],
    protected: float,
    used: float,
    budget_tokens: float,
    span_s: float,
    fa: float,
    f: float,
    slope: float,
    slots: int,
) -> float:
    """Tighter, unprotected requests that still make it when the device has slack.

    EDF still puts them first, in a batch sized to their own deadline, so one succeeds when
    the batch already running when it arrives ends soon enough: with batches cycling every
    ``d = f·a / (1 − load)`` seconds, a share ``(r − c)/d`` of arrivals with budget ``r`` whose
    own batch costs ``c``. Counted at half that share (serving them adds load and shortens the
    cycle's batches), and only within the capacity left over. ``by_size`` may hold only the
    tighter requests (the rest are skipped anyway).
    """
    load = used * f * slope / (span_s * slots)
    if load >= 1.0:
        return 0.0
    cycle = fa / (1.0 - load)
    if cycle <= 0.0:
        # A device with no fixed cost per batch: there is no cycle to wait out, every tighter
        # request fits in a batch of its own.
        cycle = math.ulp(1.0)
    served = 0.0
    fb = f * slope
    for r, t in by_size:
        if r >= protected:
            continue
        # Half of the share (r − c)/cycle clamped to [0, 1], comparisons written out (this
        # runs for every tighter request of every candidate).
        share = (r - (fa + fb * t)) / cycle
        if not share > 0.0:
            continue
        share = 0.5 * share if share < 1.0 else 0.5
        if share <= 0.0:
            continue
        work = share * t
        if used + work > budget_tokens:
            break
        used += work
        served += share
    return served
