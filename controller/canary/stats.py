"""The statistics the canary judge rests on: quantiles, a rank test, e-values.

What it decides: nothing on its own — these are the numbers behind every verdict.

* ``rank_test``: the Mann–Whitney U test (normal approximation with tie correction, which is
  accurate at the sample sizes a window needs) of "canary latencies are stochastically larger",
  with the common-language effect size ``P(canary > baseline) + ½ P(tie)`` and its
  rank-biserial form ``2·CL − 1``. A p-value alone would call a 1 % slowdown significant on
  enough traffic; the effect size says whether it matters.
* ``odds_log_evidence``: an e-value against "a failure rate is at most ``rate``", an average of
  likelihood ratios of alternatives with 2 to 16 times the null's odds. By Ville's inequality
  it ever reaches ``1/α`` with probability at most ``α``, however often it is looked at, with
  no fixed sample size (ADR 0008).
* ``BettingEProcess``: a test by betting that the mean of values in [0, 1] is at most ``m0``
  (a mixture over a small grid of fixed bets, each a nonnegative supermartingale under the
  null, so their average is an e-process).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "BettingEProcess",
    "RankTest",
    "binomial_tail_bound",
    "log_mean_exp",
    "odds_log_evidence",
    "odds_log_evidence_at",
    "rank_test",
    "sorted_quantile",
]

FloatArray = npt.NDArray[np.float64]


def sorted_quantile(ordered: FloatArray, q: float) -> float:
    """The ``q`` quantile of already sorted values, interpolated as ``numpy.quantile`` does.

    The sequential tests need a baseline quantile on every tick; sorting once and indexing
    is several times cheaper than ``numpy.quantile``.
    """
    n = ordered.size
    if n == 0:
        return math.nan
    position = q * (n - 1)
    low = int(position)
    high = min(low + 1, n - 1)
    fraction = position - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


@dataclass(frozen=True)
class RankTest:
    """Mann–Whitney U of canary against baseline, one-sided towards "canary slower"."""

    u: float
    z: float
    p_slower: float
    common_language: float

    @property
    def rank_biserial(self) -> float:
        return 2.0 * self.common_language - 1.0


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def rank_test(canary: FloatArray, baseline: FloatArray) -> RankTest | None:
    """Mann–Whitney U on two latency samples; None when either is empty."""
    n_c, n_b = canary.size, baseline.size
    if n_c == 0 or n_b == 0:
        return None
    combined = np.sort(np.concatenate((canary, baseline)))
    left = np.searchsorted(combined, canary, side="left")
    right = np.searchsorted(combined, canary, side="right")
    rank_sum = float(np.sum(left + right + 1)) / 2.0  # average ranks, 1-based
    u = rank_sum - n_c * (n_c + 1) / 2.0
    total = n_c + n_b
    _, counts = np.unique(combined, return_counts=True)
    ties = float(np.sum(counts.astype(np.float64) ** 3 - counts))
    variance = n_c * n_b / 12.0 * ((total + 1) - ties / (total * (total - 1) or 1))
    mean = n_c * n_b / 2.0
    # Continuity-corrected normal approximation; all-tied samples carry no evidence.
    z = 0.0 if variance <= 0.0 else (u - mean - 0.5) / math.sqrt(variance)
    return RankTest(u=u, z=z, p_slower=_normal_sf(z), common_language=u / (n_c * n_b))


def _bernoulli_kl(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)) in nats, for p in (0, 1)."""
    total = 0.0
    if q > 0.0:
        total += q * math.log(q / p)
    if q < 1.0:
        total += (1.0 - q) * math.log((1.0 - q) / (1.0 - p))
    return total


def binomial_tail_bound(successes: int, trials: int, rate: float) -> float:
    """An upper bound on ``P(Binomial(trials, rate) >= successes)``: a conservative p-value.

    Chernoff: ``exp(−n · KL(k/n ‖ p))`` when ``k/n > p`` (1 otherwise). Conservative, so a
    window verdict built on it errs towards "not proven".
    """
    if trials == 0 or successes <= trials * rate:
        return 1.0
    if rate <= 0.0:
        return 0.0
    if rate >= 1.0:
        return 1.0
    return math.exp(-trials * _bernoulli_kl(successes / trials, rate))


