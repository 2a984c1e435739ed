"""Injectable time sources.

Policy code never reads the wall clock: it asks a ``Clock`` for ``now()`` in seconds on a
monotonic timeline. Servers pass ``MonotonicClock``; tests and the simulator pass
``ManualClock`` and move time explicitly, so policy tests never sleep and never flake.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A monotonic time source in seconds. Only differences between readings are meaningful."""

    def now(self) -> float: ...


class MonotonicClock:
    """The process's monotonic clock (``time.monotonic``)."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: for tests and discrete-event simulation."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (never backward) and return the new reading."""
        if seconds < 0:
            raise ValueError(f"a clock cannot move backward (advance by {seconds})")
        self._now += seconds
        return self._now

    def set(self, t: float) -> None:
        """Jump to absolute time ``t``; must not be earlier than the current reading."""
        if t < self._now:
            raise ValueError(f"a clock cannot move backward ({t} < {self._now})")
        self._now = float(t)
