"""The window judgement: is this window of canary evidence healthy, unhealthy, or too sparse?

What it decides: one verdict per analysis window, from both arms' evidence over the *same*
wall-clock span. Order of the guards (the first breach names the reason):

1. ``insufficient_data`` — either arm has fewer than ``min_requests`` requests. Such a window
   touches no streak: resetting the healthy streak would stall a low-traffic rollout forever,
   and resetting the unhealthy one would let a regression hide behind quiet periods. It says
   how many more requests the sparser arm needs.
2. ``error_rate`` — the canary's failure rate ``(errors + shed) / requests`` exceeds
   ``max(baseline + increase, baseline × ratio)``.
3. ``latency`` — the canary's p95 exceeds ``max_p95_ratio × baseline p95``.
4. ``latency_rank`` — Mann–Whitney U says the canary is slower (one-sided p below
   ``rank_alpha``) *and* materially so (common-language effect above ``0.5 + rank_min_effect``):
   this catches a canary slower across its whole distribution whose p95 happens to slip
   under the ratio.

Otherwise the window is healthy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controller.canary.evidence import ArmAccumulator
from controller.canary.model import JudgePolicy, error_limit
from controller.canary.stats import rank_test

__all__ = ["WindowVerdict", "judge_window"]

INSUFFICIENT = "insufficient_data"
HEALTHY = "healthy"


@dataclass(frozen=True)
class WindowVerdict:
    """``healthy`` is None for a data-sparse window."""

    healthy: bool | None
    reason: str
    detail: str
    statistics: dict[str, float] = field(default_factory=dict)
    needed_requests: int = 0


def _pct(rate: float) -> str:
    return f"{100.0 * rate:.2f}%"


def _ms(seconds: float) -> str:
    return f"{1000.0 * seconds:.1f} ms"


def judge_window(
    baseline: ArmAccumulator, canary: ArmAccumulator, policy: JudgePolicy
) -> WindowVerdict:
    """The verdict for one window (see the module docstring for the guards and their order)."""
    needed = max(policy.min_requests - baseline.requests, policy.min_requests - canary.requests)
    if needed > 0:
        return WindowVerdict(
            healthy=None,
            reason=INSUFFICIENT,
            detail=(
                f"window too sparse to judge: baseline {baseline.requests} and canary "
                f"{canary.requests} requests, {policy.min_requests} needed per arm "
                f"({needed} more)"
            ),
            statistics={"min_requests": float(policy.min_requests)},
            needed_requests=needed,
        )
    base_rate, canary_rate = baseline.error_rate, canary.error_rate
    limit = error_limit(base_rate, policy)
    b_sum, c_sum = baseline.summary(), canary.summary()
    stats: dict[str, float] = {
        "error_limit": limit,
        "baseline_error_rate": base_rate,
        "canary_error_rate": canary_rate,
    }
    p95_ratio = math.nan
    if c_sum.p95_s == c_sum.p95_s and b_sum.p95_s == b_sum.p95_s and b_sum.p95_s > 0:
        p95_ratio = c_sum.p95_s / b_sum.p95_s
        stats["p95_ratio"] = p95_ratio
    rank = rank_test(canary.sample.values(), baseline.sample.values())
    if rank is not None:
        stats.update(
            rank_z=rank.z,
            rank_p=rank.p_slower,
            common_language=rank.common_language,
            rank_biserial=rank.rank_biserial,
        )
    if canary_rate > limit:
        return WindowVerdict(
            healthy=False,
            reason="error_rate",
            detail=(
                f"canary failed {canary.failures} of {canary.requests} requests "
                f"({_pct(canary_rate)}) against baseline {_pct(base_rate)}: above the "
                f"{_pct(limit)} limit"
            ),
            statistics=stats,
        )
    if p95_ratio > policy.max_p95_ratio:
        return WindowVerdict(
            healthy=False,
            reason="latency",
            detail=(
                f"canary p95 {_ms(c_sum.p95_s)} is {p95_ratio:.2f}x baseline p95 "
                f"{_ms(b_sum.p95_s)}: above the {policy.max_p95_ratio:g}x limit"
            ),
            statistics=stats,
        )
    if (
        rank is not None
        and rank.p_slower < policy.rank_alpha
        and rank.common_language > 0.5 + policy.rank_min_effect
    ):
        return WindowVerdict(
            healthy=False,
            reason="latency_rank",
            detail=(
                f"canary is slower than baseline across its distribution: a canary request is "
                f"slower {100 * rank.common_language:.0f}% of the time (limit "
                f"{100 * (0.5 + policy.rank_min_effect):.0f}%), Mann-Whitney p={rank.p_slower:.2g}"
            ),
            statistics=stats,
        )
    return WindowVerdict(
        healthy=True,
        reason=HEALTHY,
        detail=(
            f"canary within every guard: errors {_pct(canary_rate)} vs baseline "
            f"{_pct(base_rate)} (limit {_pct(limit)}), p95 {_ms(c_sum.p95_s)} vs "
            f"{_ms(b_sum.p95_s)}"
        ),
        statistics=stats,
    )
