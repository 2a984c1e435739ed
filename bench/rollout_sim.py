"""The rollout simulation behind ``halcyon bench --scenario rollout``.

What it decides: nothing in production. It replays seeded rollouts through the real judge
(:class:`controller.canary.RolloutRun`) and two rivals (:mod:`bench.rollout_judges`) on the
same traffic (:mod:`bench.rollout_traffic`), one simulated second per tick — the controller's
cadence — and reports per (judge, case) over many seeds:

* ``promoted`` / ``rolled_back``: shares of seeds (a rollout that reaches the horizon,
  ``max_duration_s``, is rolled back with reason ``max_duration``, for every judge);
* ``decision_s_p50`` / ``decision_s_p95``: seconds from the start to the final decision;
* ``blast_radius_p50`` / ``blast_radius_p95``: requests the canary served up to its final
  decision. For a bad canary rolled back, that is the harm done before the rollback; for one
  promoted, it is what it served before taking all traffic (which is worse, and shows in
  ``promoted``).

Seeds are independent traffic draws; seed ``k`` is the same traffic for every judge and case.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

import numpy as np

from bench.markdown import markdown_table
from bench.rollout_judges import JUDGES, make_judge
from bench.rollout_traffic import CASES, Case, Traffic, TrafficModel
from controller.canary import DEFAULT_STEPS, JudgePolicy, RolloutPhase

__all__ = [
    "RolloutRecord",
    "RunResult",
    "SimConfig",
    "format_table",
    "rollout_main",
    "run_rollouts",
    "simulate",
]


@dataclass(frozen=True)
class SimConfig:
    """What every simulated rollout shares."""

    traffic: TrafficModel = field(default_factory=TrafficModel)
    policy: JudgePolicy = field(default_factory=lambda: JudgePolicy(max_duration_s=900.0))
    steps: tuple[float, ...] = DEFAULT_STEPS
    seeds: int = 200
    first_seed: int = 1
    cases: tuple[Case, ...] = CASES


@dataclass(frozen=True)
class RunResult:
    """How one rollout ended."""

    phase: RolloutPhase
    reason: str
    decision_s: float
    canary_requests: int
    final_percent: float


def simulate(judge_name: str, case: Case, traffic: Traffic, config: SimConfig) -> RunResult:
    """One rollout of ``case`` judged by ``judge_name`` on ``traffic``, to its final decision."""
    judge = make_judge(judge_name, config.steps, config.policy, 0.0)
    served = 0
    horizon = int(np.ceil(config.policy.max_duration_s))
    for second in range(horizon + 1):
        percent = judge.canary_percent
        baseline, canary = traffic.evidence(case, second, percent / 100.0)
        served += canary.requests
        now = float(second + 1)
        judge.observe(baseline, canary, now)
        decision = judge.tick(now)
        if judge.done:
            assert decision is not None
            return RunResult(judge.phase, decision.reason, now, served, percent)
    raise AssertionError(f"{judge_name} did not end by its maximum duration")


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
    served = np.array([r.canary_requests for r in results], dtype=np.float64)
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
    """Every (judge, case) over ``config.seeds`` seeds; rows in judge-then-case order."""
    judge_names = list(judges) if judges is not None else [j.name for j in JUDGES]
    chosen = [c for c in config.cases if cases is None or c.name in cases]
    results: dict[tuple[str, str], list[RunResult]] = {
        (j, c.name): [] for j in judge_names for c in chosen
    }
    for k in range(config.seeds):
        traffic = Traffic(config.traffic, config.first_seed + k)
        for case in chosen:
            for judge in judge_names:
                results[(judge, case.name)].append(simulate(judge, case, traffic, config))
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
        f"max duration {p.max_duration_s:g} s. Blast radius = requests the canary served "
        "before the final decision."
    )


def rollout_main(
    config: SimConfig, as_json: bool, out: TextIO, err: TextIO, *, progress: bool = False
) -> int:
    """Runs every (judge, case) and prints a table or JSON lines; timing goes to ``err``."""
    started = time.perf_counter()

    def on_seed(done: int, total: int) -> None:
        if progress:
            err.write(f"\r  seed {done}/{total}\x1b[K")
            err.flush()

    records = run_rollouts(config, on_seed=on_seed)
    if progress:
        err.write("\r\x1b[K")
    if as_json:
        for record in records:
            out.write(json.dumps(record.as_json()) + "\n")
    else:
        out.write(describe(config) + "\n\n" + format_table(records) + "\n")
    err.write(
        f"{len(records)} (judge, case) rows x {config.seeds} seeds in "
        f"{time.perf_counter() - started:.1f} s\n"
    )
    return 0


def with_seeds(config: SimConfig, seeds: int) -> SimConfig:
    return replace(config, seeds=seeds)
