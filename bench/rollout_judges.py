"""The judges the rollout simulation compares: Halcyon's, and its rivals built as they work.

What it decides: nothing in production. Every judge has the :class:`Judge` shape of
:class:`controller.canary.RolloutRun` — ``observe`` per-arm deltas, ``tick`` once a second,
read ``canary_percent`` — so the simulation drives them all the same way. A judge is named by a
:class:`JudgeSetting` (the judge and its knobs), so one judge can be swept over its settings.

* ``halcyon`` — :class:`controller.canary.RolloutRun` itself, unchanged (ADR 0008); its knob
  is ``false_alarm_rate``.
* ``original`` — the canary controller of the system Halcyon replaces, rebuilt from its
  description (``/work/shared/reference/seed-description.txt``, "SLO-gated progressive
  rollout"): fixed windows judged one by one (a sparse window is thrown away, not extended), a
  minimum request count per arm, relative and absolute error tolerance, a p95 tolerance, and
  streaks in both directions (a sparse window touches neither). No rank test, no sequential
  test. The description names the guards but gives no numbers: the window (10 s), the streaks
  (2 / 2), the tolerances and the steps are the ``JudgePolicy`` defaults, which DESIGN.md
  describes as the original's guards. For the minimum request count 20 is used (its own
  example: "at 1 % traffic a window may hold eight requests"), because with Halcyon's 50 it
  could never judge the 1 % step at this traffic and would time out every time. Its knobs are
  ``window_s`` and ``unhealthy`` (windows in a row to roll back).
* ``fixed-interval`` — today's fixed-interval judge, kept under its name: Halcyon's steps, one
  check per ``interval_s`` (60 s) of the canary *relative to the baseline* (the error tolerance
  and the p95 ratio of ``JudgePolicy``); a passed check advances one step (or promotes after
  the last), a failed one holds; ``threshold`` (5) failed checks in all roll back. An empty
  interval fails its check. It is *not* Flagger: Flagger, with its own steps and absolute
  thresholds, is in :mod:`bench.rollout_rivals`.
* ``flagger`` and ``argo`` — :mod:`bench.rollout_rivals`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from controller.canary import (
    ArmEvidence,
    ArmSummary,
    Decision,
    JudgePolicy,
    RolloutAction,
    RolloutPhase,
    error_limit,
)
from controller.canary.progress import StepProgress
from controller.canary.stats import sorted_quantile

__all__ = [
    "FixedIntervalJudge",
    "Judge",
    "JudgeSetting",
    "OriginalJudge",
    "Span",
    "StepRival",
]

FloatArray = npt.NDArray[np.float64]


class Judge(Protocol):
    """What the simulation drives: the public shape of ``RolloutRun``."""

    @property
    def canary_percent(self) -> float: ...

    @property
    def done(self) -> bool: ...

    @property
    def phase(self) -> RolloutPhase: ...

    def observe(self, baseline: ArmEvidence, canary: ArmEvidence, now: float) -> None: ...

    def tick(self, now: float) -> Decision | None: ...


class Span:
    """One arm's evidence over a window or an interval (exact, for the rivals)."""

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.errors = 0
        self.shed = 0
        self._latencies: list[FloatArray] = []
        self._ordered: FloatArray | None = None

    def add(self, evidence: ArmEvidence) -> None:
        self.requests += evidence.requests
        self.errors += evidence.errors
        self.shed += evidence.shed
        self.failures += evidence.errors + evidence.shed
        if len(evidence.latencies_s):
            self._latencies.append(np.asarray(evidence.latencies_s, dtype=np.float64))
            self._ordered = None

    @property
    def error_rate(self) -> float:
        return self.failures / self.requests if self.requests else 0.0

    def _sorted(self) -> FloatArray:
        if self._ordered is None:
            values = np.concatenate(self._latencies) if self._latencies else np.empty(0)
            values.sort()
            self._ordered = values
        return self._ordered

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the answered requests' latencies (NaN when none)."""
        return sorted_quantile(self._sorted(), q)

    def p95(self) -> float:
        return self.quantile(0.95)

    def summary(self) -> ArmSummary:
        values = self._sorted()
        return ArmSummary(
            self.requests,
            self.errors,
            self.shed,
            self.error_rate,
            sorted_quantile(values, 0.5),
            sorted_quantile(values, 0.95),
        )


def _breach(baseline: Span, canary: Span, policy: JudgePolicy) -> str | None:
    """The relative guard the canary breaks over a span (error rate, then p95), or None."""
    if canary.error_rate > error_limit(baseline.error_rate, policy):
        return "error_rate"
    b95, c95 = baseline.p95(), canary.p95()
    if c95 > policy.max_p95_ratio * b95:  # NaN (no answers) compares False
        return "latency"
    return None


