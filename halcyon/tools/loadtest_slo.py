"""``halcyon loadtest --slo``: objectives, and how a run is judged against them.

:func:`parse_slo` reads ``METRIC=TARGET[,...]`` into :class:`Objective` terms (latency quantiles
at most a duration, ``success``/``goodput`` at least a percentage, targets kept exact as
fractions); :func:`judge` turns one run into a :class:`Verdict` per objective and
:func:`verdict_line` prints it. Apart from the run itself so that what PASS means (both exactly
at the target pass; a run with no successful request fails every latency objective) does not
depend on how the load was driven.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from halcyon.tools.loadtest_tally import _quantile

# --slo: latency quantiles (at most a duration) and rates (at least a percentage).
SLO_QUANTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p999": 0.999}
SLO_RATES = {
    "success": "answered OK, of the requests that ended",
    "goodput": "answered OK within their deadline, of the requests that ended",
}
_DURATION_UNITS_MS = {
    "us": Fraction(1, 1000),
    "µs": Fraction(1, 1000),
    "ms": Fraction(1),
    "s": Fraction(1000),
}


@dataclass(frozen=True)
class Objective:
    """One term of ``--slo``: a latency quantile at most ``target`` ms, or a rate (``success``,
    ``goodput``) at least ``target`` percent. ``text`` is the term as given."""

    metric: str
    target: Fraction  # milliseconds for a quantile, percent for a rate
    text: str

    @property
    def is_latency(self) -> bool:
        return self.metric in SLO_QUANTILES


def _exact(number: str) -> Fraction | None:
    """A plain decimal number (digits, one optional point) exactly, or None."""
    if not number or number.strip() != number or not all(c.isdigit() or c == "." for c in number):
        return None
    try:
        value = Fraction(Decimal(number))
    except (InvalidOperation, ValueError):
        return None
    return value


def parse_slo(text: str) -> list[Objective]:
    """``METRIC=TARGET[,...]``: ``p50|p90|p95|p99|p999=<number>us|ms|s`` and
    ``success|goodput=<number>%`` (0 < percent <= 100), each metric at most once.

    Raises ValueError naming the term that is wrong and what was expected.
    """
    objectives: list[Objective] = []
    known = ", ".join([*SLO_QUANTILES, *SLO_RATES])
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            raise ValueError(f"empty objective in {text!r}; expected e.g. p99=200ms,success=99.9%")
        metric, sep, value = (part.strip() for part in term.partition("="))
        if not sep or not metric:
            raise ValueError(f"{term!r}: not METRIC=TARGET, e.g. p99=200ms or success=99.9%")
        if metric not in SLO_QUANTILES and metric not in SLO_RATES:
            raise ValueError(f"{term!r}: unknown metric {metric!r}; known: {known}")
        if any(o.metric == metric for o in objectives):
            raise ValueError(f"{term!r}: {metric} given twice")
        if metric in SLO_QUANTILES:
            unit = next((u for u in ("us", "µs", "ms", "s") if value.endswith(u)), None)
            number = _exact(value[: -len(unit)]) if unit else None
            if unit is None or number is None or number <= 0:
                raise ValueError(
                    f"{term!r}: {metric} needs a positive duration with a unit (us, ms or s), "
                    f"e.g. {metric}=200ms"
                )
            target = number * _DURATION_UNITS_MS[unit]
        else:
            number = _exact(value[:-1]) if value.endswith("%") else None
            if number is None or not 0 < number <= 100:
                raise ValueError(
                    f"{term!r}: {metric} needs a percentage in (0, 100] with a % sign, "
                    f"e.g. {metric}=99.9%"
                )
            target = number
        objectives.append(Objective(metric, target, term))
    return objectives


@dataclass(frozen=True)
class Verdict:
    """How one objective fared: ``measured`` in the objective's unit (ms or percent; None when
    nothing was measured: no successful request, or no request at all)."""

    objective: Objective
    measured: float | None
    passed: bool
    count: tuple[int, int] | None = None  # for a rate: (meeting it, requests)


def judge(
    objectives: Sequence[Objective], latencies_ms: Sequence[float], report: dict[str, Any]
) -> list[Verdict]:
    """Each objective against one run: ``latencies_ms`` are the successful requests' latencies
    (any order), ``report`` what :func:`summarize` returned. A quantile passes when it is at
    most its target, a rate when it is at least its target; both exactly at the target pass."""
    ordered = sorted(latencies_ms)
    requests = int(report["requests"])
    verdicts = []
    for o in objectives:
        if o.is_latency:
            value = _quantile(ordered, SLO_QUANTILES[o.metric]) if ordered else None
            verdicts.append(Verdict(o, value, value is not None and value <= o.target))
            continue
        meeting = int(report["ok"] if o.metric == "success" else report["on_time"])
        if not requests:
            verdicts.append(Verdict(o, None, False, (meeting, requests)))
            continue
        # Exact: 999 of 1000 meets 99.9%, whatever binary floating point makes of 99.9.
        passed = Fraction(meeting * 100, requests) >= o.target
        verdicts.append(Verdict(o, 100.0 * meeting / requests, passed, (meeting, requests)))
    return verdicts


def verdict_line(v: Verdict) -> str:
    """``  SLO p99 <= 200ms        measured 12.40 ms                     PASS``."""
    o = v.objective
    value = o.text.partition("=")[2].strip()
    if o.is_latency:
        goal = f"{o.metric} <= {value}"
        measured = "no successful request" if v.measured is None else f"{v.measured:.2f} ms"
    else:
        goal = f"{o.metric} >= {value}"
        meeting, requests = v.count or (0, 0)
        measured = (
            "no request ended"
            if v.measured is None
            else f"{v.measured:.3f}% ({meeting} of {requests})"
        )
    return f"  SLO {goal:<18s} measured {measured:<30s} {'PASS' if v.passed else 'FAIL'}"
