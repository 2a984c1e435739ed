"""Blast radius against A/A false-rollback rate: every judge swept over its knobs, as curves.

What it decides: nothing in production — how the rollout comparison is run and reported
(``halcyon bench --scenario rollout``). Each rival is swept over its main knobs (:data:`SWEEPS`;
a dozen settings at most), Halcyon runs at its default policy and along its own curve (other
false-alarm rates, faster walks through the healthy steps), and every (evidence model, setting)
is scored on the same seeds:

* **A/A false-rollback rate** — the share of A/A seeds rolled back for any reason (including
  ``max_duration``), with its Wilson 95 % interval. The A/A case is the first case that is not
  ``bad`` (case names are opaque here).
* per bad case: **caught** (share rolled back) and the **blast radius** (median, p95): requests
  the bad canary served until the final decision; a bad canary *promoted* is charged what it
  served until promotion plus all traffic for the rest of the horizon (it now serves 100 %).
* with ``other_good``, per other good case (e.g. a faster canary): the share rolled back.

Seeds: Halcyon's default policy gets ``aa_seeds`` A/A seeds (>= 1,000 for the figure to mean
something at 1 %); every other point gets ``rival_aa_seeds`` (default: the bad cases' seeds).

**Matched false-rollback rate**: for each rival, the setting with the smallest median blast
radius among those whose A/A rate is at most Halcyon's (default policy) point estimate — and,
separately, at most its Wilson upper bound; the report gives Halcyon's median blast radius
divided by that rival's. A rival with no setting that careful is reported as such. "Dominated"
counts the rival settings beaten by some Halcyon point at an equal or lower A/A rate: all of them
means Halcyon's curve lies below that rival's. Halcyon's curve is its settings that catch at
least :data:`CATCH_BAR` of every bad case. It is judged over the rival settings that meet the
issue's A/A bar (:data:`TARGET_FRR`), over those an operator could still live with
(:data:`USABLE_FRR`), and over all of them. **At the issue's rate**
(:data:`TARGET_FRR`): Halcyon's best point against the rival's best, both at A/A <= 1 %.

Seeds are independent and identical for every judge (common random numbers); the work is split
by (evidence model, seed) over a process pool and gathered in seed order, so the output is the
same bytes whatever ``jobs`` is. The report (tables, figures, plot) is
:mod:`bench.rollout_report`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np

from bench.rollout_judges import JudgeSetting
from bench.rollout_sim import RunResult, SimConfig, make_source, simulate
from bench.rollout_traffic import Case
from controller.canary import RolloutPhase

__all__ = [
    "BadCase",
    "CurvePoint",
    "Matched",
    "SweepConfig",
    "matched",
    "run_sweep",
    "sweep_settings",
    "wilson",
]

Z95 = 1.959963984540054
# Halcyon's own curve: its false-alarm rate besides the policy's own. The rate is a bound for a
# canary *at* its tolerances; an A/A canary sits well inside them, so its measured rate stays
# far below the nominal one and the curve reaches small radii at A/A rates near zero.
HALCYON_RATES = (0.001, 0.05, 0.2, 0.5, 0.9)
# Halcyon's other knob, how fast it walks the healthy steps: shorter windows, and one healthy
# window instead of two (the sequential tests, and so the false-alarm budget, do not depend on
# them; the window guards that hold a canary just past a tolerance do).
HALCYON_WALKS: tuple[tuple[tuple[str, float], ...], ...] = (
    (("window_s", 5.0),),
    (("window_s", 5.0), ("healthy", 1.0)),
)
# The A/A false-rollback rates an operator could live with: "below a rival's curve" is judged
# over the rival's settings up to this rate (and reported over all of them). A setting that
# rolls back more healthy canaries than this catches bad ones fast by rolling back nearly
# everything.
USABLE_FRR = 0.05
# The bar for the A/A rate: Halcyon's curve and each rival's are compared at it too.
TARGET_FRR = 0.01
# The bar for catching bad canaries: a Halcyon setting is on its curve only if it
# catches at least this share of every bad case (a faster walk that lets a slow canary through
# is not a point Halcyon offers).
CATCH_BAR = 0.99
RIVALS = ("flagger", "argo", "original", "fixed-interval")

SWEEPS: dict[str, dict[str, tuple[float, ...]]] = {
    "flagger": {"interval_s": (30.0, 60.0, 120.0), "threshold": (1.0, 2.0, 5.0, 10.0)},
    "argo": {"interval_s": (30.0, 60.0, 120.0), "failure_limit": (0.0, 1.0, 3.0, 5.0)},
    "original": {"window_s": (5.0, 10.0, 20.0, 30.0), "unhealthy": (1.0, 2.0, 3.0)},
    "fixed-interval": {"interval_s": (30.0, 60.0, 120.0), "threshold": (1.0, 2.0, 5.0, 10.0)},
}
QUICK_SWEEPS: dict[str, dict[str, tuple[float, ...]]] = {
    "flagger": {"interval_s": (60.0,), "threshold": (1.0, 5.0)},
    "argo": {"interval_s": (60.0,), "failure_limit": (0.0, 3.0)},
    "original": {"window_s": (10.0,), "unhealthy": (1.0, 2.0)},
    "fixed-interval": {"interval_s": (60.0,), "threshold": (1.0, 5.0)},
}


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial share ``successes / n`` (95 % by default)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def _grid(
    judge: str, axes: dict[str, tuple[float, ...]], extra: tuple[tuple[str, float], ...]
) -> list[JudgeSetting]:
    names = list(axes)
    return [
        JudgeSetting(judge, (*zip(names, values, strict=True), *extra))
        for values in product(*(axes[n] for n in names))
    ]


def sweep_settings(
    *,
    quick: bool = False,
    rival_thresholds: tuple[tuple[str, float], ...] = (),
    halcyon_rates: Sequence[float] = HALCYON_RATES,
) -> tuple[JudgeSetting, ...]:
    """Halcyon's default first, its other false-alarm rates, then every rival's grid.

    ``rival_thresholds`` (e.g. ``(("max_p99_s", 1.0),)``) are added to every Flagger and Argo
    setting: their absolute thresholds, when they should differ from the documented ones.
    """
    settings = [JudgeSetting("halcyon")]
    if not quick:
        settings += [JudgeSetting("halcyon", (("false_alarm_rate", r),)) for r in halcyon_rates]
        settings += [JudgeSetting("halcyon", walk) for walk in HALCYON_WALKS]
    sweeps = QUICK_SWEEPS if quick else SWEEPS
    for judge in RIVALS:
        extra = rival_thresholds if judge in ("flagger", "argo") else ()
        settings += _grid(judge, sweeps[judge], extra)
    return tuple(settings)


@dataclass(frozen=True)
class SweepConfig:
    """The sweep: the simulation, the settings, and how many seeds each case gets."""

    sim: SimConfig = field(default_factory=SimConfig)
    settings: tuple[JudgeSetting, ...] = field(default_factory=sweep_settings)
    aa_seeds: int = 1000  # A/A seeds for Halcyon's default point
    rival_aa_seeds: int = 0  # A/A seeds for every other point (0: sim.seeds)
    other_good: bool = False  # also score the good cases besides A/A (e.g. "faster")
    jobs: int = 1

    @property
    def aa_case(self) -> Case:
        return next(c for c in self.sim.cases if not c.bad)

    def seeds_for(self, setting: JudgeSetting, case: Case) -> int:
        if case is self.aa_case:
            if setting.judge == "halcyon" and not setting.params:
                return self.aa_seeds
            return self.rival_aa_seeds or self.sim.seeds
        return self.sim.seeds if case.bad or self.other_good else 0

    @property
    def total_seeds(self) -> int:
        return max(self.sim.seeds, self.aa_seeds, self.rival_aa_seeds)


Task = tuple[SimConfig, str, int, tuple[tuple[JudgeSetting, tuple[int, ...]], ...]]


def _run_task(task: Task) -> list[RunResult]:
    """One (evidence model, seed): every (setting, case) due on it, in the given order."""
    sim, evidence, seed, plan = task
    source = make_source(evidence, sim.traffic, seed)
    return [simulate(setting, sim.cases[i], source, sim) for setting, cases in plan for i in cases]


def _tasks(config: SweepConfig) -> list[Task]:
    sim = config.sim
    tasks: list[Task] = []
    for evidence in sim.evidence:
        for k in range(config.total_seeds):
            plan = tuple(
                (s, cases)
                for s in config.settings
                if (
                    cases := tuple(i for i, c in enumerate(sim.cases) if k < config.seeds_for(s, c))
                )
            )
            if plan:
                tasks.append((sim, evidence, sim.first_seed + k, plan))
    return tasks


@dataclass(frozen=True)
class BadCase:
    """A bad case's score at one setting."""

    seeds: int
    caught: float
    promoted: float
    blast_p50: float
    blast_p95: float

    def as_json(self) -> dict[str, Any]:
        return {
            "seeds": self.seeds,
            "caught": self.caught,
            "promoted": self.promoted,
            "blast_radius_p50": self.blast_p50,
            "blast_radius_p95": self.blast_p95,
        }


