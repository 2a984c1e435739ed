"""What one ``halcyon loadtest`` run measured: :class:`Tally`, and per SLO class
:class:`ClassTally`.

The load generator (:mod:`halcyon.tools.loadtest_driver`) fills these as answers arrive;
the report (:mod:`halcyon.tools.loadtest_report`) and the ``--slo`` verdicts
(:mod:`halcyon.tools.loadtest_slo`) read them. They live apart from both so that the counting
rules (what is a request, an attempt, a refusal, a late answer) are written down once, and
:func:`_quantile` (nearest rank) is the one quantile every figure and every objective is taken
with.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ClassTally:
    """One SLO class's requests: offered (begun, or dropped by the open-loop client), how
    they ended, and the latencies of its successes."""

    offered: int = 0
    ok: int = 0
    on_time: int = 0
    refused: int = 0  # ended with a Halcyon refusal: never admitted
    late: int = 0  # admitted, then answered after its deadline or DEADLINE_EXCEEDED
    lost: int = 0
    client_dropped: int = 0
    latencies_ms: list[float] = field(default_factory=list)


@dataclass
class Tally:
    """Everything measured during a run; one per process, merged at the end.

    ``outcomes`` has one entry per request (its final answer: ``OK``, ``CODE/REASON`` for a
    Halcyon rejection, the bare ``CODE`` for a lost one); ``rejected`` counts every rejected
    *attempt* by reason, so with retries it shows how often the server said no.
    """

    started: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    # End-to-end latency minus the device time the worker reported: what the serving path
    # (client hop, gateway, worker RPC) adds on top of the model itself.
    added_ms: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    batch_sizes: list[int] = field(default_factory=list)
    hedged: int = 0
    sent: int = 0  # attempts, retries included
    client_dropped: int = 0
    on_time: int = 0
    lost: int = 0
    retries: int = 0
    unfinished: int = 0  # retry due after the end of the run: neither answered nor lost
    rejected: Counter[str] = field(default_factory=Counter)
    # timeline[s]: attempt outcomes in second s of the run ("ok", "on_time", "lost",
    # "rejected/REASON").
    timeline: list[Counter[str]] = field(default_factory=list)
    # Per SLO class (the --mix, in its order; empty when built by hand, e.g. in tests).
    classes: list[ClassTally] = field(default_factory=list)
    refused: int = 0  # requests that ended with a refusal at admission (see ADMITTED_FAILURES)
    admitted_late: int = 0
    # With several --target gateways: requests that ended, and successes, per gateway (empty
    # with one target).
    by_target: Counter[str] = field(default_factory=Counter)
    ok_by_target: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> int:
        return self.outcomes.get("OK", 0)

    @property
    def requests(self) -> int:
        """Requests that ended, however they ended."""
        return sum(self.outcomes.values())

    @property
    def answered(self) -> int:
        """Requests that ended with a Halcyon answer (OK or a Halcyon rejection)."""
        return self.requests - self.lost

    def mark(self, second: int, *labels: str) -> None:
        while len(self.timeline) <= second:
            self.timeline.append(Counter())
        bucket = self.timeline[second]
        for label in labels:
            bucket[label] += 1


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]
