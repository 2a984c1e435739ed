"""The sequential error-rate test: is the canary's failure rate *proven* above the limit?

What it decides: whether one step's evidence proves, at false-alarm rate ``α``, that the
canary's failure rate ``p_c`` exceeds the tolerated ``L(p_b) = error_limit(p_b, policy)`` — when
the baseline's own rate ``p_b`` is not known either, only estimated from its (much larger)
traffic. Checked on every tick, valid however often it is checked (ADR 0008).

The statistic. Cut the baseline's possible rates into intervals by a fine geometric grid
``0 = g_0 < g_1 < … < g_J < g_{J+1} = 1`` and take

    S = min over j of [ B(g_j) + C(L(g_{j+1})) ]

* ``B(g)``: log of an e-process for the baseline against "``p_b ≥ g``"
  (:func:`rate_floor_log_evidence`): a mixture of likelihood ratios of alternatives a little
  below ``g`` (``0.5 g`` … ``0.95 g``) to ``g``, with most of the weight (0.7) kept on not betting
  at all. Where the baseline's data cannot tell ``p_b`` from ``g`` it stays near 0 (never
  below ``log 0.7``), and it climbs as they exclude ``g``.
* ``C(c)``: log of an e-process for the canary against "``p_c ≤ c``": weight
  :data:`CANARY_NO_BET` on not betting, the rest on the average over a grid of odds ratios
  ``k`` of ``∏ k^x / (1 − c + k·c)`` (:func:`~controller.canary.stats.odds_log_evidence`).

The counts are *clusters* — batches (a failed batch is one failure, whatever its size) and
each look's sheds as one — because those are what fail independently (ADR 0008).

Why it is valid. Under the null the true ``p_b`` lies in some interval ``[g_j, g_{j+1}]``;
``B(g_j)`` is then a nonnegative supermartingale (``p_b ≥ g_j``), and so is ``C(L(g_{j+1}))``
(``p_c ≤ L(p_b) ≤ L(g_{j+1})``: ``L`` is non-decreasing). The two arms' requests are independent
given the past, so the *product* of the two e-processes is a nonnegative supermartingale that
starts at 1, ``S`` never exceeds its log, and by Ville's inequality ``S`` ever reaches
``log(1/α)`` with probability at most ``α`` — with no share of ``α`` spent on a separate
confidence bound for the baseline, and no worst case taken over it: the minimum weighs, for
every baseline rate, how strongly the baseline's data already exclude it.

Why not a confidence bound for the baseline (the first version of this test): the baseline
sees only ~24 failures a minute at 0.2 % of 200 req/s, so an always-valid upper bound at a
small ``α`` sat near twice its observed rate, and a canary had to be proven above the limit of
*that* rate. The minimum above instead finds the baseline rate where the two arms' evidence
together is weakest, which is rarely more than a few per cent above the observed one: a +5
point canary needs about as many requests as a test that knew the baseline's rate exactly
(ADR 0008).

What it costs: the statistic needs only the four counts; the ~470 terms are computed only on
ticks where an upper bound of ``S`` (the canary's evidence at the baseline's *observed* rate)
has crossed the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from controller.canary.model import JudgePolicy, error_limit
from controller.canary.stats import log_mean_exp, odds_log_evidence, odds_log_evidence_at

__all__ = [
    "BASELINE_FRACTIONS",
    "BASELINE_NO_BET",
    "CANARY_NO_BET",
    "RATE_GRID",
    "Counts",
    "ErrorRateEvidence",
    "ErrorRateTest",
    "rate_floor_log_evidence",
]

FloatArray = npt.NDArray[np.float64]

# Baseline rates from 1e-6 up to 1, each 3 % above the last: inside an interval the limit the
# test uses is at most 3 % (x1.5 under the ratio) of the baseline rate above the true one —
# 0.006 points at 0.2 %, ~0.04 nats over a hundred canary requests.
_GRID_LOW = 1e-6
_GRID_RATIO = 1.03
RATE_GRID: FloatArray = np.geomspace(
    _GRID_LOW, 1.0, math.ceil(math.log(1.0 / _GRID_LOW) / math.log(_GRID_RATIO)), endpoint=False
)


# The baseline's e-process against "rate >= g" (see the module docstring): alternatives at
# these fractions of g, and the weight kept on "no bet" (an e-value of 1).
BASELINE_FRACTIONS: tuple[float, ...] = (0.5, 0.7, 0.85, 0.95)
BASELINE_NO_BET = 0.7
# The weight the canary's e-process keeps on "no bet" (an e-value of 1): without it, ``C(L(g))``
# for a baseline rate ``g`` far above the truth sinks without bound as the canary's evidence
# grows (the canary is plainly *below* that limit), and the minimum in ``S`` is taken there —
# however strongly the baseline's data exclude ``g``. That happened as soon as the arms were
# counted in batches: the baseline's larger batches give it fewer clusters per canary cluster
# than it had requests, so ``B(g)`` no longer outgrew the canary's decay. With the floor,
# ``C ≥ log 0.1``, and it costs ``log(1/0.9)`` ≈ 0.1 nats where the canary's evidence counts.
CANARY_NO_BET = 0.1


def _with_no_bet(log_e: FloatArray) -> FloatArray:
    """Mix e-processes with the constant 1 at weight :data:`CANARY_NO_BET` (still e-processes)."""
    mixed: FloatArray = np.logaddexp(math.log(CANARY_NO_BET), math.log1p(-CANARY_NO_BET) + log_e)
    return mixed


def rate_floor_log_evidence(failures: int, trials: int, rates: FloatArray) -> FloatArray:
    """log of an e-value against "the failure rate is at least ``g``", for every ``g`` in ``rates``.

    ``rates`` in [0, 1). A mixture: weight :data:`BASELINE_NO_BET` on not betting, the rest
    spread over likelihood ratios of the alternatives ``γ·g`` (``γ`` in
    :data:`BASELINE_FRACTIONS`) to ``g``, per trial ``γ`` on a failure and ``(1 − γ·g) / (1 − g)``
    on a success. Under any rate ``p ≥ g`` each factor has mean ``1 − (p − g)(1 − γ) / (1 − g)
    ≤ 1``, so every product, and the mixture, is a nonnegative supermartingale. The weight on
    not betting keeps the e-value at or above ``log 0.7`` where the data cannot tell ``p`` from
    ``g`` — which is where the error test looks for its weakest point.
    """
    gammas = np.asarray(BASELINE_FRACTIONS, dtype=np.float64)[:, None]
    log_complement = np.log1p(-rates)[None, :]
    logs = failures * np.log(gammas) + (trials - failures) * (
        np.log1p(-gammas * rates[None, :]) - log_complement
    )
    betting = log_mean_exp(logs)
    return np.logaddexp(math.log(BASELINE_NO_BET), math.log1p(-BASELINE_NO_BET) + betting)


@dataclass(frozen=True)
class ErrorRateEvidence:
    """``S`` and where it is weakest: the baseline rate and the limit it implies."""

    log_e: float
    baseline_rate: float
    limit: float


class Counts(Protocol):
    """An arm's totals over the step: requests, and failures (errors + shed) among them."""

    @property
    def failures(self) -> int: ...

    @property
    def requests(self) -> int: ...


