"""Which judge a :class:`~bench.rollout_judges.JudgeSetting` names, built at its knobs.

What it decides: how the rollout simulation turns a setting (a judge's name and its knobs) into
a running judge. It sits above both judge modules — Halcyon's and the original's in
:mod:`bench.rollout_judges`, Flagger and Argo Rollouts in :mod:`bench.rollout_rivals`, which
builds on the first — so neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from bench.rollout_judges import FixedIntervalJudge, Judge, JudgeSetting, OriginalJudge
from bench.rollout_rivals import ArgoJudge, FlaggerJudge, argo_settings, flagger_settings
from controller.canary import JudgePolicy, RolloutRun

Builder = Callable[[JudgeSetting, Sequence[float], JudgePolicy, float], Judge]


def _halcyon(
    setting: JudgeSetting, steps: Sequence[float], policy: JudgePolicy, t0: float
) -> Judge:
    policy = replace(
        policy,
        false_alarm_rate=setting.get("false_alarm_rate", policy.false_alarm_rate),
        window_s=setting.get("window_s", policy.window_s),
        healthy_windows_to_advance=int(setting.get("healthy", policy.healthy_windows_to_advance)),
        min_requests=int(setting.get("min_requests", policy.min_requests)),
    )
    return RolloutRun(steps=steps, policy=policy, started_at=t0)


def _original(
    setting: JudgeSetting, steps: Sequence[float], policy: JudgePolicy, t0: float
) -> Judge:
    policy = replace(
        policy,
        window_s=setting.get("window_s", policy.window_s),
        unhealthy_windows_to_rollback=int(
            setting.get("unhealthy", policy.unhealthy_windows_to_rollback)
        ),
    )
    return OriginalJudge(steps, policy, t0)


def _fixed(setting: JudgeSetting, steps: Sequence[float], policy: JudgePolicy, t0: float) -> Judge:
    return FixedIntervalJudge(
        steps,
        policy,
        t0,
        interval_s=setting.get("interval_s", FixedIntervalJudge.INTERVAL_S),
        threshold=int(setting.get("threshold", FixedIntervalJudge.THRESHOLD)),
    )


def _flagger(
    setting: JudgeSetting, steps: Sequence[float], policy: JudgePolicy, t0: float
) -> Judge:
    return FlaggerJudge(flagger_settings(setting), policy, t0)


def _argo(setting: JudgeSetting, steps: Sequence[float], policy: JudgePolicy, t0: float) -> Judge:
    return ArgoJudge(argo_settings(setting), policy, t0)


@dataclass(frozen=True)
class JudgeFactory:
    name: str
    build: Builder


JUDGES: tuple[JudgeFactory, ...] = (
    JudgeFactory("halcyon", _halcyon),
    JudgeFactory("original", _original),
    JudgeFactory("fixed-interval", _fixed),
    JudgeFactory("flagger", _flagger),
    JudgeFactory("argo", _argo),
)


def build_judge(
    setting: JudgeSetting, steps: Sequence[float], policy: JudgePolicy, started_at: float
) -> Judge:
    """The judge ``setting`` names, on Halcyon's ``steps`` (Flagger and Argo use their own)."""
    for factory in JUDGES:
        if factory.name == setting.judge:
            return factory.build(setting, steps, policy, started_at)
    raise ValueError(
        f"unknown judge {setting.judge!r}: choose from {', '.join(j.name for j in JUDGES)}"
    )


def make_judge(name: str, steps: Sequence[float], policy: JudgePolicy, started_at: float) -> Judge:
    """The judge ``name`` at its default settings."""
    return build_judge(JudgeSetting(name), steps, policy, started_at)
