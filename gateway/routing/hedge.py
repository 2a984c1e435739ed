"""Hedged dispatch: when to send a slow batch to a second replica, and who wins the race.

What it decides: whether a batch whose primary attempt has been running for longer than the
fleet's recent p95 gets a second attempt on another replica, and — once attempts report —
which result the caller keeps and which attempts it must cancel.

A hedge is sent only when all of these hold (checked cheapest first):

1. the fleet p95 is known: the rotating histogram of successful batch latencies holds at
   least ``min_samples`` samples (``hedge_delay`` is None before that);
2. the primary has been out for at least that delay;
3. the budget allows: a token bucket that earns ``budget_ratio`` tokens per primary dispatch
   and spends one per hedge, so hedges never exceed ``budget_ratio x dispatches + burst``;
4. the fleet is not near saturation: nothing is waiting for a slot (the caller says how much
   is) and slot utilisation is below ``max_utilization``. A hedge spends spare capacity to
   buy tail latency; without spare capacity it takes the slot the next batch needed;
5. a spare replica exists besides the primary's (the batch being hedged is not counted
   against the fleet twice: defect 6 of the original), with a closed breaker;
6. the hedge can still meet the earliest deadline in the batch.

Only successful batch latencies feed the histogram; faults, busy replies and cancelled losers
never do. The race is "first success wins, fail only when every attempt failed"
(:class:`HedgeRace`): a hedge failing fast must not kill a primary that is running fine.

Example (inside an asyncio dispatch; ``policy.record_dispatch()`` once per primary)::

    delay = policy.hedge_delay(clock.now())
    done, _ = await asyncio.wait({primary_task}, timeout=delay)
    if not done:
        hedge = policy.may_hedge(clock.now(), router, primary, earliest_deadline,
                                 predicted_latency_s=cost_model.predict_for, waiting=queue_len)
        if isinstance(hedge, Lease):
            race.add_hedge(hedge)
            ...                    # start the second ExecuteBatch
    # as each attempt reports: result = race.settle(lease, ok)
    # for loser in result.cancel: cancel it, then router.complete(loser, Outcome.CANCELLED, ...)
    # on success: policy.record_latency(latency_s)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

from common.clock import Clock
from common.histogram import RotatingHistogram
from gateway.routing.outcome import Outcome
from gateway.routing.router import Lease, NoCapacity, PeakEwmaRouter

__all__ = [
    "HedgeBudget",
    "HedgeConfig",
    "HedgeDeclined",
    "HedgePolicy",
    "HedgeRace",
    "NoHedge",
    "RaceResult",
    "RaceVerdict",
]


@dataclass(frozen=True)
class HedgeConfig:
    quantile: float = 0.95
    """Hedge a batch once it has been out longer than this quantile of recent latencies."""
    min_samples: int = 50
    """No hedging until the window holds this many successful latencies."""
    window_s: float = 10.0
    """How recent "recent" is for the quantile."""
    window_slots: int = 5
    budget_ratio: float = 0.05
    """Hedge tokens earned per primary dispatch (0.05 = at most ~5 % extra load)."""
    budget_burst: float = 5.0
    """Most hedge tokens that can be saved up."""
    max_utilization: float = 0.9
    """Stand down when this share of routable slots is in use."""
    delay_refresh_s: float = 0.05
    """The quantile is re-read from the histogram at most this often."""

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        if self.min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        if not 0.0 <= self.budget_ratio <= 1.0:
            raise ValueError("budget_ratio must be in [0, 1]")
        if self.budget_burst < 1.0:
            raise ValueError("budget_burst must allow at least one hedge")
        if not 0.0 < self.max_utilization <= 1.0:
            raise ValueError("max_utilization must be in (0, 1]")
        if self.delay_refresh_s < 0.0:
            raise ValueError("delay_refresh_s must be non-negative")


class HedgeBudget:
    """A token bucket filled by dispatches rather than by time.

    Every primary dispatch deposits ``ratio`` tokens (up to ``burst``); a hedge spends one.
    Starting empty, hedges can never exceed ``ratio x dispatches`` (plus nothing): the budget
    is a share of real traffic, so it cannot be saved up during a quiet night and spent in a
    burst.
    """

    __slots__ = ("_burst", "_ratio", "_tokens")

    def __init__(self, ratio: float, burst: float, initial: float = 0.0) -> None:
        if not 0.0 <= ratio <= 1.0 or burst < 1.0 or not 0.0 <= initial <= burst:
            raise ValueError("need 0 <= ratio <= 1, burst >= 1, 0 <= initial <= burst")
        self._ratio = ratio
        self._burst = burst
        self._tokens = initial

    @property
    def tokens(self) -> float:
        return self._tokens

    def deposit(self) -> None:
        self._tokens = min(self._burst, self._tokens + self._ratio)

    def can_spend(self) -> bool:
        # A hair of tolerance: 20 deposits of 0.05 must buy a hedge despite float rounding.
        return self._tokens >= 1.0 - 1e-9

    def try_spend(self) -> bool:
        if not self.can_spend():
            return False
        self._tokens = max(0.0, self._tokens - 1.0)
        return True


_TIMER_SLACK_S = 1e-6


class HedgeDeclined(StrEnum):
    NO_BASELINE = "no_baseline"
    """Too few recent successes to know the fleet p95."""
    TOO_EARLY = "too_early"
    """The primary has not yet been out for the hedge delay."""
    NO_BUDGET = "no_budget"
    SATURATED = "saturated"
    NO_SPARE = "no_spare"
    DEADLINE = "deadline"
    """The hedge could not finish before the batch's earliest deadline."""


