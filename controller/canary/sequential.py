"""Sequential tests: roll a clearly bad canary back as soon as the evidence proves it.

What it decides: whether the evidence of the current step already *proves*, at a stated
false-alarm rate, that the canary breaks a guard — checked on every tick, not at the end of a
window. Three anytime-valid tests share the step's false-alarm budget ``alpha`` (ADR 0008):

* **error rate** (half of ``alpha``): :class:`~controller.canary.error_test.ErrorRateTest` —
  the canary's failure rate proven above ``max(p_b + increase, p_b × ratio)`` for every
  baseline rate ``p_b`` the baseline's own evidence has not excluded, weighed jointly: one
  e-process for the pair of arms, with no share of ``alpha`` spent on bounding the baseline.
* **p95** (a quarter): each canary latency above ``max_p95_ratio × baseline p95`` (the
  baseline's p95 so far in this step) is a Bernoulli "exceedance". A canary whose p95 is within
  the ratio exceeds with probability at most 5 %; the mixture test of "rate ≤ 5 %" rejects
  when the exceedance rate is proven above it.
* **rank** (a quarter): each canary latency becomes its mid-rank position among the baseline's
  latencies so far, a value in [0, 1] whose mean is the common-language effect. A test by
  betting rejects "mean ≤ 0.5 + rank_min_effect" — a canary proven materially slower.

The two latency tests compare with a *sample* of the baseline (bounded, see
:class:`~controller.canary.evidence.DecimatingSample`); canary latencies wait (in a bounded
buffer) until that sample holds 512 latencies, so their guarantee holds up to the sample's
error, which the tolerances (1.2× on p95, a 5-point effect margin) dwarf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controller.canary.error_test import ErrorRateTest
from controller.canary.evidence import ArmAccumulator
from controller.canary.model import ArmEvidence, JudgePolicy
from controller.canary.stats import BettingEProcess, sorted_quantile

__all__ = [
    "RESUME_SHARE",
    "TAIL_BLOCKS",
    "SequentialBreach",
    "SequentialTests",
    "segment_alpha",
    "step_alpha",
]

FloatArray = npt.NDArray[np.float64]

_ERROR_SHARE = 0.5
_P95_SHARE = 0.25
_RANK_SHARE = 0.25
_EXCEEDANCE_RATE = 0.05  # a p95 is the latency 5 % of requests exceed
# Bets of the p95 test, as fractions of 1/m0 (see BettingEProcess): timid only, so that one
# block of a burst (every request slow) multiplies the evidence by at most 1 + 0.1 x 19 ~ 2.9.
_EXCEEDANCE_FRACTIONS = (0.02, 0.05, 0.1)
# The p95 test's blocks are this many rank blocks long: a burst of slow requests (a noisy
# neighbour, a warm-up) is a few seconds of nearly every request over the limit, and a tail
# test fed one value per second would read a five-second burst as five independent proofs.
TAIL_BLOCKS = 10
# Baseline latencies needed before canary latencies are ranked against them: the rank of a
# canary latency among n baseline ones errs by ~sqrt(1/(6n)) on average, 0.018 at 512 — a
# third of the default 0.05 effect margin.
_REFERENCE_MIN = 512


# Share of the rollout's false-alarm budget spent at the first step; the rest is split evenly
# between the later steps.
FIRST_STEP_SHARE = 0.75


def step_alpha(false_alarm_rate: float, step_index: int, step_count: int) -> float:
    """The false-alarm budget of one step: most for the first, the rest evenly for the others.

    A bad canary is caught at the first step — the smallest share, where each second of proof
    costs the fewest requests — so that step gets :data:`FIRST_STEP_SHARE` of the budget; the
    budgets sum to exactly ``false_alarm_rate`` over the rollout.
    """
    if step_count == 1:
        return false_alarm_rate
    if step_index == 0:
        return false_alarm_rate * FIRST_STEP_SHARE
    return false_alarm_rate * (1.0 - FIRST_STEP_SHARE) / (step_count - 1)


# A step's budget across controller restarts: its first run gets 1 - RESUME_SHARE of it, each
# resumed run RESUME_SHARE of what the previous one had.
RESUME_SHARE = 0.1


def segment_alpha(step_budget: float, resumes_in_step: int) -> float:
    """The budget of one run of a step that has been resumed ``resumes_in_step`` times.

    A resumed step starts its tests afresh (the evidence before the restart is gone), and a
    fresh test at the step's whole budget would grant the step its false-alarm rate again on
    every restart. The runs instead split it geometrically — ``(1 − s)·s^k`` for the ``k``-th
    resume — so all the runs a step may ever have sum to its budget (a union bound over
    runs), at the cost of ``log(1/(1 − s))`` ≈ 0.1 nats of evidence for a step never resumed.
    """
    if resumes_in_step < 0:
        raise ValueError(f"resumes_in_step must be >= 0, got {resumes_in_step}")
    return step_budget * (1.0 - RESUME_SHARE) * RESUME_SHARE**resumes_in_step


class _Blocks:
    """Canary latencies cut into blocks of ``length_s``; closed blocks wait to be scored.

    At most ``capacity`` latencies wait (the rest of a block is dropped, not its count): a
    baseline too quiet to rank against must not grow memory without bound.
    """

    def __init__(self, length_s: float, capacity: int) -> None:
        self._length_s = length_s
        self._capacity = capacity
        self._open: list[FloatArray] = []
        self._end: float | None = None
        self._closed: list[FloatArray] = []
        self._waiting = 0

    def add(self, latencies: FloatArray, now: float) -> None:
        if self._end is None:
            self._end = now + self._length_s
        elif now >= self._end:
            if self._open:
                self._closed.append(np.concatenate(self._open))
                self._open = []
            self._end = now + self._length_s
        room = self._capacity - self._waiting
        if latencies.size and room > 0:
            self._open.append(latencies[:room])
            self._waiting += min(int(latencies.size), room)

    def take(self) -> list[FloatArray]:
        """The closed blocks (each non-empty), oldest first; they are handed out once."""
        closed, self._closed = self._closed, []
        self._waiting = sum(int(b.size) for b in self._open)
        return closed


@dataclass(frozen=True)
class SequentialBreach:
    """A test that fired: its reason token, a sentence, and its statistics."""

    reason: str
    detail: str
    statistics: dict[str, float] = field(default_factory=dict)


class SequentialTests:
    """The three tests over one step's evidence."""

    def __init__(self, policy: JudgePolicy, alpha: float) -> None:
        self.policy = policy
        self.alpha = alpha
        self.baseline = ArmAccumulator(policy.max_samples_per_arm)
        self.canary = ArmAccumulator(policy.max_samples_per_arm)
        self._log_error_bound = math.log(1.0 / (alpha * _ERROR_SHARE))
        self._errors = ErrorRateTest(policy)
        self._log_p95_bound = math.log(1.0 / (alpha * _P95_SHARE))
        self._log_rank_bound = math.log(1.0 / (alpha * _RANK_SHARE))
        self._exceed = BettingEProcess(_EXCEEDANCE_RATE, _EXCEEDANCE_FRACTIONS)
        self._rank = BettingEProcess(0.5 + policy.rank_min_effect)
        # Canary latencies wait (bounded) until the baseline sample they are ranked against is
        # big enough that its own error is small beside the tolerances (see the docstring).
        self._reference_min = min(
            max(policy.min_requests, _REFERENCE_MIN), policy.max_samples_per_arm // 2
        )
        self._rank_blocks = _Blocks(policy.block_s, policy.max_samples_per_arm)
        self._tail_blocks = _Blocks(policy.block_s * TAIL_BLOCKS, policy.max_samples_per_arm)
        self._dirty = False

    def observe(
        self,
        baseline: ArmEvidence,
        canary: ArmEvidence,
        baseline_latencies: FloatArray,
        canary_latencies: FloatArray,
        now: float,
    ) -> None:
        self.baseline.add(baseline, baseline_latencies)
        self.canary.add(canary, canary_latencies)
        self._dirty = True
        self._rank_blocks.add(canary_latencies, now)
        self._tail_blocks.add(canary_latencies, now)
        reference = self.baseline.sample.values()  # kept sorted
        if reference.size < self._reference_min:
            return
        ranked = self._rank_blocks.take()
        if ranked:
            means = []
            for latencies in ranked:
                left = np.searchsorted(reference, latencies, side="left")
                right = np.searchsorted(reference, latencies, side="right")
                means.append(float(np.mean((left + right) / (2.0 * reference.size))))
            self._rank.update(means)
        tails = self._tail_blocks.take()
        if tails:
            limit = self.policy.max_p95_ratio * sorted_quantile(reference, 1.0 - _EXCEEDANCE_RATE)
            self._exceed.update(
                [float(np.count_nonzero(block > limit)) / block.size for block in tails]
            )

    def check(self) -> SequentialBreach | None:
        """The first test whose evidence crossed its bound, if any (cheap when nothing new)."""
        if not self._dirty:
            return None
        self._dirty = False
        return self._check_errors() or self._check_p95() or self._check_rank()

    def _check_errors(self) -> SequentialBreach | None:
        found = self._errors.evidence(
            self.baseline.cluster_counts(), self.canary.cluster_counts(), self._log_error_bound
        )
        if found is None:
            return None
        c = self.canary
        return SequentialBreach(
            reason="error_rate",
            detail=(
                f"canary failed {c.failures} of {c.requests} requests "
                f"({100 * c.error_rate:.2f}%): proven above the tolerated limit whatever the "
                f"baseline's rate (weakest at a baseline of {100 * found.baseline_rate:.3f}%, "
                f"limit {100 * found.limit:.2f}%) with evidence "
                f"{math.exp(min(found.log_e, 700.0)):.3g} against a bound of "
                f"{math.exp(self._log_error_bound):.3g}"
            ),
            statistics={
                "error_log_e": found.log_e,
                "error_log_bound": self._log_error_bound,
                "error_limit": found.limit,
                "baseline_error_upper": found.baseline_rate,
                "alpha": self.alpha,
            },
        )

    def _check_p95(self) -> SequentialBreach | None:
        blocks = self._exceed.count
        if blocks == 0:
            return None
        log_e = self._exceed.log_e_value
        if log_e < self._log_p95_bound:
            return None
        share = self._exceed.mean
        return SequentialBreach(
            reason="latency",
            detail=(
                f"over {blocks} blocks of canary requests, {100 * share:.1f}% on average were "
                f"slower than {self.policy.max_p95_ratio:g}x the baseline p95: the canary's "
                f"p95 is proven above the limit (evidence {math.exp(min(log_e, 700.0)):.3g} "
                f"against a bound of {math.exp(self._log_p95_bound):.3g})"
            ),
            statistics={
                "p95_log_e": log_e,
                "p95_log_bound": self._log_p95_bound,
                "p95_exceedance": share,
                "blocks": float(blocks),
                "alpha": self.alpha,
            },
        )

    def _check_rank(self) -> SequentialBreach | None:
        log_e = self._rank.log_e_value
        if log_e < self._log_rank_bound:
            return None
        m0 = self._rank.m0
        return SequentialBreach(
            reason="latency_rank",
            detail=(
                f"over {self._rank.count} blocks of {self.policy.block_s:g} s of canary "
                f"requests the canary is proven slower than the baseline more than "
                f"{100 * m0:.0f}% of the time (evidence "
                f"{math.exp(min(log_e, 700.0)):.3g} against a bound of "
                f"{math.exp(self._log_rank_bound):.3g})"
            ),
            statistics={
                "rank_log_e": log_e,
                "rank_log_bound": self._log_rank_bound,
                "common_language_mean": self._rank.mean,
                "alpha": self.alpha,
            },
        )
