"""Flagger and Argo Rollouts as their documentation configures them, for the rollout simulation.

What it decides: nothing in production. Two rival judges with the :class:`~bench.rollout_judges.
Judge` shape, each on its *own* steps and with *absolute* thresholds on the canary alone (no
baseline comparison), as their documentation describes them:

**Flagger** (https://docs.flagger.app/usage/how-it-works, "Canary analysis", and the Istio
tutorial https://docs.flagger.app/tutorials/istio-progressive-delivery, whose analysis is
``interval: 1m, threshold: 5, maxWeight: 50, stepWeight: 10`` with ``request-success-rate``
``min: 99`` and ``request-duration`` (P99, ms) ``max: 500``). Every ``interval`` the analysis
runs once, over that interval's metrics of the canary:

* if ``failedChecks`` has reached ``threshold``, roll back (Flagger tests this at the *start*
  of a run, so the rollback comes one interval after the threshold-th failed check);
* a check fails when the success rate is below ``min_success_rate``, the p99 above
  ``max_p99_s``, or there is no data (Flagger's "no values found" halts advancement and counts
  as a failed check); a failed check increments ``failedChecks`` and holds the weight;
* a passed check advances ``stepWeight`` (10, 20, … ``maxWeight`` 50); at ``maxWeight`` a
  passed check promotes.

``failedChecks`` is *not* reset by a passed check: the docs describe the counter only as "max
number of failed metric checks before rollback", and Flagger's scheduler
(``pkg/controller/scheduler.go``) resets it only when a new revision restarts the analysis.
Flagger's first run moves the weight from 0 to ``stepWeight`` without a metric check; here the
rollout starts at ``stepWeight`` (0 % serves nothing, so no blast radius is hidden).

**Argo Rollouts** (https://argo-rollouts.readthedocs.io/en/stable/features/analysis/,
"Background Analysis", and https://argo-rollouts.readthedocs.io/en/stable/features/canary/).
The docs' background example steps ``setWeight`` 20, 40, 60, 80 with a 10 min ``pause`` after
each, promoting after the last, and measures every ``interval: 5m`` with ``failureLimit: 3``;
here time is scaled by 1/5 so a rollout fits the simulation's 900 s horizon: pauses of 120 s
(promotion at 480 s) and a default ``interval`` of 60 s. The AnalysisRun starts with the first
step and runs in the background:

* every ``interval`` a measurement over that interval of the canary (the first at one
  ``interval``: Argo's immediate first measurement would find no canary traffic yet, an error
  that counts for nothing), per metric:
  ``success-rate >= 0.99`` and ``latency-p99 <= 0.5 s``. The docs' example condition is
  ``>= 0.95``; 0.99 is used because it is the SLO Flagger is given here too, and because 0.95
  would tolerate 25 times the baseline's error rate and wave the +5-point canary through — a
  rival configured to lose. An interval without requests cannot be evaluated (a measurement
  *error*, not a failure); more than ``consecutive_error_limit`` (4, Argo's default) errors in
  a row fail the analysis;
* a metric fails the analysis when its failed measurements *exceed* ``failureLimit`` (Argo's
  rule: ``failed > failureLimit``; 0 means the first failure aborts); a failed analysis aborts
  the rollout at once (rollback);
* ``count`` measurements end the analysis (successful unless failed); unset (0 here) it runs
  until the rollout ends; all steps done promotes.

Both judge absolute numbers, so their false-rollback rate depends on how far the service's own
p99 and error rate sit from the thresholds: :func:`describe_rival` prints the settings and the
report prints the A/A canary's p99 so a reader can see that headroom. ``max_p99_s`` and
``min_success_rate`` are settings like the others, so the sweep can move them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

from bench.rollout_judges import JudgeSetting, Span, StepRival
from controller.canary import Decision, JudgePolicy, RolloutAction

__all__ = [
    "ArgoJudge",
    "ArgoSettings",
    "FlaggerJudge",
    "FlaggerSettings",
    "argo_settings",
    "describe_rival",
    "flagger_settings",
]


_T = TypeVar("_T", "FlaggerSettings", "ArgoSettings")


def _absolute_breach(canary: Span, min_success_rate: float, max_p99_s: float) -> str | None:
    """Which absolute threshold the canary's span breaks: no data, success rate, then p99."""
    if canary.requests == 0:
        return "no_data"
    if 1.0 - canary.error_rate < min_success_rate:
        return "error_rate"
    p99 = canary.quantile(0.99)
    if not p99 <= max_p99_s:  # every request failed: no latency, the query returns NaN
        return "latency"
    return None


@dataclass(frozen=True)
class FlaggerSettings:
    """Flagger's ``analysis`` block (documented example values)."""

    interval_s: float = 60.0
    threshold: int = 5
    step_weight: float = 10.0
    max_weight: float = 50.0
    min_success_rate: float = 0.99
    max_p99_s: float = 0.5

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.threshold >= 1 and self.step_weight > 0):
            raise ValueError(f"invalid Flagger settings: {self}")
        if not self.step_weight <= self.max_weight <= 100:
            raise ValueError(f"invalid Flagger settings: {self}")

    @property
    def steps(self) -> tuple[float, ...]:
        count = round(self.max_weight / self.step_weight)
        return tuple(min(self.max_weight, self.step_weight * (i + 1)) for i in range(count))


@dataclass(frozen=True)
class ArgoSettings:
    """Argo Rollouts' canary steps and the background AnalysisRun's metric fields."""

    interval_s: float = 60.0
    failure_limit: int = 3
    count: int = 0  # 0: unset, measure until the rollout ends
    weights: tuple[float, ...] = (20.0, 40.0, 60.0, 80.0)
    pause_s: float = 120.0
    min_success_rate: float = 0.99
    max_p99_s: float = 0.5
    consecutive_error_limit: int = 4

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.failure_limit >= 0 and self.count >= 0):
            raise ValueError(f"invalid Argo settings: {self}")
        if not (self.pause_s > 0 and self.weights):
            raise ValueError(f"invalid Argo settings: {self}")