ODDS_RATIOS: tuple[float, ...] = tuple(2.0 * 2.0 ** (i / 2) for i in range(7))  # 2 … 16


def odds_log_evidence(
    failures: int, trials: int, rate: float, odds_ratios: Sequence[float] = ODDS_RATIOS
) -> float:
    """log of an e-value against "the failure rate is at most ``rate``", from ``trials``.

    An average of likelihood ratios, each of an alternative whose odds are ``k`` times the
    null's: per trial the factor is ``k^x / (1 − rate + k·rate)``. Under any rate ``p <=
    rate`` its expectation is ``(1 − p + k·p) / (1 − rate + k·rate) <= 1``, so each product —
    and their average — is a nonnegative supermartingale (Ville: it ever reaches ``1/α`` with
    probability at most ``α``). It also *decreases* as ``rate`` grows, which is what lets the
    error test take its minimum over baseline rates interval by interval
    (:mod:`controller.canary.error_test`). The half-octave grid of odds ratios 2-16 covers
    "twice the tolerated odds" to "broken"; neighbouring ratios all contribute, so it needs a few
    per cent fewer requests than the four octaves 2, 4, 8, 16 for +2 and +5 point canaries.
    """
    if trials == 0:
        return 0.0
    if rate <= 0.0:
        return math.inf if failures > 0 else 0.0
    logs = [failures * math.log(k) - trials * math.log1p((k - 1.0) * rate) for k in odds_ratios]
    peak = max(logs)
    return peak + math.log(sum(math.exp(v - peak) for v in logs) / len(logs))


def odds_log_evidence_at(
    failures: int, trials: int, rates: FloatArray, odds_ratios: Sequence[float] = ODDS_RATIOS
) -> FloatArray:
    """:func:`odds_log_evidence` at every rate in ``rates`` (each in (0, 1]) at once."""
    if trials == 0:
        return np.zeros(rates.shape, dtype=np.float64)
    k = np.asarray(odds_ratios, dtype=np.float64)[:, None]
    return log_mean_exp(failures * np.log(k) - trials * np.log1p((k - 1.0) * rates[None, :]))


def log_mean_exp(logs: FloatArray) -> FloatArray:
    """``log(mean(exp(logs)))`` down the first axis, without overflow: mixing e-values."""
    peak = logs.max(axis=0)
    mixed: FloatArray = peak + np.log(np.exp(logs - peak).mean(axis=0))
    return mixed


class BettingEProcess:
    """Tests "the mean of values in [0, 1] is at most ``m0``" by betting, anytime-valid.

    Each bet ``λ`` multiplies its wealth by ``1 + λ (x − m0)`` per value; with ``0 < λ < 1/m0``
    the factor is positive and has expectation at most 1 under the null, so each wealth is a
    nonnegative supermartingale and so is their average (Ville: it reaches ``1/α`` with
    probability at most ``α``). The grid spans timid to bold bets so that both small and large
    effects are caught without knowing which in advance. State is one float per bet.
    """

    _FRACTIONS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7)

    def __init__(self, m0: float, fractions: Sequence[float] | None = None) -> None:
        if not 0.0 < m0 < 1.0:
            raise ValueError(f"m0 must be in (0, 1), got {m0}")
        chosen = tuple(self._FRACTIONS if fractions is None else fractions)
        if not chosen or not all(0.0 < f < 1.0 for f in chosen):
            raise ValueError(f"bet fractions must be in (0, 1), got {chosen}")
        self.m0 = m0
        self._bets = np.array([f / m0 for f in chosen], dtype=np.float64)
        self._log_wealth = np.zeros(len(chosen), dtype=np.float64)
        self.count = 0
        self._sum = 0.0

    def update(self, values: FloatArray | Sequence[float]) -> None:
        x = np.asarray(values, dtype=np.float64)
        if x.size == 0:
            return
        centred = np.clip(x, 0.0, 1.0) - self.m0
        self._log_wealth += np.log1p(np.outer(self._bets, centred)).sum(axis=1)
        self.count += int(x.size)
        self._sum += float(centred.sum()) + self.m0 * x.size

    @property
    def mean(self) -> float:
        """The mean of the values seen (NaN before any)."""
        return self._sum / self.count if self.count else math.nan

    @property
    def log_e_value(self) -> float:
        """log of the average wealth (the e-value now)."""
        return float(log_mean_exp(self._log_wealth))
