"""Fault injection: failures a test or a demo can produce on demand instead of waiting for.

What it decides: for each batch, whether the device fails fast (after ``fail_fast_ms``, as a
``DEVICE_FAULT``), hangs until cancelled, or runs normally — and by how much a normal run is
slowed. Seeded, so a chaos run is reproducible. Fail is drawn before hang; each rate is drawn
only when non-zero, so turning faults off leaves no trace in the random stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from common.rng import Rng

__all__ = ["FaultInjector", "FaultKind", "FaultPlan"]


class FaultKind(Enum):
    """What happens to one batch."""

    NONE = "none"
    FAIL = "fail"
    HANG = "hang"


@dataclass(frozen=True)
class FaultPlan:
    """The injector's decision for one batch."""

    kind: FaultKind
    fail_after_s: float = 0.0
    slowdown: float = 1.0


class FaultInjector:
    """Decides per batch: fail fast, hang, or run (slowed down by ``slowdown``)."""

    def __init__(
        self,
        *,
        fail_rate: float = 0.0,
        fail_fast_ms: float = 2.0,
        slowdown: float = 1.0,
        hang_rate: float = 0.0,
        rng: Rng,
    ) -> None:
        for name, rate in (("fail_rate", fail_rate), ("hang_rate", hang_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate}")
        if fail_fast_ms < 0:
            raise ValueError("fail_fast_ms must be >= 0")
        if slowdown <= 0:
            raise ValueError("slowdown must be > 0")
        self.fail_rate = fail_rate
        self.fail_fast_ms = fail_fast_ms
        self.slowdown = slowdown
        self.hang_rate = hang_rate
        self._rng = rng

    @property
    def active(self) -> bool:
        return self.fail_rate > 0 or self.hang_rate > 0 or self.slowdown != 1.0

    def plan(self) -> FaultPlan:
        if self.fail_rate > 0 and self._rng.random() < self.fail_rate:
            return FaultPlan(FaultKind.FAIL, fail_after_s=self.fail_fast_ms / 1000.0)
        if self.hang_rate > 0 and self._rng.random() < self.hang_rate:
            return FaultPlan(FaultKind.HANG)
        return FaultPlan(FaultKind.NONE, slowdown=self.slowdown)