@dataclass(frozen=True)
class CurvePoint:
    """One (evidence model, judge setting): its A/A rate and what each bad case cost."""

    evidence: str
    setting: JudgeSetting
    aa_seeds: int
    aa_rollbacks: int
    aa_reasons: dict[str, int]
    bad: dict[str, BadCase]
    good: dict[str, float]  # other good cases: share rolled back

    @property
    def judge(self) -> str:
        return self.setting.judge

    @property
    def frr(self) -> float:
        return self.aa_rollbacks / self.aa_seeds if self.aa_seeds else 0.0

    @property
    def frr_interval(self) -> tuple[float, float]:
        return wilson(self.aa_rollbacks, self.aa_seeds)

    def as_json(self) -> dict[str, Any]:
        lo, hi = self.frr_interval
        return {
            "kind": "point",
            "evidence": self.evidence,
            "judge": self.judge,
            "setting": self.setting.label,
            "params": dict(self.setting.params),
            "aa_seeds": self.aa_seeds,
            "aa_false_rollback": self.frr,
            "aa_false_rollback_ci95": [lo, hi],
            "aa_rollback_reasons": self.aa_reasons,
            "bad": {name: b.as_json() for name, b in self.bad.items()},
            "good_rolled_back": self.good,
        }


def _bad_case(results: Sequence[RunResult]) -> BadCase:
    blast = np.array([r.blast_radius for r in results], dtype=np.float64)
    n = len(results)
    return BadCase(
        seeds=n,
        caught=sum(r.phase is RolloutPhase.ROLLED_BACK for r in results) / n,
        promoted=sum(r.phase is RolloutPhase.PROMOTED for r in results) / n,
        blast_p50=float(np.quantile(blast, 0.5)),
        blast_p95=float(np.quantile(blast, 0.95)),
    )


