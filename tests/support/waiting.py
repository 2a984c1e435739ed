"""Waiting in tests: poll a condition until it holds, fail with what was awaited if it never does.

What it decides: that a test waits on a condition with a timeout, never a fixed sleep, and that
a timeout says what was awaited, for how long, and what the condition last returned (or the
last transient error it raised). :func:`wait_until` polls from a thread, :func:`wait_until_async`
from an event loop (it yields to the loop between polls); both share :class:`_Poll`, so the
two cannot drift apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until", "wait_until_async"]

T = TypeVar("T")


class _Poll:
    """One wait: the deadline, what the probe last gave, and the message on giving up."""

    def __init__(
        self,
        timeout_s: float,
        what: str,
        transient: tuple[type[BaseException], ...],
        details: Callable[[], str] | None,
    ) -> None:
        self.timeout_s = timeout_s
        self.what = what
        self.transient = transient
        self.details = details
        self.deadline = time.monotonic() + timeout_s
        self.last: object = None

    def attempt(self, probe: Callable[[], T | None]) -> T | None:
        """The probe's value when truthy (done); None to poll again, or an AssertionError."""
        try:
            value = probe()
        except self.transient as exc:
            value, self.last = None, exc
        else:
            if value:
                return value
            self.last = value
        if time.monotonic() > self.deadline:
            extra = f"\n{self.details()}" if self.details is not None else ""
            raise AssertionError(
                f"timed out after {self.timeout_s} s waiting for {self.what} "
                f"(last: {self.last!r}){extra}"
            )
        return None


def wait_until(
    probe: Callable[[], T | None],
    timeout_s: float = 5.0,
    what: str = "the condition",
    *,
    interval_s: float = 0.02,
    transient: tuple[type[BaseException], ...] = (),
    check: Callable[[], None] | None = None,
    details: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy (returned); fail after ``timeout_s``.

    ``transient`` exceptions from the probe count as "not yet" (the last one is reported);
    ``check`` runs before every poll and may fail the wait at once (a process that died);
    ``details`` is added to the timeout's message (logs).
    """
    poll = _Poll(timeout_s, what, transient, details)
    while True:
        if check is not None:
            check()
        value = poll.attempt(probe)
        if value is not None:
            return value
        time.sleep(interval_s)


async def wait_until_async(
    probe: Callable[[], T | None],
    timeout_s: float = 5.0,
    what: str = "the condition",
    *,
    interval_s: float = 0.005,
    transient: tuple[type[BaseException], ...] = (),
    check: Callable[[], None] | None = None,
    details: Callable[[], str] | None = None,
) -> T:
    """:func:`wait_until` inside an event loop: the loop runs between polls."""
    poll = _Poll(timeout_s, what, transient, details)
    while True:
        if check is not None:
            check()
        value = poll.attempt(probe)
        if value is not None:
            return value
        await asyncio.sleep(interval_s)