class StepRival(StepProgress):
    """Shared bookkeeping of the rivals: the span being collected, decisions, the timeout."""

    def __init__(self, steps: Sequence[float], policy: JudgePolicy, started_at: float) -> None:
        super().__init__(steps)
        self.policy = policy
        self.started_at = started_at
        self._baseline = Span()
        self._canary = Span()

    def observe(self, baseline: ArmEvidence, canary: ArmEvidence, now: float) -> None:
        if not self.done:
            self._baseline.add(baseline)
            self._canary.add(canary)

    def _decide(self, action: RolloutAction, reason: str, *, reset: bool = True) -> Decision:
        """Apply ``action``; a new span begins unless ``reset`` is False."""
        from_percent, to_percent = self._move(action)
        decision = Decision(
            action=action,
            reason=reason,
            detail=reason,
            from_percent=from_percent,
            to_percent=to_percent,
            baseline=self._baseline.summary(),
            canary=self._canary.summary(),
            statistics={},
        )
        if reset:
            self._baseline, self._canary = Span(), Span()
        return decision

    def _timed_out(self, now: float) -> Decision | None:
        if now - self.started_at >= self.policy.max_duration_s:
            return self._decide(RolloutAction.ROLLBACK, "max_duration")
        return None

    def _pass(self) -> Decision:
        action = RolloutAction.PROMOTE if self.last_step else RolloutAction.ADVANCE
        return self._decide(action, "healthy")


class OriginalJudge(StepRival):
    """Fixed windows, min requests, thresholds, streaks (see the module docstring)."""

    MIN_REQUESTS = 20

    def __init__(self, steps: Sequence[float], policy: JudgePolicy, started_at: float) -> None:
        super().__init__(steps, policy, started_at)
        self._window_end = started_at + policy.window_s
        self._healthy = 0
        self._unhealthy = 0

    def tick(self, now: float) -> Decision | None:
        if self.done:
            return None
        timed_out = self._timed_out(now)
        if timed_out is not None or now < self._window_end:
            return timed_out
        self._window_end += self.policy.window_s
        if min(self._baseline.requests, self._canary.requests) < self.MIN_REQUESTS:
            return self._decide(RolloutAction.HOLD, "insufficient_data")
        breach = _breach(self._baseline, self._canary, self.policy)
        if breach is None:
            self._healthy, self._unhealthy = self._healthy + 1, 0
            if self._healthy >= self.policy.healthy_windows_to_advance:
                self._healthy = 0
                return self._pass()
            return self._decide(RolloutAction.HOLD, "awaiting_confirmation")
        self._healthy, self._unhealthy = 0, self._unhealthy + 1
        if self._unhealthy >= self.policy.unhealthy_windows_to_rollback:
            return self._decide(RolloutAction.ROLLBACK, breach)
        return self._decide(RolloutAction.HOLD, breach)


class FixedIntervalJudge(StepRival):
    """One check per interval; a pass advances, ``threshold`` failures roll back."""

    INTERVAL_S = 60.0
    THRESHOLD = 5

    def __init__(
        self,
        steps: Sequence[float],
        policy: JudgePolicy,
        started_at: float,
        *,
        interval_s: float = INTERVAL_S,
        threshold: int = THRESHOLD,
    ) -> None:
        super().__init__(steps, policy, started_at)
        if not interval_s > 0 or threshold < 1:
            raise ValueError(
                f"interval_s must be > 0 and threshold >= 1: {interval_s}, {threshold}"
            )
        self.interval_s = interval_s
        self.threshold = threshold
        self._check_at = started_at + interval_s
        self._failed = 0

    def tick(self, now: float) -> Decision | None:
        if self.done:
            return None
        timed_out = self._timed_out(now)
        if timed_out is not None or now < self._check_at:
            return timed_out
        self._check_at += self.interval_s
        if self._canary.requests == 0 or self._baseline.requests == 0:
            breach: str | None = "no_data"
        else:
            breach = _breach(self._baseline, self._canary, self.policy)
        if breach is None:
            return self._pass()
        self._failed += 1
        if self._failed >= self.threshold:
            return self._decide(RolloutAction.ROLLBACK, breach)
        return self._decide(RolloutAction.HOLD, breach)


Params = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class JudgeSetting:
    """A judge and the knobs it is run at (empty ``params``: its defaults).

    ``params`` are (name, value) pairs, e.g. ``(("interval_s", 30.0), ("threshold", 2.0))``;
    hashable and picklable, so a setting can name a row and cross a process boundary.
    """

    judge: str
    params: Params = ()

    @property
    def label(self) -> str:
        """``interval_s=30 threshold=2`` — or ``default``."""
        return " ".join(f"{k}={v:g}" for k, v in self.params) or "default"

    def get(self, name: str, default: float) -> float:
        return dict(self.params).get(name, default)