@dataclass(frozen=True)
class NoHedge:
    reason: HedgeDeclined
    wait_s: float | None = None
    """For TOO_EARLY: how much longer the primary must run before a hedge is considered."""


class HedgePolicy:
    """Hedge timing, budget and admission. See the module docstring."""

    def __init__(self, clock: Clock, config: HedgeConfig | None = None) -> None:
        self._config = cfg = config or HedgeConfig()
        self._latencies = RotatingHistogram(clock, cfg.window_s, cfg.window_slots)
        self._budget = HedgeBudget(cfg.budget_ratio, cfg.budget_burst)
        self._delay: float | None = None
        self._delay_read_at: float | None = None
        self.dispatches = 0
        """Primary dispatches recorded."""
        self.hedges = 0
        """Hedges granted."""

    @property
    def config(self) -> HedgeConfig:
        return self._config

    @property
    def budget(self) -> HedgeBudget:
        return self._budget

    def record_dispatch(self) -> None:
        """Count one primary dispatch (earns hedge budget). Hedges themselves earn nothing."""
        self.dispatches += 1
        self._budget.deposit()

    def record_latency(self, latency_s: float) -> None:
        """Record one successful batch latency. Never call it for faults, busy or cancelled."""
        if math.isfinite(latency_s) and latency_s >= 0.0:
            self._latencies.record(latency_s)

    def hedge_delay(self, now: float) -> float | None:
        """How long a primary may run before it is worth hedging; None while unknown."""
        cfg = self._config
        stale = (
            self._delay_read_at is None
            or now - self._delay_read_at >= cfg.delay_refresh_s
            or now < self._delay_read_at
        )
        if stale:
            self._delay_read_at = now
            if self._latencies.count < cfg.min_samples:
                self._delay = None
            else:
                self._delay = self._latencies.quantile(cfg.quantile)
        return self._delay

    def may_hedge(
        self,
        now: float,
        router: PeakEwmaRouter,
        primary: Lease,
        earliest_deadline: float | None,
        predicted_latency_s: float | Callable[[str], float] | None = None,
        *,
        waiting: int = 0,
    ) -> Lease | NoHedge:
        """Take a hedge lease for ``primary``'s batch, or say why not.

        ``predicted_latency_s`` is the batch's predicted execution time: a number, or a
        function of the replica id (per-replica cost models); None uses the router's latency
        estimate of the chosen replica. ``waiting`` is how much work is queued for a slot.
        A granted hedge has spent one budget token; release it with ``router.complete``.
        """
        delay = self.hedge_delay(now)
        if delay is None:
            return NoHedge(HedgeDeclined.NO_BASELINE)
        elapsed = now - primary.dispatched_at
        if elapsed + _TIMER_SLACK_S < delay:  # a timer armed for `delay` may fire a hair early
            return NoHedge(HedgeDeclined.TOO_EARLY, delay - elapsed)
        if not self._budget.can_spend():
            return NoHedge(HedgeDeclined.NO_BUDGET)
        if waiting > 0 or router.utilization(now) >= self._config.max_utilization:
            return NoHedge(HedgeDeclined.SATURATED)
        lease = router.pick(now, exclude={primary.replica_id}, hedge=True)
        if isinstance(lease, NoCapacity):
            return NoHedge(HedgeDeclined.NO_SPARE)
        if earliest_deadline is not None:
            if predicted_latency_s is None:
                predicted = router.latency_estimate(lease.replica_id, now) or 0.0
            elif callable(predicted_latency_s):
                predicted = predicted_latency_s(lease.replica_id)
            else:
                predicted = predicted_latency_s
            if now + predicted > earliest_deadline:
                router.complete(lease, Outcome.CANCELLED, None, now)
                return NoHedge(HedgeDeclined.DEADLINE)
        self._budget.try_spend()
        self.hedges += 1
        return lease


