"""Time-decayed moving averages: a plain EWMA and the routing "peak EWMA" for latency.

What it decides: how much an old estimate still counts when a new sample arrives, and what a
latency estimate should be when no samples arrive at all.

Why by elapsed time: samples arrive irregularly (a batch completes many requests at one
instant; an idle replica completes none), so weighting per sample would let a burst of
same-instant samples swamp the estimate and let a quiet period freeze it. Both classes weight
the old estimate by ``exp(-dt / tau_s)`` where ``dt`` is the time since the last sample.

Why a prior for the peak EWMA (defect 12 of the original): an idle replica's latency estimate
must relax toward a sensible prior, not toward zero — an estimate of zero makes the router
pile every request onto the replica it knows least about.

All times are explicit ``now`` arguments in seconds on a monotonic timeline; a ``now`` that is
slightly earlier than the last one (readings taken on different threads or loops) is treated
as no time having passed.
"""

from __future__ import annotations

import math

__all__ = ["DecayingEwma", "PeakEwma"]


def _check_tau(tau_s: float) -> float:
    if not (math.isfinite(tau_s) and tau_s > 0.0):
        raise ValueError(f"tau_s must be positive and finite, got {tau_s}")
    return float(tau_s)


def _check_finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


class _TimeWeighted:
    """What both averages share: a memory ``tau_s`` in seconds, a prior, the last sample time."""

    __slots__ = ("_estimate", "_last_at", "_prior", "_tau_s")

    def __init__(self, tau_s: float, prior: float) -> None:
        self._tau_s = _check_tau(tau_s)
        self._prior = _check_finite("prior", prior)
        self._estimate = self._prior
        self._last_at: float | None = None

    @property
    def tau_s(self) -> float:
        return self._tau_s

    @property
    def last_sample_at(self) -> float | None:
        """The time of the latest sample (the latest ``now`` seen), or None before any."""
        return self._last_at


class DecayingEwma(_TimeWeighted):
    """An exponentially weighted moving average whose memory is measured in seconds.

    On each sample the old estimate keeps weight ``exp(-dt / tau_s)`` and the sample gets the
    rest. The first sample replaces the prior outright. Between samples the estimate does not
    change: it summarises the samples seen, and idleness is not evidence.
    """

    __slots__ = ()

    def observe(self, value: float, now: float) -> None:
        value = _check_finite("value", value)
        if self._last_at is None:
            self._estimate = value
            self._last_at = now
            return
        dt = max(0.0, now - self._last_at)
        w = math.exp(-dt / self._tau_s)
        self._estimate = w * self._estimate + (1.0 - w) * value
        self._last_at = max(self._last_at, now)

    def value(self, now: float) -> float:
        """The current estimate (the prior before any sample).

        ``now`` is accepted for symmetry with :meth:`PeakEwma.estimate`; this average does
        not move between samples.
        """
        del now
        return self._estimate


class PeakEwma(_TimeWeighted):
    """Peak-sensitive latency estimate for load balancing (the "tower"/Finagle peak EWMA).

    * A sample above the current estimate replaces it at once: a replica that just got slow
      is believed immediately.
    * A lower sample is blended in, the old estimate keeping weight ``exp(-dt / tau_s)``, so
      the estimate comes down by elapsed time, not by the number of fast samples.
    * With no samples, the estimate relaxes toward the prior:
      ``prior + (est_last - prior) * exp(-(now - t_last) / tau_s)``.

    "Current estimate" always means :meth:`estimate` at the sample's time, i.e. after idle
    relaxation. A lower sample's blend is also capped at that current estimate: without the
    cap, blending from the un-relaxed ``est_last`` could *raise* the estimate above where it
    stood on a sample lower than it (e.g. est_last 100, relaxed to 43, sample 40 -> 62).
    The result is always a convex combination of the prior and samples, so it stays within
    their range, and a steady stream of one value converges to that value.
    """

    __slots__ = ()

    @property
    def prior(self) -> float:
        return self._prior

    def set_prior(self, prior: float) -> None:
        """Change what an idle estimate relaxes toward (e.g. a fleet-wide latency figure).

        The last sampled estimate is kept; only the idle relaxation target changes.
        """
        self._prior = _check_finite("prior", prior)
        if self._last_at is None:
            self._estimate = self._prior

    def estimate(self, now: float) -> float:
        """The latency estimate at ``now``: the prior before any sample."""
        if self._last_at is None:
            return self._prior
        dt = now - self._last_at
        if dt <= 0.0:
            return self._estimate
        relaxed = self._prior + (self._estimate - self._prior) * math.exp(-dt / self._tau_s)
        # Rounding must not push the estimate past the prior or back past the last estimate.
        return min(max(relaxed, min(self._prior, self._estimate)), max(self._prior, self._estimate))

    def observe(self, value: float, now: float) -> None:
        value = _check_finite("value", value)
        if self._last_at is None:
            # Evidence replaces the guess outright, whichever side of it the sample lies.
            self._estimate = value
            self._last_at = now
            return
        current = self.estimate(now)
        if value >= current:
            self._estimate = value
        else:
            w = math.exp(-max(0.0, now - self._last_at) / self._tau_s)
            self._estimate = min(current, w * self._estimate + (1.0 - w) * value)
        self._last_at = max(self._last_at, now)
