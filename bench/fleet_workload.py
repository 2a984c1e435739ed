"""Requests and device timing for the fleet simulations.

What it decides: when requests arrive (open-loop Poisson), how big they are, their deadlines,
and how long a replica takes to serve one.

* Sizes follow the benchmark workload's distribution: ``tokens = clamp(round(exp(4.8 + 0.9 z)),
  16, 4096)`` with ``z`` standard normal (Box-Muller); 30 % of requests are urgent (deadline
  arrival + 120 ms), the rest relaxed (arrival + 900 ms).
* A replica of speed ``s`` serves ``tokens`` in ``(18 ms + 0.022 ms x tokens) / s``, times a
  uniform +-8 % jitter; with probability ``stall_p`` the execution also stalls (a noisy
  neighbour, a page-in) and takes ``stall_factor`` times as long. Stalls are what hedging is
  for: they are independent of the request, so a second replica is likely to be fast.

Everything draws from an injected :class:`~common.rng.Rng`, one stream per purpose, so the
arrival trace is the same whichever routing strategy consumes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.rng import Rng

__all__ = [
    "DeviceModel",
    "Request",
    "mean_tokens",
    "poisson_trace",
]

INTERCEPT_S = 0.018
SLOPE_S = 0.000022
URGENT_SHARE = 0.3
URGENT_DEADLINE_S = 0.120
RELAXED_DEADLINE_S = 0.900


@dataclass(frozen=True)
class Request:
    rid: int
    arrival: float
    tokens: int
    deadline: float
    urgent: bool


def _tokens_from_z(z: float) -> int:
    return min(4096, max(16, math.floor(math.exp(4.8 + 0.9 * z) + 0.5)))


def _normal(rng: Rng) -> float:
    u = max(1e-12, rng.random())
    v = rng.random()
    return math.sqrt(-2.0 * math.log(u)) * math.cos(2.0 * math.pi * v)


def mean_tokens() -> float:
    """E[tokens] of the size distribution, by quadrature over z (no sampling noise)."""
    n = 4000
    lo, hi = -8.0, 8.0
    h = (hi - lo) / n
    total = 0.0
    for i in range(n + 1):
        z = lo + i * h
        w = 0.5 if i in (0, n) else 1.0
        pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
        total += w * pdf * min(4096.0, max(16.0, math.exp(4.8 + 0.9 * z)))
    return total * h


def poisson_trace(rng: Rng, rate: float, duration_s: float) -> list[Request]:
    """Open-loop Poisson arrivals at ``rate`` per second over ``[0, duration_s)``."""
    if rate <= 0.0:
        return []
    out: list[Request] = []
    t = 0.0
    while True:
        t += -math.log(1.0 - rng.random()) / rate
        if t >= duration_s:
            return out
        tokens = _tokens_from_z(_normal(rng))
        urgent = rng.random() < URGENT_SHARE
        deadline = t + (URGENT_DEADLINE_S if urgent else RELAXED_DEADLINE_S)
        out.append(Request(len(out), t, tokens, deadline, urgent))


@dataclass(frozen=True)
class DeviceModel:
    """Service time of one request on a replica of a given speed."""

    jitter: float = 0.08
    stall_p: float = 0.02
    stall_factor: float = 5.0

    def nominal_s(self, tokens: float, speed: float) -> float:
        return (INTERCEPT_S + SLOPE_S * tokens) / speed

    def mean_s(self, speed: float) -> float:
        """Expected service time of an average request (jitter averages out)."""
        stall = 1.0 + self.stall_p * (self.stall_factor - 1.0)
        return self.nominal_s(mean_tokens(), speed) * stall

    def sample_s(self, rng: Rng, tokens: int, speed: float) -> float:
        t = self.nominal_s(tokens, speed) * (1.0 + (2.0 * rng.random() - 1.0) * self.jitter)
        if rng.random() < self.stall_p:
            t *= self.stall_factor
        return t
