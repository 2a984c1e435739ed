"""Priority-graded shedding: which requests the concurrency limit turns away first.

What it decides: whether one more request of a given priority may start, given the
limiter's current limit and inflight count, and if not, how long until it likely could.

Each priority may fill only its share of the limit (critical 100 %, standard 85 %,
sheddable 60 % by default). As load rises, inflight crosses the sheddable line first, so
sheddable traffic is refused while standard and critical still get in; critical traffic is
refused only at the full limit. Below the lowest line nobody is refused.

The retry-after is a prediction, not a constant: with ``inflight`` requests in flight taking
``latency`` each, about ``inflight / latency`` finish per second, and the caller needs
``excess = inflight - allowed + 1`` of them to finish before it fits, so
``retry_after = excess x latency / inflight`` (clamped to ``[min_retry_s, max_retry_s]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.admission.tenants import Priority

__all__ = ["DEFAULT_SHARES", "Overloaded", "PriorityShedder"]

DEFAULT_SHARES: Mapping[Priority, float] = MappingProxyType(
    {Priority.CRITICAL: 1.0, Priority.STANDARD: 0.85, Priority.SHEDDABLE: 0.6}
)


@dataclass(frozen=True)
class Overloaded:
    """A request refused by the fleet limit (``UNAVAILABLE`` / ``OVERLOADED``)."""

    priority: Priority
    limit: int
    inflight: int
    allowed: int
    """How many requests this priority may have in flight under the current limit."""
    retry_after_s: float
    reason: str = "OVERLOADED"
    """The ``ErrorInfo.reason`` (``common.errors.Reason`` value)."""


@dataclass(frozen=True)
class PriorityShedder:
    shares: Mapping[Priority, float] = field(default_factory=lambda: DEFAULT_SHARES)
    min_retry_s: float = 0.01
    max_retry_s: float = 30.0

    def __post_init__(self) -> None:
        missing = set(Priority) - set(self.shares)
        if missing:
            raise ValueError(f"no share for priorities {sorted(p.value for p in missing)}")
        ordered = [self.shares[p] for p in sorted(Priority, key=lambda p: p.rank)]
        if any(not 0.0 < s <= 1.0 for s in ordered):
            raise ValueError("shares must be in (0, 1]")
        if ordered != sorted(ordered, reverse=True):
            raise ValueError("a less important priority cannot have a larger share")
        if not 0.0 < self.min_retry_s <= self.max_retry_s:
            raise ValueError("need 0 < min_retry_s <= max_retry_s")

    def allowed(self, priority: Priority, limit: int) -> int:
        """In-flight requests ``priority`` may fill: ``floor(limit x share)``, at least 1."""
        return max(1, math.floor(limit * self.shares[priority] + 1e-9))

    def admits(self, priority: Priority, inflight: int, limit: int) -> bool:
        return inflight < self.allowed(priority, limit)

    def check(
        self, priority: Priority, inflight: int, limit: int, latency_s: float
    ) -> Overloaded | None:
        """None if a request of ``priority`` may start, else the refusal with retry advice."""
        allowed = self.allowed(priority, limit)
        if inflight < allowed:
            return None
        excess = inflight - allowed + 1
        retry = excess * latency_s / max(inflight, 1)
        retry = min(self.max_retry_s, max(self.min_retry_s, retry))
        return Overloaded(priority, limit, inflight, allowed, retry)
