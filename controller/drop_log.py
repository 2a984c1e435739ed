"""A warning about dropped outcome items that cannot flood the log.

What it decides: when a gateway sends malformed outcomes, the operator needs to hear about it
(the evidence a canary is judged on is shrinking), but a misbehaving gateway may send thousands
a second. :class:`DropLog` logs the first occurrence at once and then at most one line per
``interval_s``, carrying the counts by reason accumulated since the previous line and an
example of what was wrong. Clock-injected.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from common.clock import Clock

__all__ = ["DropLog"]


class DropLog:
    """Rate-limited warning about outcome items the controller did not count."""

    def __init__(self, logger: logging.Logger, clock: Clock, *, interval_s: float = 10.0) -> None:
        self._log = logger
        self._clock = clock
        self._interval_s = interval_s
        self._next_at: float | None = None
        self._pending: Counter[str] = Counter()
        self._example: str | None = None
        self._gateway = ""
        self.lines = 0

    def record(self, gateway_id: str, dropped: Mapping[str, int], example: str | None) -> None:
        """Note the items one report lost; log now if the interval has passed."""
        if not dropped:
            return
        self._pending.update(dropped)
        if self._example is None:
            self._example, self._gateway = example, gateway_id
        now = self._clock.now()
        if self._next_at is not None and now < self._next_at:
            return
        self._log.warning(
            "dropped malformed outcome items; the rest of each report was counted",
            extra={
                "dropped": dict(sorted(self._pending.items())),
                "gateway_id": self._gateway,
                "example": self._example,
                "next_summary_in_s": self._interval_s,
            },
        )
        self.lines += 1
        self._next_at = now + self._interval_s
        self._pending.clear()
        self._example = None
