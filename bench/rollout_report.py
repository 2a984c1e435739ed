"""The rollout sweep's report: curve tables, matched-rate tables, the figures, the plot.

What it decides: how :mod:`bench.rollout_curves`' points are shown — one Markdown curve table
and one matched-rate table per evidence model, a line saying which of the issue's figures are
met, JSON lines for machines, and an optional plot (median blast radius against A/A
false-rollback rate, log-y, one line per judge: a rival's line is its best blast radius at or
below each rate, Halcyon's starred). Output on stdout is the same bytes for the same
flags; timings and progress go to stderr only.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import TextIO

import numpy as np

from bench.markdown import markdown_table
from bench.rollout_curves import (
    CATCH_BAR,
    TARGET_FRR,
    USABLE_FRR,
    CurvePoint,
    Matched,
    SweepConfig,
    matched,
    run_sweep,
)
from bench.rollout_rivals import describe_rival
from bench.rollout_sim import describe, make_source

__all__ = [
    "curve_table",
    "curves_main",
    "figures",
    "matched_table",
    "plot_curves",
    "points_table",
    "report",
]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def points_table(points: Sequence[CurvePoint]) -> str:
    """One row per setting: A/A rate with its interval, then caught / blast per bad case."""
    bad = list(dict.fromkeys(name for p in points for name in p.bad))
    good = list(dict.fromkeys(name for p in points for name in p.good))
    columns: list[tuple[str, str]] = [
        ("judge", "{}"),
        ("setting", "{}"),
        ("A/A seeds", "{:d}"),
        ("A/A false rollback [95% CI]", "{}"),
        ("A/A rollback reasons", "{}"),
    ]
    for name in bad:
        columns += [(f"{name}: caught", "{}"), ("blast p50", "{:.0f}"), ("p95", "{:.0f}")]
    columns += [(f"{name}: rolled back", "{}") for name in good]
    rows = []
    for p in points:
        lo, hi = p.frr_interval
        reasons = ", ".join(f"{k} {v}" for k, v in p.aa_reasons.items()) or "-"
        row: list[object] = [
            p.judge,
            p.setting.label,
            p.aa_seeds,
            f"{_pct(p.frr)} [{_pct(lo)}, {_pct(hi)}]",
            reasons,
        ]
        for name in bad:
            b = p.bad[name]
            row += [_pct(b.caught), b.blast_p50, b.blast_p95]
        row += [_pct(p.good[name]) for name in good]
        rows.append(row)
    return markdown_table(columns, rows, left={0, 1, 4})


def matched_table(rows: Sequence[Matched]) -> str:
    """One row per (rival, bad case): the rival's best setting at Halcyon's A/A rate."""

    def side(m: Matched, point: CurvePoint | None, limit: float) -> list[object]:
        if point is None:
            return [f"no setting at <= {_pct(limit)}", "-", "-", "-"]
        ratio = m.ratio(point)
        return [
            f"{point.setting.label} ({_pct(point.frr)})",
            _pct(point.bad[m.case].caught),
            f"{point.bad[m.case].blast_p50:.0f}",
            "-" if ratio is None else f"{ratio:.3f}",
        ]

    columns = (
        ("rival", "{}"),
        ("bad case", "{}"),
        ("halcyon A/A", "{}"),
        ("halcyon caught", "{}"),
        ("halcyon blast p50", "{:.0f}"),
        ("rival best at <= halcyon's rate", "{}"),
        ("caught", "{}"),
        ("blast p50", "{}"),
        ("halcyon / rival", "{}"),
        ("best at <= halcyon's CI upper", "{}"),
        ("caught", "{}"),
        ("blast p50", "{}"),
        ("halcyon / rival", "{}"),
        (f"dominated (A/A <= {_pct(TARGET_FRR)})", "{}"),
        (f"dominated (A/A <= {_pct(USABLE_FRR)})", "{}"),
        ("dominated (all)", "{}"),
    )
    body = [
        [
            m.rival,
            m.case,
            _pct(m.halcyon_frr),
            _pct(m.halcyon_caught),
            m.halcyon_blast_p50,
            *side(m, m.best, m.halcyon_frr),
            *side(m, m.best_at_hi, m.halcyon_frr_hi),
            f"{m.dominated_target}/{m.at_target}",
            f"{m.dominated_usable}/{m.usable}",
            f"{m.dominated}/{m.settings}",
        ]
        for m in rows
    ]
    return markdown_table(columns, body, left={0, 1, 5, 9})


def curve_table(rows: Sequence[Matched]) -> str:
    """One row per (rival, bad case): Halcyon's curve against the rival's at A/A <= 1 %."""

    def side(point: CurvePoint | None, case: str) -> list[object]:
        if point is None:
            return [f"no setting at <= {_pct(TARGET_FRR)}", "-", "-"]
        return [
            f"{point.setting.label} ({_pct(point.frr)})",
            _pct(point.bad[case].caught),
            f"{point.bad[case].blast_p50:.0f}",
        ]

    columns = (
        ("rival", "{}"),
        ("bad case", "{}"),
        ("halcyon's best at <= 1 %", "{}"),
        ("caught", "{}"),
        ("blast p50", "{}"),
        ("rival's best at <= 1 %", "{}"),
        ("caught", "{}"),
        ("blast p50", "{}"),
        ("halcyon / rival", "{}"),
    )
    body = [
        [
            m.rival,
            m.case,
            *side(m.curve_halcyon, m.case),
            *side(m.curve_rival, m.case),
            "-" if (r := m.curve_ratio()) is None else f"{r:.3f}",
        ]
        for m in rows
    ]
    return markdown_table(columns, body, left={0, 1, 2, 5})


def figures(rows: Sequence[Matched]) -> str:
    """The issue's figures for one evidence model, met or not, from its matched rows."""
    if not rows:
        return "No Halcyon default point: no figures."
    first = rows[0]
    caught = min(m.halcyon_caught for m in rows)
    ratios = [r for m in rows if (r := m.ratio(m.best)) is not None]
    unmatched = sorted({m.rival for m in rows if m.best is None})
    worst = max(ratios) if ratios else None
    curve_ratios = [r for m in rows if (r := m.curve_ratio()) is not None]
    worst_curve = max(curve_ratios) if curve_ratios else None
    above_target = [
        f"{m.rival}/{m.case} {m.dominated_target}/{m.at_target}"
        for m in rows
        if m.dominated_target < m.at_target
    ]
    above_usable = [
        f"{m.rival}/{m.case} {m.dominated_usable}/{m.usable}"
        for m in rows
        if m.dominated_usable < m.usable
    ]
    above = [
        f"{m.rival}/{m.case} {m.dominated}/{m.settings}" for m in rows if m.dominated < m.settings
    ]
    frr, hi = first.halcyon_frr, first.halcyon_frr_hi
    return (
        f"Figures: Halcyon A/A false rollback {_pct(frr)}, 95 % upper {_pct(hi)} (target <= "
        f"1 %: {'met' if frr <= 0.01 else 'not met'}, upper bound "
        f"{'met' if hi <= 0.01 else 'not met'}); bad canaries caught at least {_pct(caught)} "
        f"(target >= 99 %: {'met' if caught >= 0.99 else 'not met'}); worst Halcyon / "
        "best-rival median blast radius at a matched rate "
        + ("-" if worst is None else f"{worst:.3f}")
        + f" (target <= 0.333: {'met' if worst is not None and worst <= 1 / 3 else 'not met'}"
        + (f"; no rival setting that careful: {', '.join(unmatched)}" if unmatched else "")
        + "); along Halcyon's curve, its best point against each rival's best, both at A/A <= "
        + f"{_pct(TARGET_FRR)}: worst "
        + ("-" if worst_curve is None else f"{worst_curve:.3f}")
        + f" ({'met' if worst_curve is not None and worst_curve <= 1 / 3 else 'not met'}). "
        + f"Below every rival's curve up to {_pct(TARGET_FRR)} A/A: "
        + (
            "yes"
            if not above_target
            else "no — rival settings not beaten: " + ", ".join(above_target)
        )
        + f"; up to {_pct(USABLE_FRR)}: "
        + (
            "yes"
            if not above_usable
            else "no — rival settings not beaten: " + ", ".join(above_usable)
        )
        + "; over every rival setting: "
        + ("yes" if not above else "no — not beaten: " + ", ".join(above))
        + "."
    )


