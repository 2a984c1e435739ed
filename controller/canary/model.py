"""The canary judge's vocabulary: policy, per-arm evidence, summaries and decisions.

What it decides: the shape of what flows into the judge (``ArmEvidence``, a delta per arm since
the previous observation) and out of it (``Decision``, with the evidence and statistics behind
it), and the default guards (``JudgePolicy``). Everything is an immutable value so a decision
can be stored and streamed as it was taken.

Error-rate semantics (ADR 0008): an arm's failure rate is ``(errors + shed) / requests``; the
canary breaches the error guard when its rate exceeds ``max(baseline + max_error_rate_increase,
baseline × max_error_rate_ratio)`` — whichever tolerance is more lenient. The absolute
increase keeps one error against a flawless baseline from reading as an infinite regression;
the ratio keeps a noisy baseline from making the absolute increase meaninglessly strict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

__all__ = [
    "ArmEvidence",
    "ArmSummary",
    "Decision",
    "JudgePolicy",
    "RolloutAction",
    "RolloutPhase",
    "error_limit",
]


class RolloutAction(StrEnum):
    """What a decision does to the rollout."""

    ADVANCE = "advance"
    HOLD = "hold"
    ROLLBACK = "rollback"
    PROMOTE = "promote"


class RolloutPhase(StrEnum):
    """Where a rollout stands; everything but PROGRESSING is terminal."""

    PROGRESSING = "progressing"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


@dataclass(frozen=True)
class JudgePolicy:
    """Every guard the canary is judged by (the contract's ``RolloutPolicy``, with defaults).

    Window guards (judged once per window, feeding the streaks): ``min_requests`` per arm per
    window, the error tolerance (``max_error_rate_increase`` and ``max_error_rate_ratio``, see
    :func:`error_limit`), ``max_p95_ratio``, and the rank test (a common-language effect — the
    chance that a canary request is slower than a baseline one — above
    ``0.5 + rank_min_effect``). A window breaches a guard when its point estimate is past the
    limit *and* the breach is significant at ``window_alpha``; a breach that could be noise
    makes the window inconclusive instead (ADR 0008).

    Sequential tests (evaluated on every tick over the evidence of the current step, ADR 0008)
    share ``false_alarm_rate``: the probability that a canary within every tolerance is ever
    rolled back by them, over the whole rollout, however often they are looked at.
    """

    window_s: float = 10.0
    min_requests: int = 50
    max_error_rate_increase: float = 0.005
    max_error_rate_ratio: float = 1.5
    max_p95_ratio: float = 1.2
    healthy_windows_to_advance: int = 2
    unhealthy_windows_to_rollback: int = 2
    max_duration_s: float = 3600.0
    false_alarm_rate: float = 0.01
    window_alpha: float = 0.01
    rank_min_effect: float = 0.05
    max_samples_per_arm: int = 4096
    block_s: float = 1.0

    def __post_init__(self) -> None:
        checks: tuple[tuple[str, bool, str], ...] = (
            ("window_s", _finite(self.window_s) and self.window_s > 0, "a positive duration"),
            ("min_requests", self.min_requests >= 1, "at least 1"),
            (
                "max_error_rate_increase",
                _finite(self.max_error_rate_increase) and 0.0 <= self.max_error_rate_increase <= 1,
                "an absolute error-rate difference in [0, 1]",
            ),
            (
                "max_error_rate_ratio",
                _finite(self.max_error_rate_ratio) and self.max_error_rate_ratio >= 1.0,
                "a factor >= 1",
            ),
            ("max_p95_ratio", _finite(self.max_p95_ratio) and self.max_p95_ratio >= 1.0, ">= 1"),
            ("healthy_windows_to_advance", self.healthy_windows_to_advance >= 1, "at least 1"),
            (
                "unhealthy_windows_to_rollback",
                self.unhealthy_windows_to_rollback >= 1,
                "at least 1",
            ),
            (
                "max_duration_s",
                self.max_duration_s > 0 and not math.isnan(self.max_duration_s),
                "a positive duration",
            ),
            ("false_alarm_rate", 0.0 < self.false_alarm_rate < 1.0, "a probability in (0, 1)"),
            ("window_alpha", 0.0 < self.window_alpha < 1.0, "a probability in (0, 1)"),
            ("rank_min_effect", 0.0 <= self.rank_min_effect < 0.5, "in [0, 0.5)"),
            ("max_samples_per_arm", self.max_samples_per_arm >= 16, "at least 16"),
            ("block_s", _finite(self.block_s) and self.block_s > 0, "a positive duration"),
        )
        for name, ok, wanted in checks:
            if not ok:
                raise ValueError(f"policy.{name} must be {wanted}, got {getattr(self, name)!r}")


def _finite(value: float) -> bool:
    return math.isfinite(value)


def error_limit(baseline_rate: float, policy: JudgePolicy) -> float:
    """The highest canary failure rate the policy tolerates against ``baseline_rate``."""
    return min(
        1.0,
        max(
            baseline_rate + policy.max_error_rate_increase,
            baseline_rate * policy.max_error_rate_ratio,
        ),
    )


@dataclass(frozen=True)
class ArmEvidence:
    """New evidence for one arm since the previous observation (a delta, not a total).

    ``requests`` counts every request assigned to the arm (ok + late + error + shed);
    ``errors`` failed requests (a failed batch of 20 is 20 errors); ``shed`` requests shed after
    version assignment (they count against the arm); ``latencies_s`` the latencies of the
    *answered* requests (ok and late) — possibly a sample of them.

    ``batches`` and ``failed_batches`` say how the requests were *clustered*: the batches the
    arm's replicas ran and how many of them failed (all their requests at once). The error test
    judges clusters — batches, and the sheds of one look as one — because those fail
    independently of each other while the requests of one batch do not (ADR 0008). Evidence
    without batches (``batches == 0``) is taken as one cluster per request.
    """

    requests: int
    errors: int = 0
    shed: int = 0
    latencies_s: Sequence[float] | npt.NDArray[np.float64] = field(default=())
    batches: int = 0
    failed_batches: int = 0

    def __post_init__(self) -> None:
        if self.requests < 0 or self.errors < 0 or self.shed < 0:
            raise ValueError(
                f"evidence counts must be >= 0, got requests={self.requests} "
                f"errors={self.errors} shed={self.shed}"
            )
        if self.errors + self.shed > self.requests:
            raise ValueError(
                f"errors ({self.errors}) + shed ({self.shed}) exceed requests ({self.requests})"
            )
        answered = self.requests - self.errors - self.shed
        if len(self.latencies_s) > answered:
            raise ValueError(f"{len(self.latencies_s)} latencies for {answered} answered requests")
        if not 0 <= self.failed_batches <= self.batches:
            raise ValueError(
                f"failed_batches ({self.failed_batches}) must be in [0, batches ({self.batches})]"
            )

    @property
    def clusters(self) -> int:
        """Units that fail independently: the batches, and one for any sheds (see ``failed``)."""
        if self.batches == 0:
            return self.requests
        return self.batches + (1 if self.shed else 0)

    @property
    def failed_clusters(self) -> int:
        """Failed units: failed batches, and the sheds of this look as *one* failure.

        A gateway sheds in bursts — an overloaded replica, a deadline no queue can meet — so
        the requests it shed in one look (one controller tick) are one event, not hundreds.
        """
        if self.batches == 0:
            return self.errors + self.shed
        return self.failed_batches + (1 if self.shed else 0)

    @classmethod
    def empty(cls) -> ArmEvidence:
        return cls(requests=0)


@dataclass(frozen=True)
class ArmSummary:
    """What a decision stores per arm, for the evidence it judged."""

    requests: int
    errors: int
    shed: int
    error_rate: float
    p50_s: float
    p95_s: float


@dataclass(frozen=True)
class Decision:
    """One judgement: what to do, why (a machine token and a sentence), and the evidence.

    ``reason`` is one of: ``healthy`` (ADVANCE / PROMOTE), ``awaiting_confirmation`` (a healthy
    window, streak not yet long enough), ``insufficient_data`` (``needed_requests`` says how
    many more per arm), ``inconclusive`` (a breach that could be noise), ``error_rate``,
    ``latency`` (p95), ``latency_rank`` (ROLLBACK by a sequential test, or HOLD for an
    unhealthy window), ``max_duration`` (ROLLBACK), and the gates' ``paused``,
    ``awaiting_approval``, ``rollback_held`` (HOLD) and ``approved`` (ADVANCE / PROMOTE).
    ``applied`` is False for the moves of an analysis-only rollout: recorded, never routed.
    ``baseline`` and ``canary`` summarise the window
    judged — or, for a sequential rollback, the whole step. ``statistics`` holds the numbers
    behind the verdict (limits, ratios, p-values, e-values as logs, the budget ``alpha``).
    """

    action: RolloutAction
    reason: str
    detail: str
    from_percent: float
    to_percent: float
    baseline: ArmSummary
    canary: ArmSummary
    statistics: Mapping[str, float]
    needed_requests: int = 0
    applied: bool = True
