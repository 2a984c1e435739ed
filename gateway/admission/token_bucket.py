"""A token bucket measured in predicted work, with refunds and computed retry advice.

What it decides: whether a request costing ``cost`` tokens fits a tenant's quota now, and if
not, exactly how long until it would (the ``RetryInfo`` a client gets is this figure, not a
constant).

Rules:

* Tokens refill continuously at ``rate`` per second up to ``burst``.
* A request is admissible when the bucket holds ``min(cost, burst)`` tokens, and is then
  charged its full ``cost`` (the balance may go negative). So a request larger than the burst
  is not refused forever: it waits for a full bucket and then pays its way in debt, which
  later requests wait out. Work, not request count, is what the quota limits.
* Nothing is charged by asking (:meth:`TokenBucket.time_until`, :meth:`TokenBucket.can_take`);
  charging is a separate step so admission can charge only requests that are admitted.
* :meth:`TokenBucket.refund` gives tokens back (a request shed after admission), never above
  ``burst``.
* Time is an explicit ``now``; a reading earlier than the last one adds nothing.
"""

from __future__ import annotations

import math

__all__ = ["TokenBucket"]


class TokenBucket:
    __slots__ = ("_burst", "_last", "_rate", "_tokens")

    def __init__(self, rate: float, burst: float, now: float, tokens: float | None = None) -> None:
        self._check(rate, burst)
        self._rate = float(rate)
        self._burst = float(burst)
        self._tokens = self._burst if tokens is None else min(float(tokens), self._burst)
        self._last = now

    @staticmethod
    def _check(rate: float, burst: float) -> None:
        if not (math.isfinite(rate) and rate >= 0.0):
            raise ValueError(f"rate must be finite and >= 0, got {rate}")
        if not (math.isfinite(burst) and burst > 0.0):
            raise ValueError(f"burst must be finite and > 0, got {burst}")

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
            self._last = now

    def tokens(self, now: float) -> float:
        """The balance at ``now`` (negative while paying off a request larger than the burst)."""
        self._refill(now)
        return self._tokens

    def _needed(self, cost: float) -> float:
        if not (math.isfinite(cost) and cost >= 0.0):
            raise ValueError(f"cost must be finite and >= 0, got {cost}")
        return min(cost, self._burst)

    def can_take(self, cost: float, now: float) -> bool:
        return self.tokens(now) >= self._needed(cost)

    def time_until(self, cost: float, now: float) -> float:
        """Seconds until a request of ``cost`` becomes admissible (0.0 if it is now).

        ``inf`` if the bucket never refills (rate 0) and is short.
        """
        shortfall = self._needed(cost) - self.tokens(now)
        if shortfall <= 0.0:
            return 0.0
        if self._rate == 0.0:
            return math.inf
        return shortfall / self._rate

    def take(self, cost: float, now: float) -> bool:
        """Charge ``cost`` if admissible now; returns whether it was charged."""
        if not self.can_take(cost, now):
            return False
        self._tokens -= cost
        return True

    def refund(self, cost: float, now: float) -> None:
        """Give back tokens charged for work that was never done (capped at the burst)."""
        if not (math.isfinite(cost) and cost >= 0.0):
            raise ValueError(f"refund must be finite and >= 0, got {cost}")
        self._refill(now)
        self._tokens = min(self._burst, self._tokens + cost)

    def reconfigure(self, rate: float, burst: float, now: float) -> None:
        """Change rate and burst (config reload), keeping the balance (capped at the new burst)."""
        self._check(rate, burst)
        self._refill(now)
        self._rate = float(rate)
        self._burst = float(burst)
        self._tokens = min(self._tokens, self._burst)

    def __repr__(self) -> str:
        return f"TokenBucket(rate={self._rate}, burst={self._burst}, tokens={self._tokens:.3g})"