def aa_p99_ms(config: SweepConfig, evidence: str, share: float = 0.5) -> float:
    """The A/A canary's p99 over the horizon at ``share`` (first seed): the rivals' headroom."""
    sim = config.sim
    source = make_source(evidence, sim.traffic, sim.first_seed)
    values = [
        np.asarray(source.evidence(config.aa_case, s, share)[1].latencies_s, dtype=np.float64)
        for s in range(sim.horizon_s)
    ]
    return 1000.0 * float(np.quantile(np.concatenate(values), 0.99))


def report(config: SweepConfig, points: Sequence[CurvePoint]) -> str:
    """The Markdown report: inputs, one curve table and one matched table per evidence model."""
    sim = config.sim
    lines = [
        describe(sim),
        "",
        f"Sweep: A/A {config.aa_seeds} seeds for Halcyon's default, "
        f"{config.rival_aa_seeds or sim.seeds} for every other setting; {sim.seeds} seeds per "
        f"bad case; A/A case {config.aa_case.name!r}. Halcyon 'default' is the policy above; "
        "a rival's setting names its knobs (the rest as below). Blast radius of a bad canary "
        "promoted = what it served until promotion + all traffic for the rest of the horizon.",
        "",
        *(f"* {describe_rival(r)}" for r in ("flagger", "argo")),
        "* original: Halcyon's steps; fixed windows (default 10 s), >= 20 requests/arm, the "
        "relative error and p95 guards; 2 healthy windows in a row advance, `unhealthy` "
        "(default 2) unhealthy in a row roll back",
        "* fixed-interval: Halcyon's steps; one relative check (error tolerance, p95 ratio) per "
        "interval (default 60 s); threshold (default 5) failed checks in all roll back",
    ]
    table = matched(points)
    for evidence in sim.evidence:
        here = [p for p in points if p.evidence == evidence]
        lines += [
            "",
            f"## Evidence model: {evidence}",
            "",
            f"A/A canary p99 at 50 % share (seed {sim.first_seed:#x}, whole horizon): "
            f"{aa_p99_ms(config, evidence):.0f} ms.",
            "",
            points_table(here),
            "",
            f"### Matched false-rollback rate: {evidence}",
            "",
            matched_table([m for m in table if m.evidence == evidence]),
            "",
            f"### Along Halcyon's curve, at A/A <= {_pct(TARGET_FRR)}: {evidence}",
            "",
            curve_table([m for m in table if m.evidence == evidence]),
            "",
            figures([m for m in table if m.evidence == evidence]),
        ]
    return "\n".join(lines) + "\n"


