"""The benchmark's request traces: the published workload, its variants, and recorded traces.

What this decides: which requests arrive when, how large they are and how long they may take.
Every strategy in a benchmark run is driven by the *same* trace, so a difference in the table is
a difference in scheduling, never in luck.

The default reproduces the published workload bit for bit: mulberry32 seeded 0xC0FFEE, Poisson
arrivals over 120 s, and per request exactly three kinds of draw in a fixed order (the gap, a
Box–Muller normal from two uniforms, then the cohort). Changing the order of draws, the clamp
or the rounding would silently produce a different trace, which is why tests pin its
fingerprint (count, token sum, urgent count) and a checksum.

Variants keep that per-request draw order and change only parameters, so a seed/rate pair still
names one trace. On/off ("bursty") arrivals modulate the rate with a *separate* generator, so
the request stream itself stays comparable with the Poisson one.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.rng import Mulberry32

URGENT = "urgent"
RELAXED = "relaxed"

Arrivals = Literal["poisson", "bursty"]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One offered request. Times are milliseconds from the start of the trace."""

    index: int
    arrival_ms: float
    tokens: int
    deadline_ms: float
    cohort: str


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Parameters of a synthetic trace. The defaults are the published workload."""

    rate: float
    duration_s: float = 120.0
    seed: int = 0xC0FFEE
    urgent_share: float = 0.3
    urgent_slo_ms: float = 120.0
    relaxed_slo_ms: float = 900.0
    size_mu: float = 4.8
    size_sigma: float = 0.9
    min_tokens: int = 16
    max_tokens: int = 4096
    arrivals: Arrivals = "poisson"
    # On/off modulation for ``arrivals="bursty"``: the "on" phase runs at ``burst_factor`` times
    # the mean rate and the "off" phase at whatever keeps the long-run mean equal to ``rate``.
    burst_factor: float = 2.0
    burst_on_ms: float = 2_000.0
    burst_off_ms: float = 2_000.0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.duration_s <= 0:
            raise ValueError(f"duration must be positive, got {self.duration_s}")
        if not 0.0 <= self.urgent_share <= 1.0:
            raise ValueError(f"urgent share must be in [0, 1], got {self.urgent_share}")
        if self.min_tokens < 1 or self.max_tokens < self.min_tokens:
            raise ValueError("token clamp must satisfy 1 <= min <= max")
        if self.arrivals == "bursty":
            on_share = self.burst_on_ms / (self.burst_on_ms + self.burst_off_ms)
            if self.burst_factor * on_share > 1.0:
                raise ValueError("burst factor too high: the off phase would need a negative rate")


def round_half_up(x: float) -> int:
    """JavaScript ``Math.round``: halves round toward +infinity (Python's ``round`` is banker's)."""
    return math.floor(x + 0.5)


def build_trace(spec: WorkloadSpec) -> list[TraceRequest]:
    """Draws the trace described by ``spec``; the defaults reproduce the published one exactly."""
    draw = Mulberry32(spec.seed).random
    duration_ms = spec.duration_s * 1000.0
    mean_gap_ms = 1000.0 / spec.rate
    phase = _BurstPhases(spec) if spec.arrivals == "bursty" else None
    trace: list[TraceRequest] = []
    t = 0.0
    two_pi = 2.0 * math.pi
    while True:
        # Draw 1: the gap. Exponential gaps make a Poisson process; under on/off modulation the
        # same unit-rate draw is stretched through the piecewise rate (a time change), which
        # keeps one uniform per gap and so the same draw order as the Poisson trace.
        e = -math.log(1.0 - draw())
        t = phase.advance(t, e) if phase is not None else t + e * mean_gap_ms
        if t >= duration_ms:
            break
        # Draws 2 and 3: a Box–Muller normal (u guarded away from zero).
        u = max(1e-12, draw())
        v = draw()
        z = math.sqrt(-2.0 * math.log(u)) * math.cos(two_pi * v)
        magnitude = math.exp(spec.size_mu + spec.size_sigma * z)
        tokens = max(spec.min_tokens, min(spec.max_tokens, round_half_up(magnitude)))
        # Draw 4: the cohort.
        if draw() < spec.urgent_share:
            cohort, slo = URGENT, spec.urgent_slo_ms
        else:
            cohort, slo = RELAXED, spec.relaxed_slo_ms
        trace.append(TraceRequest(len(trace), t, tokens, t + slo, cohort))
    return trace


class _BurstPhases:
    """Piecewise-constant arrival rate alternating on/off, starting with an "on" phase.

    ``advance(t, e)`` returns the time at which ``e`` units of unit-rate exponential mass have
    accumulated after ``t`` — the inverse of the integrated rate — so one uniform still makes
    one gap.
    """

    def __init__(self, spec: WorkloadSpec) -> None:
        period = spec.burst_on_ms + spec.burst_off_ms
        on_share = spec.burst_on_ms / period
        per_ms = spec.rate / 1000.0
        self._on_ms = spec.burst_on_ms
        self._period = period
        self._on_rate = per_ms * spec.burst_factor
        self._off_rate = per_ms * (1.0 - spec.burst_factor * on_share) / (1.0 - on_share)

    def advance(self, t: float, e: float) -> float:
        while True:
            offset = t % self._period
            if offset < self._on_ms:
                rate, left = self._on_rate, self._on_ms - offset
            else:
                rate, left = self._off_rate, self._period - offset
            if rate > 0.0 and e <= rate * left:
                return t + e / rate
            e -= rate * left
            t += left


@dataclass(frozen=True, slots=True)
class TraceFingerprint:
    """What identifies a trace at a glance: size, total work and urgent count."""

    requests: int
    total_tokens: int
    urgent: int
    last_arrival_ms: float


def fingerprint(trace: Sequence[TraceRequest]) -> TraceFingerprint:
    return TraceFingerprint(
        requests=len(trace),
        total_tokens=sum(r.tokens for r in trace),
        urgent=sum(1 for r in trace if r.cohort == URGENT),
        last_arrival_ms=trace[-1].arrival_ms if trace else 0.0,
    )


def checksum(trace: Iterable[TraceRequest]) -> str:
    """SHA-256 over every request's exact fields (floats by their shortest round-trip repr)."""
    h = hashlib.sha256()
    for r in trace:
        h.update(f"{r.arrival_ms!r},{r.tokens},{r.deadline_ms!r},{r.cohort}\n".encode())
    return h.hexdigest()


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Reads JSON lines ``{"arrival_ms", "tokens", "deadline_ms", "cohort"}``, sorted by arrival.

    ``deadline_ms`` is absolute (same timeline as ``arrival_ms``). ``cohort`` is free text;
    ``"urgent"`` counts toward the urgent column and anything else toward the relaxed one.
    """
    rows: list[tuple[float, int, float, str]] = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
                arrival = float(obj["arrival_ms"])
                tokens = int(obj["tokens"])
                deadline = float(obj["deadline_ms"])
                cohort = str(obj.get("cohort", RELAXED))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a trace record ({exc})") from exc
            if tokens < 1 or deadline < arrival or not math.isfinite(arrival):
                raise ValueError(f"{path}:{number}: needs tokens >= 1 and deadline >= arrival")
            rows.append((arrival, tokens, deadline, cohort))
    rows.sort(key=lambda row: row[0])
    return [TraceRequest(i, a, n, d, c) for i, (a, n, d, c) in enumerate(rows)]


def dump_trace(trace: Iterable[TraceRequest], path: str | Path) -> None:
    """Writes a trace in the ``--trace`` format, so a synthetic trace can be edited and replayed."""
    with Path(path).open("w", encoding="utf-8") as handle:
        for r in trace:
            record = {
                "arrival_ms": r.arrival_ms,
                "tokens": r.tokens,
                "deadline_ms": r.deadline_ms,
                "cohort": r.cohort,
            }
            handle.write(json.dumps(record) + "\n")