def _settings(base: _T, setting: JudgeSetting) -> _T:
    """``base`` with the setting's params applied (ints where the field is an int)."""
    kinds = {f.name: f.type for f in fields(base)}
    changes: dict[str, Any] = {}
    for name, value in setting.params:
        if name not in kinds:
            raise ValueError(f"{setting.judge} has no setting {name!r}: {', '.join(kinds)}")
        changes[name] = int(value) if kinds[name] in ("int", int) else float(value)
    return replace(base, **changes)


def flagger_settings(setting: JudgeSetting) -> FlaggerSettings:
    """Flagger's documented settings with ``setting``'s params applied."""
    return _settings(FlaggerSettings(), setting)


def argo_settings(setting: JudgeSetting) -> ArgoSettings:
    """Argo's documented settings (time-scaled) with ``setting``'s params applied."""
    return _settings(ArgoSettings(), setting)


def describe_rival(name: str, setting: JudgeSetting | None = None) -> str:
    """One line with a rival's settings (its defaults, or ``setting``'s), for the report."""
    if name == "flagger":
        f = flagger_settings(setting or JudgeSetting(name))
        steps = ", ".join(f"{s:g}" for s in f.steps)
        return (
            f"flagger: steps {steps} %, a check every interval (default {f.interval_s:g} s) of "
            f"the canary alone: success rate >= {100 * f.min_success_rate:g} %, p99 <= "
            f"{1000 * f.max_p99_s:g} ms, no data fails; threshold (default {f.threshold}) "
            "failed checks in all (never reset) roll back at the next check"
        )
    a = argo_settings(setting or JudgeSetting(name))
    steps = ", ".join(f"{w:g}" for w in a.weights)
    return (
        f"argo: setWeight {steps} % with {a.pause_s:g} s pauses (the docs' 10 min scaled by "
        f"1/5), background analysis every interval (default {a.interval_s:g} s) of the canary "
        f"alone: success rate >= {a.min_success_rate:g}, p99 <= {1000 * a.max_p99_s:g} ms; "
        f"aborts when a metric's failures exceed failureLimit (default {a.failure_limit}); "
        f"count {'unset' if a.count == 0 else a.count}"
    )


class FlaggerJudge(StepRival):
    """Flagger's canary analysis loop (see the module docstring)."""

    def __init__(self, settings: FlaggerSettings, policy: JudgePolicy, started_at: float) -> None:
        super().__init__(settings.steps, policy, started_at)
        self.settings = settings
        self.failed_checks = 0
        self._last_failure = "no_data"
        self._check_at = started_at + settings.interval_s

    def tick(self, now: float) -> Decision | None:
        if self.done:
            return None
        timed_out = self._timed_out(now)
        if timed_out is not None or now < self._check_at:
            return timed_out
        self._check_at += self.settings.interval_s
        if self.failed_checks >= self.settings.threshold:
            return self._decide(RolloutAction.ROLLBACK, self._last_failure)
        s = self.settings
        breach = _absolute_breach(self._canary, s.min_success_rate, s.max_p99_s)
        if breach is None:
            return self._pass()
        self.failed_checks += 1
        self._last_failure = breach
        return self._decide(RolloutAction.HOLD, breach)


class ArgoJudge(StepRival):
    """Argo Rollouts' canary steps with a background AnalysisRun (see the module docstring)."""

    METRICS = ("error_rate", "latency")

    def __init__(self, settings: ArgoSettings, policy: JudgePolicy, started_at: float) -> None:
        super().__init__(settings.weights, policy, started_at)
        self.settings = settings
        self.failed = dict.fromkeys(self.METRICS, 0)
        self.measurements = 0
        self._errors_in_a_row = 0
        self._measure_at = started_at + settings.interval_s
        self._step_ends = started_at + settings.pause_s

    @property
    def analysing(self) -> bool:
        return self.settings.count == 0 or self.measurements < self.settings.count

    def tick(self, now: float) -> Decision | None:
        if self.done:
            return None
        timed_out = self._timed_out(now)
        if timed_out is not None:
            return timed_out
        decision: Decision | None = None
        if self.analysing and now >= self._measure_at:
            self._measure_at += self.settings.interval_s
            decision = self._measure()
            if self.done:
                return decision
        if now >= self._step_ends:
            self._step_ends += self.settings.pause_s
            action = RolloutAction.PROMOTE if self.last_step else RolloutAction.ADVANCE
            # The analysis window is wall-clock: a step change does not restart it.
            decision = self._decide(action, "healthy", reset=False)
        return decision

    def _measure(self) -> Decision:
        s = self.settings
        self.measurements += 1
        canary = self._canary
        if canary.requests == 0:
            self._errors_in_a_row += 1
            if self._errors_in_a_row > s.consecutive_error_limit:
                return self._decide(RolloutAction.ROLLBACK, "no_data")
            return self._decide(RolloutAction.HOLD, "no_data")
        self._errors_in_a_row = 0
        failing = []
        if 1.0 - canary.error_rate < s.min_success_rate:
            failing.append("error_rate")
        if not canary.quantile(0.99) <= s.max_p99_s:
            failing.append("latency")
        for metric in failing:
            self.failed[metric] += 1
        for metric in failing:
            if self.failed[metric] > s.failure_limit:
                return self._decide(RolloutAction.ROLLBACK, metric)
        return self._decide(RolloutAction.HOLD, failing[0] if failing else "measured")
