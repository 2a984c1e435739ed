"""Gradient concurrency limiter: how many requests the fleet should have in flight.

What it decides: the current concurrency limit, inferred from latency alone. Queueing has an
unmistakable signature — recent latency rising above its long-run level — so the limiter
compares a short window against a long one, like delay-based TCP congestion control (and
Netflix's concurrency-limits ``Gradient2``).

Once per window (``window_s``, and only once it holds ``min_window_samples`` successes):

* ``short`` = mean latency of the window's successful requests; ``long`` = the long-run
  level: it follows ``short`` down at once and up only slowly (time constant
  ``long_window_s``), so it stays anchored to the latency of an un-queued fleet;
* a queue is forming when ``short > tolerance x long + queue_slack``; then the limit is
  multiplied by ``max(min_gradient, long / (tolerance x short))`` — a multiplicative decrease
  to a little below where latency would return to ``long`` if it grows with concurrency
  (``queue_slack`` keeps a few milliseconds of queueing on a fast fleet from counting).
  Cutting past that point drains the queue, so the next window sees un-queued latency again
  and ``long`` stays anchored to it; a cut that only reached the tolerance line would let
  ``long`` creep up with the queue and the limit drift upward (Gradient2's known failure);
* otherwise, if the window used at least half the limit, the limit grows by
  ``increase_gain x sqrt(limit)`` — a sublinear increase. A window that never used half the
  limit changes nothing: an idle fleet is no evidence for a higher limit, and a limit that
  grows without binding is no limit (defect 16);
* the limit is clamped to ``[min_limit, max_limit]``.

Cuts that bring no relief (``max_futile_cuts`` in a row after which latency did not fall
below ``relief_ratio`` of the previous window) mean the latency level itself moved — a slower
model version, a noisy neighbour — not that we built a queue; ``long`` is then re-based to
``short`` instead of cutting a healthy fleet down to the floor.

The batcher's own refusals are evidence too. A request it sheds after admission because the
queue ahead made it late (``queue_shed``) had a budget the un-queued fleet meets easily (at
least ``queue_shed_budget`` x the lowest window latency since the level last changed: not
``long``, which creeps up under a lasting queue), so the queue, not the request, is at fault.
When such sheds are at least ``queue_shed_share`` of a window's finished requests, the window is
queueing whatever its latency says: the successes' latency is censored at the deadline (what
would have been slower was shed), so it can sit level while the limit grows and the batcher
sheds ever more. The cut is then at least the shed share, such a window is never a "futile"
cut (the queue is provably ours) and ``long`` does not rise with it. A request that could not
make its deadline on an idle fleet never counts, so a tenant sending impossible deadlines
cannot cut the limit for everyone.

Updating per window, not per completion, bounds growth to one ``sqrt(limit)`` step per window
however many requests complete (the original grew per completion and never bound). The floor
``min_limit`` is its own setting: the headroom that probes for a higher limit is the
``sqrt(limit)`` term, not the floor.

Only successful requests feed latency (:meth:`GradientLimiter.release` with a latency);
failed, shed and cancelled requests release their slot with ``latency_s=None``: a fast failure
otherwise reads as an improvement and raises the limit of a fleet that is falling over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GradientLimiter", "GradientLimiterConfig"]


@dataclass(frozen=True)
class GradientLimiterConfig:
    initial_limit: float = 32.0
    min_limit: float = 4.0
    """The floor: the limit never goes below this, however bad latency gets."""
    max_limit: float = 2048.0
    window_s: float = 1.0
    """The limit changes at most once per window."""
    min_window_samples: int = 10
    """A window is judged only once it holds this many successful latencies."""
    long_window_s: float = 30.0
    """Memory of the long-run latency average."""
    tolerance: float = 1.1
    """Short latency may exceed long by this factor before the limit comes down."""
    queue_slack_s: float = 0.0
    """Latency above the tolerance line smaller than this is not acted on: a few milliseconds
    of queueing on a fast fleet are not an overload worth refusing work for."""
    min_gradient: float = 0.5
    """The most one window can cut (before smoothing)."""
    relief_ratio: float = 0.95
    """A cut "brought relief" if the next window's latency fell below this share of the last."""
    max_futile_cuts: int = 2
    """After this many cuts in a row without relief, the latency level is re-baselined."""
    increase_gain: float = 0.5
    """Each healthy, busy window adds ``increase_gain x sqrt(limit)``."""
    default_latency_s: float = 0.1
    """Latency assumed for retry advice before any sample."""
    queue_shed_share: float = 0.05
    """Queue-caused sheds, as a share of a window's finished requests, that mean a queue."""
    queue_shed_budget: float = 2.0
    """A shed counts as queue-caused only if its budget was at least this many x ``long``."""

    def __post_init__(self) -> None:
        if not 1.0 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("need 1 <= min_limit <= initial_limit <= max_limit")
        if not (self.window_s > 0.0 and self.long_window_s > 0.0):
            raise ValueError("windows must be positive")
        if not 0.0 < self.relief_ratio <= 1.0 or self.max_futile_cuts < 1:
            raise ValueError("need 0 < relief_ratio <= 1 and max_futile_cuts >= 1")
        if self.min_window_samples < 1:
            raise ValueError("min_window_samples must be at least 1")
        if self.tolerance < 1.0:
            raise ValueError("tolerance must be >= 1")
        if not (self.queue_slack_s >= 0.0 and math.isfinite(self.queue_slack_s)):
            raise ValueError("queue_slack_s must be finite and >= 0")
        if not 0.0 < self.min_gradient <= 1.0:
            raise ValueError("min_gradient must be in (0, 1]")
        if not 0.0 < self.increase_gain <= 4.0:
            raise ValueError("increase_gain must be in (0, 4]")
        if not self.default_latency_s > 0.0:
            raise ValueError("default_latency_s must be positive")
        if not 0.0 < self.queue_shed_share <= 1.0:
            raise ValueError("queue_shed_share must be in (0, 1]")
        if not (self.queue_shed_budget >= 1.0 and math.isfinite(self.queue_shed_budget)):
            raise ValueError("queue_shed_budget must be finite and >= 1")