class RaceVerdict(StrEnum):
    PENDING = "pending"
    """No success yet and some attempt is still out: keep waiting."""
    WON = "won"
    """An attempt succeeded: deliver its result, cancel the ones in ``cancel``."""
    LOST = "lost"
    """Every attempt failed: the batch failed."""


H = TypeVar("H")
"""An attempt handle: a :class:`Lease` in the gateway; anything identity-comparable."""


@dataclass(frozen=True)
class RaceResult(Generic[H]):
    verdict: RaceVerdict
    winner: H | None = None
    cancel: tuple[H, ...] = ()


@dataclass(eq=False)
class HedgeRace(Generic[H]):
    """First success wins; the batch fails only when every attempt failed ("any", not "race").

    Pure bookkeeping: it never cancels anything itself. The caller cancels what
    :meth:`settle` lists and releases those leases as CANCELLED. Attempts are matched by
    identity.
    """

    primary: H
    _outstanding: list[H] = field(default_factory=list, repr=False)
    _winner: H | None = field(default=None, repr=False)
    _lost: bool = field(default=False, repr=False)
    hedged: bool = False

    def __post_init__(self) -> None:
        self._outstanding.append(self.primary)

    @property
    def outstanding(self) -> tuple[H, ...]:
        return tuple(self._outstanding)

    @property
    def winner(self) -> H | None:
        return self._winner

    @property
    def settled(self) -> bool:
        return self._winner is not None or self._lost

    def add_hedge(self, lease: H) -> None:
        if self.settled:
            raise RuntimeError("cannot hedge a race that is already settled")
        self._outstanding.append(lease)
        self.hedged = True

    def settle(self, lease: H, ok: bool) -> RaceResult[H]:
        """Report one attempt's end (``ok`` = success). Unknown or late reports change nothing."""
        index = next((i for i, a in enumerate(self._outstanding) if a is lease), None)
        if index is None:
            return self._current()
        del self._outstanding[index]
        if self.settled:
            return self._current()
        if ok:
            self._winner = lease
            cancel = tuple(self._outstanding)
            self._outstanding.clear()
            return RaceResult(RaceVerdict.WON, lease, cancel)
        if not self._outstanding:
            self._lost = True
            return RaceResult(RaceVerdict.LOST)
        return RaceResult(RaceVerdict.PENDING)

    def _current(self) -> RaceResult[H]:
        if self._winner is not None:
            return RaceResult(RaceVerdict.WON, self._winner)
        if self._lost:
            return RaceResult(RaceVerdict.LOST)
        return RaceResult(RaceVerdict.PENDING)
