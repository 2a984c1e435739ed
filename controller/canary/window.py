"""The window judgement: is this window of canary evidence healthy, unhealthy, or neither?

What it decides: one verdict per analysis window, from both arms' evidence over the *same*
wall-clock span. The guards, in order (the first breach names the reason):

* ``error_rate`` — the canary's failure rate is above ``max(baseline + increase, baseline ×
  ratio)``, both counted in clusters — failed batches among batches (and a look's sheds as
  one), or requests when the evidence has no batches — as the sequential test counts them;
* ``latency`` — the canary's p95 is above ``max_p95_ratio × baseline p95``, i.e. more than 5 %
  of canary requests are slower than that;
* ``latency_rank`` — the canary is slower across its whole distribution: Mann–Whitney U's
  common-language effect (the chance a canary request is slower than a baseline one) is above
  ``0.5 + rank_min_effect``. This catches a canary whose p95 slips under the ratio.

Verdicts:

* ``insufficient_data`` — either arm has fewer than ``min_requests`` requests. Such a window
  touches no streak: resetting the healthy streak would stall a low-traffic rollout forever,
  and resetting the unhealthy one would let a regression hide behind quiet periods. It says
  how many more requests the sparser arm needs.
* **unhealthy** — a guard is breached *and* the breach is significant at ``window_alpha``
  (binomial tail bounds for the error rate and the p95 exceedances, the U test's p-value for
  ranks). Point estimates alone are not enough: at 50 requests one error reads as 2 %, and a
  p95 from 50 latencies is noisy; judging on them rolled back 5-10 % of identical canaries
  in the simulation.
* ``inconclusive`` — a guard's point estimate is past its limit but the window cannot tell
  that from noise: no advance (the healthy streak restarts), no step towards rollback.
* **healthy** — every point estimate is within its limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from controller.canary.evidence import ArmAccumulator
from controller.canary.model import JudgePolicy, error_limit
from controller.canary.stats import binomial_tail_bound, rank_test, sorted_quantile

__all__ = ["INCONCLUSIVE", "INSUFFICIENT", "Verdict", "WindowVerdict", "judge_window"]

INSUFFICIENT = "insufficient_data"
INCONCLUSIVE = "inconclusive"
HEALTHY = "healthy"
P95_EXCEEDANCE = 0.05  # the p95 is the latency 5 % of requests exceed


class Verdict(Enum):
    SPARSE = "sparse"
    HEALTHY = "healthy"
    INCONCLUSIVE = "inconclusive"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class WindowVerdict:
    verdict: Verdict
    reason: str
    detail: str
    statistics: dict[str, float] = field(default_factory=dict)
    needed_requests: int = 0


@dataclass(frozen=True)
class _Breach:
    reason: str
    detail: str
    p_value: float


def _pct(rate: float) -> str:
    return f"{100.0 * rate:.2f}%"


def _ms(seconds: float) -> str:
    return f"{1000.0 * seconds:.1f} ms"


def judge_window(
    baseline: ArmAccumulator, canary: ArmAccumulator, policy: JudgePolicy
) -> WindowVerdict:
    """The verdict for one window (see the module docstring for the guards and verdicts)."""
    needed = max(policy.min_requests - baseline.requests, policy.min_requests - canary.requests)
    if needed > 0:
        return WindowVerdict(
            Verdict.SPARSE,
            INSUFFICIENT,
            f"window too sparse to judge: baseline {baseline.requests} and canary "
            f"{canary.requests} requests, {policy.min_requests} needed per arm "
            f"({needed} more)",
            {"min_requests": float(policy.min_requests)},
            needed_requests=needed,
        )
    stats: dict[str, float] = {}
    breaches = [
        b
        for b in (
            _error_breach(baseline, canary, policy, stats),
            _p95_breach(baseline, canary, policy, stats),
            _rank_breach(baseline, canary, policy, stats),
        )
        if b is not None
    ]
    for breach in breaches:
        if breach.p_value < policy.window_alpha:
            return WindowVerdict(
                Verdict.UNHEALTHY,
                breach.reason,
                f"{breach.detail} (p <= {breach.p_value:.2g})",
                stats,
            )
    if breaches:
        first = breaches[0]
        return WindowVerdict(
            Verdict.INCONCLUSIVE,
            INCONCLUSIVE,
            f"{first.detail}, but not significantly (p <= {first.p_value:.2g}, "
            f"{policy.window_alpha:g} needed): not healthy, not yet unhealthy",
            stats,
        )
    b_sum, c_sum = baseline.summary(), canary.summary()
    return WindowVerdict(
        Verdict.HEALTHY,
        HEALTHY,
        f"canary within every guard: errors {_pct(canary.error_rate)} vs baseline "
        f"{_pct(baseline.error_rate)} (limit {_pct(stats['error_limit'])}), p95 "
        f"{_ms(c_sum.p95_s)} vs {_ms(b_sum.p95_s)}",
        stats,
    )


def _error_breach(
    baseline: ArmAccumulator, canary: ArmAccumulator, policy: JudgePolicy, stats: dict[str, float]
) -> _Breach | None:
    # Judged on clusters (batches; one per request when the evidence has none), as the
    # sequential error test is: a failed batch of eight is one failure, not eight.
    base_rate, canary_rate = baseline.cluster_failure_rate, canary.cluster_failure_rate
    limit = error_limit(base_rate, policy)
    stats.update(
        error_limit=limit,
        baseline_error_rate=base_rate,
        canary_error_rate=canary_rate,
        baseline_clusters=float(baseline.clusters),
        canary_clusters=float(canary.clusters),
        canary_failed_clusters=float(canary.failed_clusters),
    )
    if canary_rate <= limit:
        return None
    p_value = binomial_tail_bound(canary.failed_clusters, canary.clusters, limit)
    stats["error_p"] = p_value
    return _Breach(
        "error_rate",
        f"canary failed {canary.failures} of {canary.requests} requests "
        f"({_pct(canary.error_rate)}), {canary.failed_clusters} of {canary.clusters} batches "
        f"({_pct(canary_rate)}) against baseline {_pct(base_rate)} of {baseline.clusters}: "
        f"above the {_pct(limit)} limit",
        p_value,
    )


def _p95_breach(
    baseline: ArmAccumulator, canary: ArmAccumulator, policy: JudgePolicy, stats: dict[str, float]
) -> _Breach | None:
    b_values, c_values = baseline.sample.values(), canary.sample.values()
    if b_values.size == 0 or c_values.size == 0:
        return None
    b95 = sorted_quantile(b_values, 1.0 - P95_EXCEEDANCE)
    c95 = sorted_quantile(c_values, 1.0 - P95_EXCEEDANCE)
    if b95 <= 0.0:
        return None
    ratio = c95 / b95
    stats.update(baseline_p95_s=b95, canary_p95_s=c95, p95_ratio=ratio)
    if ratio <= policy.max_p95_ratio:
        return None
    slower = int(np.count_nonzero(c_values > policy.max_p95_ratio * b95))
    p_value = binomial_tail_bound(slower, int(c_values.size), P95_EXCEEDANCE)
    stats["p95_p"] = p_value
    return _Breach(
        "latency",
        f"canary p95 {_ms(c95)} is {ratio:.2f}x baseline p95 {_ms(b95)}: above the "
        f"{policy.max_p95_ratio:g}x limit ({slower} of {c_values.size} canary requests slower)",
        p_value,
    )


def _rank_breach(
    baseline: ArmAccumulator, canary: ArmAccumulator, policy: JudgePolicy, stats: dict[str, float]
) -> _Breach | None:
    rank = rank_test(canary.sample.values(), baseline.sample.values())
    if rank is None:
        return None
    stats.update(
        rank_z=rank.z,
        rank_p=rank.p_slower,
        common_language=rank.common_language,
        rank_biserial=rank.rank_biserial,
    )
    limit = 0.5 + policy.rank_min_effect
    if not rank.common_language > limit or math.isnan(rank.p_slower):
        return None
    return _Breach(
        "latency_rank",
        f"canary slower across its distribution: a canary request is slower than a baseline "
        f"one {100 * rank.common_language:.0f}% of the time (limit {100 * limit:.0f}%)",
        rank.p_slower,
    )