class GradientLimiter:
    """Tracks inflight requests and adapts the limit per window. See the module docstring.

    Admission decisions (who gets which share of the limit) belong to the priority shedder;
    this class only counts and learns.
    """

    __slots__ = (
        "_config",
        "_cut_before",
        "_floor",
        "_futile_cuts",
        "_inflight",
        "_limit",
        "_long",
        "_prev_short",
        "_short",
        "_updates",
        "_window_count",
        "_window_max_inflight",
        "_window_queue_sheds",
        "_window_start",
        "_window_sum",
    )

    def __init__(self, config: GradientLimiterConfig | None = None, now: float = 0.0) -> None:
        self._config = config or GradientLimiterConfig()
        self._limit = float(self._config.initial_limit)
        self._inflight = 0
        self._long: float | None = None
        self._short: float | None = None
        self._updates = 0
        self._cut_before = False
        self._floor: float | None = None
        self._futile_cuts = 0
        self._prev_short = 0.0
        self._window_start = now
        self._window_sum = 0.0
        self._window_count = 0
        self._window_max_inflight = 0
        self._window_queue_sheds = 0

    @property
    def config(self) -> GradientLimiterConfig:
        return self._config

    @property
    def limit(self) -> int:
        """The current concurrency limit (whole requests)."""
        return max(1, math.floor(self._limit))

    @property
    def exact_limit(self) -> float:
        return self._limit

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def updates(self) -> int:
        """How many windows have been judged (the limit can have changed at most this often)."""
        return self._updates

    @property
    def short_latency_s(self) -> float | None:
        """Mean latency of the last judged window."""
        return self._short

    @property
    def long_latency_s(self) -> float | None:
        return self._long

    def latency_estimate(self) -> float:
        """Best current figure for how long a request takes (for retry advice)."""
        if self._short is not None:
            return self._short
        if self._window_count:
            return self._window_sum / self._window_count
        return self._config.default_latency_s

    def acquire(self, now: float) -> None:
        """Count one more request in flight (the shedder has already said yes)."""
        self._roll(now)
        self._inflight += 1
        self._window_max_inflight = max(self._window_max_inflight, self._inflight)

    def release(
        self, now: float, latency_s: float | None, *, queue_shed_budget_s: float | None = None
    ) -> None:
        """One request left. Pass its latency only if it succeeded; None otherwise.

        ``queue_shed_budget_s``: the request was shed after admission because of the queue
        ahead of it (deadline unreachable or missed, a full queue, shed for goodput), and this
        is the time it had left when admitted. It counts as evidence of a queue only if that
        budget was ample (see the module docstring).
        """
        if self._inflight <= 0:
            raise RuntimeError("release without a matching acquire")
        self._inflight -= 1
        if latency_s is not None and math.isfinite(latency_s) and latency_s > 0.0:
            self._window_sum += latency_s
            self._window_count += 1
        elif queue_shed_budget_s is not None and self._ample(queue_shed_budget_s):
            self._window_queue_sheds += 1
        self._roll(now)

    def _ample(self, budget_s: float) -> bool:
        """Would an un-queued fleet have met this budget with room to spare?"""
        base = self._floor if self._floor is not None else self._config.default_latency_s
        return math.isfinite(budget_s) and budget_s >= self._config.queue_shed_budget * base

    def _roll(self, now: float) -> None:
        cfg = self._config
        if now - self._window_start < cfg.window_s:
            return
        if self._window_count < cfg.min_window_samples:
            return  # not enough evidence yet: the window stays open
        elapsed = now - self._window_start
        sheds = self._window_queue_sheds
        self._judge(
            self._window_sum / self._window_count,
            elapsed,
            sheds / (sheds + self._window_count),
        )
        self._window_start = now
        self._window_sum = 0.0
        self._window_count = 0
        self._window_queue_sheds = 0
        self._window_max_inflight = self._inflight

    def _judge(self, short: float, elapsed: float, shed_share: float) -> None:
        cfg = self._config
        long = short if self._long is None else self._long
        limit = self._limit
        app_limited = self._window_max_inflight < limit / 2.0
        queueing = short > cfg.tolerance * long + cfg.queue_slack_s
        shedding = shed_share >= cfg.queue_shed_share
        gradient = long / (cfg.tolerance * short) if queueing else 1.0
        if shedding:
            # The batcher is refusing admitted work for the queue ahead of it: our queue.
            queueing = True
            gradient = min(gradient, 1.0 - shed_share)
            self._futile_cuts = 0
        elif queueing and self._cut_before and short >= cfg.relief_ratio * self._prev_short:
            # The last cut brought no relief: this latency is not our queue (a slower model,
            # a noisy neighbour). Accept it as the new normal instead of cutting to the floor.
            self._futile_cuts += 1
            if self._futile_cuts >= cfg.max_futile_cuts:
                long = short
                self._floor = short
                queueing = False
                self._futile_cuts = 0
        elif not queueing:
            self._futile_cuts = 0
        if queueing:
            # A queue is forming. Cut to a little below where the long-run latency would
            # return if latency grows with concurrency, at most by min_gradient.
            limit *= max(cfg.min_gradient, gradient)
        elif not app_limited:
            limit += cfg.increase_gain * math.sqrt(limit)  # probe upward, sublinearly
        # else: the window never used half the limit, which is no evidence for more.
        self._limit = min(cfg.max_limit, max(cfg.min_limit, limit))
        if short <= long:
            self._long = short
        elif shedding:
            self._long = long  # queue latency, censored at the deadline: not the fleet's level
        else:
            w = math.exp(-elapsed / cfg.long_window_s)
            self._long = w * long + (1.0 - w) * short
        self._floor = short if self._floor is None else min(self._floor, short)
        self._cut_before = queueing
        self._prev_short = short
        self._short = short
        self._updates += 1

    def __repr__(self) -> str:
        return f"GradientLimiter(limit={self._limit:.1f}, inflight={self._inflight})"