def run_sweep(
    config: SweepConfig, *, on_task: Callable[[int, int], None] | None = None
) -> list[CurvePoint]:
    """Every (evidence model, setting) scored; points in evidence-then-setting order."""
    tasks = _tasks(config)
    results: dict[tuple[str, JudgeSetting, int], list[RunResult]] = {}

    def gather(task: Task, out: list[RunResult]) -> None:
        flat = iter(out)
        for setting, cases in task[3]:
            for i in cases:
                results.setdefault((task[1], setting, i), []).append(next(flat))

    if config.jobs <= 1:
        for done, task in enumerate(tasks, start=1):
            gather(task, _run_task(task))
            if on_task is not None:
                on_task(done, len(tasks))
    else:
        # One task at a time: tasks are coarse (a seed of every setting) and uneven (the
        # batched models cost ten times the independent one), so chunks would balance badly.
        with ProcessPoolExecutor(max_workers=config.jobs) as pool:
            for done, (task, out) in enumerate(
                zip(tasks, pool.map(_run_task, tasks), strict=True), start=1
            ):
                gather(task, out)
                if on_task is not None:
                    on_task(done, len(tasks))
    sim, aa = config.sim, config.aa_case
    points = []
    for evidence in sim.evidence:
        for setting in config.settings:
            aa_runs = results.get((evidence, setting, sim.cases.index(aa)), [])
            rollbacks = [r for r in aa_runs if r.phase is RolloutPhase.ROLLED_BACK]
            bad, good = {}, {}
            for i, case in enumerate(sim.cases):
                runs = results.get((evidence, setting, i), [])
                if case.bad and runs:
                    bad[case.name] = _bad_case(runs)
                elif case is not aa and runs:
                    good[case.name] = sum(r.phase is RolloutPhase.ROLLED_BACK for r in runs) / len(
                        runs
                    )
            points.append(
                CurvePoint(
                    evidence=evidence,
                    setting=setting,
                    aa_seeds=len(aa_runs),
                    aa_rollbacks=len(rollbacks),
                    aa_reasons=dict(sorted(Counter(r.reason for r in rollbacks).items())),
                    bad=bad,
                    good=good,
                )
            )
    return points