def plot_curves(points: Sequence[CurvePoint], path: str) -> None:
    """Median blast radius against A/A false-rollback rate; one panel per (evidence, case)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evidences = list(dict.fromkeys(p.evidence for p in points))
    cases = list(dict.fromkeys(name for p in points for name in p.bad))
    fig, axes = plt.subplots(
        len(evidences), len(cases), figsize=(5 * len(cases), 4 * len(evidences)), squeeze=False
    )
    judges = list(dict.fromkeys(p.judge for p in points))
    for row, evidence in enumerate(evidences):
        for col, case in enumerate(cases):
            ax = axes[row][col]
            for judge in judges:
                mine = sorted(
                    (p for p in points if p.evidence == evidence and p.judge == judge),
                    key=lambda p: (p.frr, p.bad[case].blast_p50),
                )
                xs = [100 * p.frr for p in mine]
                ys = [max(1.0, p.bad[case].blast_p50) for p in mine]
                # The curve is the judge's best blast radius at or below each rate; Halcyon's
                # runs through its settings that meet the catch bar only (as in the tables).
                on_curve = [
                    judge != "halcyon" or all(b.caught >= CATCH_BAR for b in p.bad.values())
                    for p in mine
                ]
                frontier_x, frontier_y, best = [], [], math.inf
                for x, y, on in zip(xs, ys, on_curve, strict=True):
                    if on and y < best:
                        best = y
                        frontier_x.append(x)
                        frontier_y.append(y)
                star = judge == "halcyon"
                (line,) = ax.plot(
                    frontier_x,
                    frontier_y,
                    marker="*" if star else "o",
                    markersize=14 if star else 6,
                    linewidth=2.4 if star else 1.5,
                    label=judge,
                )
                ax.scatter(xs, ys, s=40 if star else 12, color=line.get_color(), alpha=0.5)
            ax.set_yscale("log")
            ax.set_xscale("symlog", linthresh=1.0)  # 0-1 % linear, where the careful live
            ax.set_xlim(-0.05, 105.0)
            ax.set_xticks([0.0, 1.0, 10.0, 100.0], ["0", "1", "10", "100"])
            ax.set_xlabel("A/A false rollback (%)")
            ax.set_ylabel("median blast radius (requests)")
            ax.set_title(f"{evidence} · {case}")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_main(
    config: SweepConfig,
    as_json: bool,
    out: TextIO,
    err: TextIO,
    *,
    progress: bool = False,
    plot: str | None = None,
) -> int:
    """Runs the sweep and prints the report (or JSON lines); timing goes to ``err``."""
    started = time.perf_counter()

    def on_task(done: int, total: int) -> None:
        if progress:
            err.write(f"\r  (evidence, seed) {done}/{total}\x1b[K")
            err.flush()

    points = run_sweep(config, on_task=on_task)
    if progress:
        err.write("\r\x1b[K")
    if as_json:
        for point in points:
            out.write(json.dumps(point.as_json()) + "\n")
        for row in matched(points):
            out.write(json.dumps(row.as_json()) + "\n")
    else:
        out.write(report(config, points))
    if plot:
        plot_curves(points, plot)
        err.write(f"plot written to {plot}\n")
    err.write(
        f"{len(points)} (evidence, setting) points, {config.total_seeds} seeds at most, "
        f"{config.jobs} jobs, in {time.perf_counter() - started:.1f} s\n"
    )
    return 0
