"""``halcyon bench --scenario quotas``: the figures of each quota strategy, and their table.

What it decides: how a run is judged, and how it is shown.

* **Steady admitted / contract**: in steady state (not the first ``settle_s``, not within
  ``settle_s`` after a gateway joins or leaves, not during the outage or within ``settle_s``
  after it) and only while the tenant's offered rate (the model's intensity) is at least
  110 % of its contract: admitted requests over ``contract x time``. 1.00 is exact.
* **Overshoot**: over every 5 s sliding window of the run (churn and outage included), what
  the fleet admitted beyond what one exact bucket holding the whole contract could ever admit
  in 5 s (``rate x 5 s + burst``), as a share of ``rate x 5 s``. 0 for a perfect enforcer,
  whatever the burst. The peak raw 5 s rate over the contract is shown beside it.
* **Refused under quota**: of the requests offered while the tenant's offered rate was below
  its contract, the share refused — outside the outage, and during it separately. The target
  is judged on the worst tenant; all tenants pooled is shown beside it.
* The over-time rows: admitted over contract per slice of the run, one character each.

Output is deterministic: same seed and flags, same bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import numpy as np
import numpy.typing as npt

from bench.markdown import markdown_table
from bench.quota_sim import STRATEGIES, Series, replay
from bench.quota_world import Scenario, default_scenario, generate

__all__ = ["StrategyFigures", "TenantFigures", "figures", "quotas_main", "report"]

WINDOW_S = 5.0
OVER_QUOTA = 1.1
SPARK = " ▁▂▃▄▅▆▇█"
"""Admitted over contract: ``▄`` is 1.0, ``█`` is 2.0 or more."""
SPARK_SLICES = 30
QUICK_DURATION_S = 120.0
TARGETS = {"steady": 0.05, "overshoot": 0.10, "refused": 0.02}


@dataclass(frozen=True)
class TenantFigures:
    tenant: str
    offered: float
    """Mean offered rate over the contract, whole run."""
    steady: float | None
    """Steady admitted / contract while over quota; None if never over quota when steady."""
    overshoot: float
    peak: float
    refused_under: float | None
    refused_outage: float | None
    under_counts: tuple[int, int]
    """(refused, offered) while under quota outside the outage: for the fleet-wide figure."""
    spark: str


@dataclass(frozen=True)
class StrategyFigures:
    strategy: str
    tenants: tuple[TenantFigures, ...]

    @property
    def steady_error(self) -> float:
        errors = [abs(t.steady - 1.0) for t in self.tenants if t.steady is not None]
        return max(errors, default=0.0)

    @property
    def overshoot(self) -> float:
        return max(t.overshoot for t in self.tenants)

    def _pooled(self, values: Sequence[float | None]) -> float:
        return max((v for v in values if v is not None), default=0.0)

    @property
    def refused_under(self) -> float:
        return self._pooled([t.refused_under for t in self.tenants])

    @property
    def refused_under_pooled(self) -> float:
        """All tenants' under-quota refusals over all their under-quota requests."""
        refused = sum(t.under_counts[0] for t in self.tenants)
        offered = sum(t.under_counts[1] for t in self.tenants)
        return refused / offered if offered else 0.0

    @property
    def refused_outage(self) -> float:
        return self._pooled([t.refused_outage for t in self.tenants])

    def meets_targets(self) -> bool:
        return (
            self.steady_error <= TARGETS["steady"]
            and self.overshoot <= TARGETS["overshoot"]
            and self.refused_under <= TARGETS["refused"]
        )


def _masks(scenario: Scenario) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """(steady, outage) per tick."""
    t = np.arange(scenario.ticks) * scenario.tick_s
    settle = scenario.settle_s
    steady = t >= settle
    for event in scenario.churn_times():
        steady &= ~((t >= event) & (t < event + settle))
    start, end = scenario.outage
    steady &= ~((t >= start) & (t < end + settle))
    return steady, (t >= start) & (t < end)


def _share(refused: float, offered: float) -> float | None:
    return refused / offered if offered > 0 else None


def _spark(admitted: npt.NDArray[np.int64], rate: float, scenario: Scenario) -> str:
    chars = []
    for chunk in np.array_split(admitted, SPARK_SLICES):
        ratio = chunk.sum() / (rate * len(chunk) * scenario.tick_s)
        chars.append(SPARK[min(len(SPARK) - 1, round(ratio * 4))])
    return "".join(chars)


