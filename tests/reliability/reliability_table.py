"""The reliability suite's one table: how every request of a scenario ended, and what it shows.

What it decides — the definitions the table's columns stand for, in one place:

* An outcome is a ``halcyon loadtest`` outcome key: ``OK``, ``CODE/REASON`` (a gRPC status
  whose ``google.rpc.Status`` carried a Halcyon ``ErrorInfo`` reason), or a bare ``CODE`` (a
  status without one: a transport failure, a client-side ``DEADLINE_EXCEEDED`` because no
  answer came in time, a gRPC-core ``CANCELLED``, an ``UNKNOWN`` from an unhandled exception).
* **answered** = ``OK`` plus every Halcyon status. **lost** = everything else: a request with
  no answer, or whose answer is not a Halcyon status. Every scenario must lose none.
* **goodput** = requests answered ``OK`` within their deadline (counted from their first
  attempt), per second of load.
* **sheds by reason** = attempts answered with a Halcyon status other than ``OK``, by
  ``ErrorInfo.reason`` (with retrying clients one request can be shed several times).
* **recovery** (:func:`recovery_time`) = the time from the fault until the success rate
  (``OK`` / attempts ended, per 1 s window of the load's timeline) is back within 5 % of its
  pre-fault level for good: the end of the last window after the fault that falls short (a
  window in which nothing ended counts as short), minus the fault's time. 0 when no window
  falls short; ``not recovered`` when the load's last window still does.

Pure: no processes, no clocks; unit-tested in ``test_reliability_table.py``.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK = "OK"
# Recovery: back within this fraction of the pre-fault success rate.
RECOVERY_TOLERANCE = 0.05


def reason_of(outcome: str) -> str | None:
    """The Halcyon ``ErrorInfo`` reason in an outcome key (``CODE/REASON``), else None."""
    _code, sep, reason = outcome.partition("/")
    return reason if sep and reason else None


def is_answer(outcome: str) -> bool:
    """``OK`` or a Halcyon status: the request got an answer a client can act on."""
    return outcome == OK or reason_of(outcome) is not None


def lost_outcomes(outcomes: Mapping[str, int]) -> dict[str, int]:
    """The outcomes that are not answers, with their counts."""
    return {k: n for k, n in outcomes.items() if n and not is_answer(k)}


def sheds_by_reason(outcomes: Mapping[str, int]) -> dict[str, int]:
    """Halcyon statuses other than OK, summed by reason (most frequent first)."""
    by_reason: Counter[str] = Counter()
    for outcome, n in outcomes.items():
        reason = reason_of(outcome)
        if reason is not None and n:
            by_reason[reason] += n
    return dict(by_reason.most_common())


@dataclass(frozen=True)
class Window:
    """One second of a load's timeline: the attempts that ended in [start_s, start_s + 1)."""

    start_s: float
    ok: int
    ended: int

    @property
    def success_rate(self) -> float:
        return self.ok / self.ended if self.ended else 0.0


def windows_from_timeline(timeline: Iterable[Mapping[str, Any]]) -> list[Window]:
    """``halcyon loadtest --json``'s ``timeline`` (per second: ``t``, ``ok``, ``rejected`` by
    reason, ``lost``) as windows."""
    return [
        Window(
            float(row["t"]),
            int(row["ok"]),
            int(row["ok"]) + sum(int(n) for n in row["rejected"].values()) + int(row["lost"]),
        )
        for row in timeline
    ]


def success_rate(windows: Iterable[Window]) -> float:
    """OK / ended over several windows (0 if nothing ended)."""
    ok = ended = 0
    for w in windows:
        ok += w.ok
        ended += w.ended
    return ok / ended if ended else 0.0


def recovery_time(
    windows: Sequence[Window],
    fault_at_s: float,
    *,
    window_s: float = 1.0,
    tolerance: float = RECOVERY_TOLERANCE,
) -> float:
    """Seconds from the fault until the success rate is back within ``tolerance`` of its
    pre-fault level for the rest of the load; ``math.inf`` if the last window falls short.

    ``windows`` are consecutive, ``window_s`` long, and cover the load (times relative to its
    start, as is ``fault_at_s``). The pre-fault level is the success rate over the windows that
    end by the fault; there must be at least one.
    """
    before = [w for w in windows if w.start_s + window_s <= fault_at_s]
    if not before:
        raise ValueError(f"no full window before the fault at {fault_at_s:.2f} s")
    floor = (1.0 - tolerance) * success_rate(before)
    after = [w for w in windows if w.start_s + window_s > fault_at_s]
    short = [w for w in after if w.ended == 0 or w.success_rate < floor]
    if not short:
        return 0.0
    if short[-1] is after[-1]:
        return math.inf
    return max(0.0, short[-1].start_s + window_s - fault_at_s)


@dataclass
class Row:
    """One scenario's line in the table. ``recovery_s`` None: the scenario injects no fault
    (or measures no timeline); ``math.inf``: not recovered by the end of the load."""

    scenario: str
    requests: int
    answered: int
    goodput_rps: float | None = None
    p99_ms: float | None = None
    sheds: dict[str, int] = field(default_factory=dict)
    recovery_s: float | None = None
    # How the lost requests ended (bare gRPC code -> count), for the footnote.
    lost_detail: dict[str, int] = field(default_factory=dict)
    # The scenario's own properties that did not hold (empty: all held).
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.requests - self.answered

    @property
    def passed(self) -> bool:
        return not self.failures and self.lost == 0


def _number(value: float | None, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _recovery(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "not recovered"
    return f"{value:.1f} s"


SHOWN_REASONS = 3
# Footnotes (failed properties, lost requests, notes) are wrapped to this width.
NOTE_WIDTH = 100


def _sheds(sheds: Mapping[str, int]) -> str:
    """The most frequent reasons (the rest summed), so the table stays readable."""
    ranked = sorted(sheds.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{reason} {n:,}" for reason, n in ranked[:SHOWN_REASONS]) or "-"
    if len(ranked) > SHOWN_REASONS:
        text += (
            f", {len(ranked) - SHOWN_REASONS} more {sum(n for _, n in ranked[SHOWN_REASONS:]):,}"
        )
    return text


COLUMNS = (
    "scenario", "requests", "answered", "lost", "goodput/s", "p99 ms", "sheds by reason",
    "recovery", "property",
)  # fmt: skip
_RIGHT = {"requests", "answered", "lost", "goodput/s", "p99 ms", "recovery"}


def render(rows: Sequence[Row]) -> str:
    """The table, fixed width, then one line per failed property and per note."""
    cells = [
        [
            r.scenario,
            f"{r.requests:,}",
            f"{r.answered:,}",
            f"{r.lost:,}",
            _number(r.goodput_rps, ".1f"),
            _number(r.p99_ms, ".0f"),
            _sheds(r.sheds),
            _recovery(r.recovery_s),
            "holds" if r.passed else "FAILS",
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if name in _RIGHT else v.ljust(w)
            for name, v, w in zip(COLUMNS, values, widths, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(COLUMNS), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    for r in rows:
        notes = [(f"{failure}", "*") for failure in r.failures]
        if r.lost:
            detail = ", ".join(f"{k} {n:,}" for k, n in r.lost_detail.items())
            notes.insert(0, (f"{r.lost:,} lost" + (f" ({detail})" if detail else ""), "*"))
        notes += [(note, " ") for note in r.notes]
        for text, mark in notes:
            out += textwrap.wrap(
                f"{mark} {r.scenario}: {text}",
                width=NOTE_WIDTH,
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
    return "\n".join(out)