class ErrorRateTest:
    """The statistic ``S`` of the module docstring, from the two arms' counts over a step."""

    def __init__(self, policy: JudgePolicy, grid: FloatArray = RATE_GRID) -> None:
        self._policy = policy
        self._lowers = np.concatenate(([0.0], grid))  # g_0 = 0, g_1 … g_J
        self._uppers = np.append(grid, 1.0)  # g_1 … g_J, g_{J+1} = 1
        self._limits = np.array([error_limit(float(g), policy) for g in self._uppers])

    def upper_bound(self, baseline: Counts, canary: Counts) -> float:
        """An upper bound of ``S``: the canary's evidence at the baseline's *observed* rate.

        Take the interval ``[g_j, g_{j+1})`` holding the observed rate: the baseline's
        alternatives lie below ``g_j``, which its data fit no better than ``g_j`` itself, so
        ``B(g_j) ≤ 0``; and ``C(L(g_{j+1})) ≤ C(L(observed))`` since ``C`` falls as the limit
        rises.
        """
        if baseline.requests == 0:
            return self.log_e_value(baseline, canary).log_e
        limit = error_limit(baseline.failures / baseline.requests, self._policy)
        single = odds_log_evidence(canary.failures, canary.requests, limit)
        return float(_with_no_bet(np.array([single]))[0])

    def log_e_value(self, baseline: Counts, canary: Counts) -> ErrorRateEvidence:
        """``S`` now, and the baseline rate (interval) where it is weakest."""
        terms = rate_floor_log_evidence(
            baseline.failures, baseline.requests, self._lowers
        ) + _with_no_bet(odds_log_evidence_at(canary.failures, canary.requests, self._limits))
        weakest = int(np.argmin(terms))
        return ErrorRateEvidence(
            log_e=float(terms[weakest]),
            baseline_rate=float(self._uppers[weakest]),
            limit=float(self._limits[weakest]),
        )

    def evidence(
        self, baseline: Counts, canary: Counts, log_bound: float
    ) -> ErrorRateEvidence | None:
        """``S`` and where it is weakest, once ``S`` has reached ``log_bound``; else None.

        Most ticks end on :meth:`upper_bound`, one scalar, instead of ~470 terms.
        """
        if canary.requests == 0 or self.upper_bound(baseline, canary) < log_bound:
            return None
        found = self.log_e_value(baseline, canary)
        return found if found.log_e >= log_bound else None
