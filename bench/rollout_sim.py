"""The rollout simulation behind ``halcyon bench --scenario rollout``: one seeded rollout.

What it decides: nothing in production. It replays a seeded rollout through a judge — the real
one (:class:`controller.canary.RolloutRun`) or a rival (:mod:`bench.rollout_judges`) at one of
its settings — on evidence from a seeded source (:func:`make_source`: one of the evidence
models, ``independent`` being today's :class:`bench.rollout_traffic.Traffic`), one simulated
second per tick — the controller's cadence — to its final decision:

* a rollout that reaches the horizon (``max_duration_s``) is rolled back with reason
  ``max_duration``, for every judge;
* ``canary_requests``: requests the canary served up to its final decision;
* ``blast_radius``: what a *bad* canary cost — ``canary_requests`` if it was rolled back; if it
  was promoted, that plus all traffic for the rest of the horizon (it now serves 100 %; the
  traffic's mean rate × the seconds left).

Seeds are independent traffic draws; seed ``k`` is the same traffic for every judge and case.
The sweep over settings and seeds, and the report, are :mod:`bench.rollout_curves`;
:func:`run_rollouts` and :func:`format_table` here give the plain one-row-per-(judge, case)
view at every judge's defaults.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.markdown import markdown_table
from bench.rollout_judge_registry import JUDGES, build_judge
from bench.rollout_judges import JudgeSetting
from bench.rollout_models import EVIDENCE_MODELS, EvidenceSource, make_source
from bench.rollout_traffic import CASES, Case, TrafficModel
from controller.canary import DEFAULT_STEPS, JudgePolicy, RolloutPhase

__all__ = [
    "EvidenceSource",
    "RolloutRecord",
    "RunResult",
    "SimConfig",
    "evidence_models",
    "format_table",
    "make_source",
    "run_rollouts",
    "simulate",
]


def evidence_models() -> tuple[str, ...]:
    """The names of the evidence models :func:`make_source` knows, in report order."""
    return tuple(EVIDENCE_MODELS)


@dataclass(frozen=True)
class SimConfig:
    """What every simulated rollout shares."""

    traffic: TrafficModel = field(default_factory=TrafficModel)
    policy: JudgePolicy = field(default_factory=lambda: JudgePolicy(max_duration_s=900.0))
    steps: tuple[float, ...] = DEFAULT_STEPS
    seeds: int = 200
    first_seed: int = 1
    cases: tuple[Case, ...] = CASES
    evidence: tuple[str, ...] = field(default_factory=evidence_models)

    @property
    def horizon_s(self) -> int:
        return int(np.ceil(self.policy.max_duration_s))


@dataclass(frozen=True)
class RunResult:
    """How one rollout ended."""

    phase: RolloutPhase
    reason: str
    decision_s: float
    canary_requests: int
    final_percent: float
    blast_radius: int  # canary_requests, plus the rest of the horizon if a bad one was promoted


def simulate(
    judge: JudgeSetting | str, case: Case, source: EvidenceSource, config: SimConfig
) -> RunResult:
    """One rollout of ``case`` judged by ``judge`` on ``source``, to its final decision."""
    setting = JudgeSetting(judge) if isinstance(judge, str) else judge
    run = build_judge(setting, config.steps, config.policy, 0.0)
    served = 0
    horizon = config.horizon_s
    for second in range(horizon + 1):
        percent = run.canary_percent
        baseline, canary = source.evidence(case, second, percent / 100.0)
        served += canary.requests
        now = float(second + 1)
        run.observe(baseline, canary, now)
        decision = run.tick(now)
        if run.done:
            assert decision is not None
            blast = served
            if case.bad and run.phase is RolloutPhase.PROMOTED:
                # It now serves everyone: the traffic of the rest of the horizon (its mean, so
                # no evidence is drawn that no judge will see).
                blast += round(config.traffic.rate * max(0, horizon - (second + 1)))
            return RunResult(run.phase, decision.reason, now, served, percent, blast)
    raise AssertionError(f"{setting.judge} did not end by its maximum duration")


@dataclass(frozen=True)
class RolloutRecord:
    """One (judge, case) row over every seed."""

    judge: str
    case: str
    seeds: int
    promoted: float
    rolled_back: float
    decision_s_p50: float
    decision_s_p95: float
    blast_radius_p50: float
    blast_radius_p95: float
    blast_radius_mean: float
    rollback_reasons: dict[str, float]
    rollback_percent: dict[str, float]

    def as_json(self) -> dict[str, Any]:
        return {
            "judge": self.judge,
            "case": self.case,
            "seeds": self.seeds,
            "promoted": self.promoted,
            "rolled_back": self.rolled_back,
            "decision_s_p50": self.decision_s_p50,
            "decision_s_p95": self.decision_s_p95,
            "blast_radius_p50": self.blast_radius_p50,
            "blast_radius_p95": self.blast_radius_p95,
            "blast_radius_mean": self.blast_radius_mean,
            "rollback_reasons": self.rollback_reasons,
            "rollback_percent": self.rollback_percent,
        }


def _record(judge: str, case: str, results: Sequence[RunResult]) -> RolloutRecord:
    n = len(results)
    times = np.array([r.decision_s for r in results])
    served = np.array([r.blast_radius for r in results], dtype=np.float64)
    rollbacks = [r for r in results if r.phase is RolloutPhase.ROLLED_BACK]
    reasons = Counter(r.reason for r in rollbacks)
    at_percent = Counter(f"{r.final_percent:g}" for r in rollbacks)
    return RolloutRecord(
        judge=judge,
        case=case,
        seeds=n,
        promoted=sum(r.phase is RolloutPhase.PROMOTED for r in results) / n,
        rolled_back=len(rollbacks) / n,
        decision_s_p50=float(np.quantile(times, 0.5)),
        decision_s_p95=float(np.quantile(times, 0.95)),
        blast_radius_p50=float(np.quantile(served, 0.5)),
        blast_radius_p95=float(np.quantile(served, 0.95)),
        blast_radius_mean=float(served.mean()),
        rollback_reasons={k: v / n for k, v in sorted(reasons.items())},
        rollback_percent={
            k: v / n for k, v in sorted(at_percent.items(), key=lambda kv: float(kv[0]))
        },
    )


def run_rollouts(
    config: SimConfig,
    *,
    judges: Sequence[str] | None = None,
    cases: Sequence[str] | None = None,
    on_seed: Callable[[int, int], None] | None = None,
) -> list[RolloutRecord]:
    """Every (judge, case) at its defaults over ``config.seeds`` seeds of the first evidence
    model; rows in judge-then-case order."""
    judge_names = list(judges) if judges is not None else [j.name for j in JUDGES]
    chosen = [c for c in config.cases if cases is None or c.name in cases]
    results: dict[tuple[str, str], list[RunResult]] = {
        (j, c.name): [] for j in judge_names for c in chosen
    }
    for k in range(config.seeds):
        source = make_source(config.evidence[0], config.traffic, config.first_seed + k)
        for case in chosen:
            for judge in judge_names:
                results[(judge, case.name)].append(simulate(judge, case, source, config))
        if on_seed is not None:
            on_seed(k + 1, config.seeds)
    return [_record(j, c.name, results[(j, c.name)]) for j in judge_names for c in chosen]


_COLUMNS = (
    ("judge", "{}"),
    ("case", "{}"),
    ("promoted", "{:.1%}"),
    ("rolled back", "{:.1%}"),
    ("decision s p50", "{:.0f}"),
    ("p95", "{:.0f}"),
    ("blast radius p50", "{:.0f}"),
    ("p95", "{:.0f}"),
    ("rollback reasons", "{}"),
)


def _reasons(record: RolloutRecord) -> str:
    parts = [f"{reason} {share:.0%}" for reason, share in record.rollback_reasons.items()]
    return ", ".join(parts) or "-"


def format_table(records: Sequence[RolloutRecord]) -> str:
    """A Markdown table: one row per (judge, case)."""
    rows = [
        (
            r.judge,
            r.case,
            r.promoted,
            r.rolled_back,
            r.decision_s_p50,
            r.decision_s_p95,
            r.blast_radius_p50,
            r.blast_radius_p95,
            _reasons(r),
        )
        for r in records
    ]
    return markdown_table(_COLUMNS, rows, left={0, 1, len(_COLUMNS) - 1})


def describe(config: SimConfig) -> str:
    """One line naming traffic, policy and seeds, so the table never floats free of inputs."""
    t, p = config.traffic, config.policy
    steps = ", ".join(f"{s:g}" for s in config.steps)
    return (
        f"Rollout simulation — {config.seeds} seeds from {config.first_seed:#x}; {t.rate:g} req/s "
        f"Poisson, baseline errors {100 * t.baseline_error_rate:g}%, latency log-normal "
        f"service (median {1000 * t.service_median_s:g} ms) + M/M/1 wait at "
        f"{t.utilisation:.0%} utilisation; steps {steps} %, then promote; window "
        f"{p.window_s:g} s, min {p.min_requests} requests/arm, error limit max(+"
        f"{100 * p.max_error_rate_increase:g} points, x{p.max_error_rate_ratio:g}), p95 limit "
        f"x{p.max_p95_ratio:g}, streaks {p.healthy_windows_to_advance}/"
        f"{p.unhealthy_windows_to_rollback}, false-alarm rate {p.false_alarm_rate:g}, "
        f"max duration {p.max_duration_s:g} s; evidence {', '.join(config.evidence)}. Blast "
        "radius = requests the canary served before the final decision (a bad canary promoted "
        "is also charged all traffic for the rest of the horizon)."
    )