def figures(scenario: Scenario, series: Series) -> StrategyFigures:
    steady, outage = _masks(scenario)
    dt = scenario.tick_s
    width = round(WINDOW_S / dt)
    rows = []
    for k, spec in enumerate(scenario.tenants):
        offered = series.offered[k]
        admitted = series.admitted[k]
        refused = offered - admitted
        over = steady & (series.intensity[k] >= OVER_QUOTA * spec.rate)
        steady_ratio = admitted[over].sum() / (spec.rate * over.sum() * dt) if over.any() else None
        windows = np.convolve(admitted, np.ones(width, dtype=np.int64), mode="valid")
        allowed = spec.rate * WINDOW_S
        overshoot = max(0.0, float(windows.max() - allowed - spec.burst) / allowed)
        under = series.intensity[k] < spec.rate
        calm = under & ~outage
        rows.append(
            TenantFigures(
                tenant=spec.name,
                offered=float(offered.sum()) / (spec.rate * scenario.duration_s),
                steady=None if steady_ratio is None else float(steady_ratio),
                overshoot=overshoot,
                peak=float(windows.max()) / allowed,
                refused_under=_share(refused[calm].sum(), offered[calm].sum()),
                refused_outage=_share(refused[under & outage].sum(), offered[under & outage].sum()),
                under_counts=(int(refused[calm].sum()), int(offered[calm].sum())),
                spark=_spark(admitted, spec.rate, scenario),
            )
        )
    return StrategyFigures(series.strategy, tuple(rows))


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


_TENANT_COLUMNS = (
    ("strategy", "{}"),
    ("tenant", "{}"),
    ("offered/contract", "{:.2f}"),
    ("steady adm/contract", "{}"),
    ("overshoot", "{}"),
    ("peak 5 s", "{:.2f}"),
    ("refused under quota", "{}"),
    ("same, in outage", "{}"),
)
_SUMMARY_COLUMNS = (
    ("strategy", "{}"),
    ("worst steady error", "{}"),
    ("worst overshoot", "{}"),
    ("refused under quota: worst tenant", "{}"),
    ("all tenants", "{}"),
    ("worst tenant, in outage", "{}"),
    ("meets targets", "{}"),
)


def describe(scenario: Scenario, seed: int) -> str:
    start, end = scenario.outage
    return (
        f"Quota benchmark — {scenario.initial_gateways} gateways, "
        f"{len(scenario.joins)} join and {len(scenario.leaves)} crash, "
        f"{len(scenario.tenants)} tenants with Zipf-skewed clients, hot spot moves "
        f"{len(scenario.hot_spot_moves)}×; {scenario.duration_s:g} s in "
        f"{scenario.tick_s:g} s ticks, seed {seed:#x}; controller down {start:g}–{end:g} s. "
        f"Targets for leases: steady within {TARGETS['steady']:.0%}, overshoot ≤ "
        f"{TARGETS['overshoot']:.0%} (beyond rate×{WINDOW_S:g} s + burst, any {WINDOW_S:g} s), "
        f"refused under quota ≤ {TARGETS['refused']:.0%} (outside the outage)."
    )


def report(scenario: Scenario, seed: int, results: Sequence[StrategyFigures]) -> str:
    tenant_rows = [
        (
            r.strategy,
            t.tenant,
            t.offered,
            _ratio(t.steady),
            _pct(t.overshoot),
            t.peak,
            _pct(t.refused_under),
            _pct(t.refused_outage),
        )
        for r in results
        for t in r.tenants
    ]
    summary_rows = [
        (
            r.strategy,
            _pct(r.steady_error),
            _pct(r.overshoot),
            _pct(r.refused_under),
            _pct(r.refused_under_pooled),
            _pct(r.refused_outage),
            "yes" if r.meets_targets() else "no",
        )
        for r in results
    ]
    slice_s = scenario.duration_s / SPARK_SLICES
    width = max(len(r.strategy) for r in results)
    names = max(len(t.name) for t in scenario.tenants)
    spark_rows = [
        f"{r.strategy.ljust(width)}  {t.tenant.ljust(names)}  |{t.spark}|"
        for r in results
        for t in r.tenants
    ]
    return "\n".join(
        [
            describe(scenario, seed),
            "",
            markdown_table(_SUMMARY_COLUMNS, summary_rows, left={0}),
            "",
            markdown_table(_TENANT_COLUMNS, tenant_rows, left={0, 1}),
            "",
            f"Admitted / contract over time, one character per {slice_s:g} s "
            f"(▄ = 1×, █ = 2× or more):",
            "",
            "```",
            *spark_rows,
            "```",
        ]
    )


def run_all(scenario: Scenario, seed: int) -> list[StrategyFigures]:
    """Every strategy on one world (generated once: the same arrivals for all)."""
    ticks = list(generate(scenario, seed))
    return [figures(scenario, replay(name, scenario, ticks)) for name in STRATEGIES]


def quotas_main(seed: int, quick: bool, out: TextIO = sys.stdout) -> int:
    """``halcyon bench --scenario quotas``; ``--quick`` runs the same story in 120 s."""
    scenario = default_scenario()
    if quick:
        scenario = scenario.scaled(QUICK_DURATION_S)
    out.write(report(scenario, seed, run_all(scenario, seed)) + "\n")
    return 0