@dataclass(frozen=True)
class Matched:
    """Halcyon against one rival on one bad case and evidence model, at a matched A/A rate."""

    evidence: str
    rival: str
    case: str
    halcyon_frr: float
    halcyon_frr_hi: float
    halcyon_caught: float
    halcyon_blast_p50: float
    best: CurvePoint | None  # at <= Halcyon's point estimate
    best_at_hi: CurvePoint | None  # at <= Halcyon's Wilson upper bound
    dominated: int  # rival settings beaten by some Halcyon point at an equal or lower rate
    settings: int
    dominated_usable: int  # the same, among the rival settings at A/A <= USABLE_FRR
    usable: int  # rival settings at A/A <= USABLE_FRR
    dominated_target: int  # the same, among the rival settings at A/A <= TARGET_FRR
    at_target: int  # rival settings at A/A <= TARGET_FRR
    curve_halcyon: CurvePoint | None  # Halcyon's best point at A/A <= TARGET_FRR
    curve_rival: CurvePoint | None  # the rival's best at A/A <= TARGET_FRR

    def curve_ratio(self) -> float | None:
        """Halcyon's curve over the rival's, both at their best at A/A <= TARGET_FRR."""
        if self.curve_halcyon is None or self.curve_rival is None:
            return None
        rival = self.curve_rival.bad[self.case].blast_p50
        mine = self.curve_halcyon.bad[self.case].blast_p50
        return mine / rival if rival > 0 else math.inf

    def ratio(self, point: CurvePoint | None) -> float | None:
        if point is None:
            return None
        rival = point.bad[self.case].blast_p50
        return self.halcyon_blast_p50 / rival if rival > 0 else math.inf

    def as_json(self) -> dict[str, Any]:
        def side(point: CurvePoint | None) -> dict[str, Any] | None:
            if point is None:
                return None
            return {
                "setting": point.setting.label,
                "aa_false_rollback": point.frr,
                "caught": point.bad[self.case].caught,
                "blast_radius_p50": point.bad[self.case].blast_p50,
                "halcyon_over_rival": self.ratio(point),
            }

        return {
            "kind": "matched",
            "evidence": self.evidence,
            "rival": self.rival,
            "case": self.case,
            "halcyon_aa_false_rollback": self.halcyon_frr,
            "halcyon_aa_false_rollback_ci95_hi": self.halcyon_frr_hi,
            "halcyon_caught": self.halcyon_caught,
            "halcyon_blast_radius_p50": self.halcyon_blast_p50,
            "at_point_estimate": side(self.best),
            "at_upper_bound": side(self.best_at_hi),
            "dominated": self.dominated,
            "settings": self.settings,
            "dominated_at_target": self.dominated_target,
            "settings_at_target": self.at_target,
            "dominated_usable": self.dominated_usable,
            "usable_settings": self.usable,
            "usable_frr": USABLE_FRR,
            "curve_at_target": {
                "target_frr": TARGET_FRR,
                "halcyon": None if self.curve_halcyon is None else self.curve_halcyon.setting.label,
                "rival": None if self.curve_rival is None else self.curve_rival.setting.label,
                "halcyon_over_rival": self.curve_ratio(),
            },
        }


def _best(points: Iterable[CurvePoint], case: str, limit: float) -> CurvePoint | None:
    eligible = [p for p in points if p.frr <= limit + 1e-12 and case in p.bad]
    if not eligible:
        return None
    return min(eligible, key=lambda p: (p.bad[case].blast_p50, p.frr))


def matched(points: Sequence[CurvePoint]) -> list[Matched]:
    """Per evidence model, rival and bad case: the rival's best setting at Halcyon's A/A rate."""
    out = []
    for evidence in dict.fromkeys(p.evidence for p in points):
        here = [p for p in points if p.evidence == evidence]
        default = next((p for p in here if p.judge == "halcyon" and not p.setting.params), None)
        if default is None:
            continue
        # Halcyon's curve: its settings that meet the catch bar on every bad case.
        halcyons = [
            p
            for p in here
            if p.judge == "halcyon" and all(b.caught >= CATCH_BAR for b in p.bad.values())
        ]
        for rival in dict.fromkeys(p.judge for p in here if p.judge != "halcyon"):
            mine = [p for p in here if p.judge == rival]
            for case in default.bad:

                def beaten(
                    r: CurvePoint, case: str = case, halcyons: list[CurvePoint] = halcyons
                ) -> bool:
                    return any(
                        h.frr <= r.frr + 1e-12 and h.bad[case].blast_p50 < r.bad[case].blast_p50
                        for h in halcyons
                    )

                usable = [r for r in mine if r.frr <= USABLE_FRR + 1e-12]
                at_target = [r for r in mine if r.frr <= TARGET_FRR + 1e-12]
                out.append(
                    Matched(
                        evidence=evidence,
                        rival=rival,
                        case=case,
                        halcyon_frr=default.frr,
                        halcyon_frr_hi=default.frr_interval[1],
                        halcyon_caught=default.bad[case].caught,
                        halcyon_blast_p50=default.bad[case].blast_p50,
                        best=_best(mine, case, default.frr),
                        best_at_hi=_best(mine, case, default.frr_interval[1]),
                        dominated=sum(map(beaten, mine)),
                        settings=len(mine),
                        dominated_usable=sum(map(beaten, usable)),
                        usable=len(usable),
                        dominated_target=sum(map(beaten, at_target)),
                        at_target=len(at_target),
                        curve_halcyon=_best(halcyons, case, TARGET_FRR),
                        curve_rival=_best(mine, case, TARGET_FRR),
                    )
                )
    return out
