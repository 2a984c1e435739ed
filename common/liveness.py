"""Liveness: whether a server's data path still makes progress, judged off its event loop.

What it decides: when the ``liveness`` health name turns NOT_SERVING (so that an orchestrator
restarts the process), and when it turns back. Liveness must not fail because the loop is busy
serving — a busy loop still runs each ready callback within milliseconds — yet must fail when
the data path is wedged. So it is judged on progress, not on answering a probe quickly:

* **the event loop runs**: a watchdog thread posts a no-op callback to the loop and notes when
  it ran; one still pending after ``limit_s`` means nothing on the loop has run for that long
  (a handler blocked it, a deadlock, a C call that never returns);
* **each completion-queue pump takes its events** (``common.raw_unary``): while the loop holds
  a queue with events waiting, it must take from it at least every ``limit_s``;
* **no pump has failed** for good (its queue cannot be polled, no call can be requested).

The judgement (:func:`judge`) is pure; :class:`LivenessWatchdog` runs it on its own thread every
``limit_s / 4`` (at most every second) and reports changes. The thread needs the GIL only for a
few microseconds per check, which a busy loop yields every few milliseconds, so the verdict —
and a probe server answering from its own threads (``common.health.ProbeServer``) — stays
current while the loop is saturated, and even while it is wedged.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LIVE", "LivenessWatchdog", "Pump", "Verdict", "judge"]


@dataclass(frozen=True)
class Verdict:
    """Live or not, and (when not) why, in words an operator can act on."""

    live: bool
    reason: str = ""


LIVE = Verdict(True)


class Pump(Protocol):
    """What the watchdog reads off a completion-queue endpoint (from its own thread)."""

    @property
    def method(self) -> str: ...

    @property
    def failure(self) -> str | None: ...

    def stalled_since(self) -> float | None: ...


# (method, failure or None, stalled since (monotonic) or None)
PumpState = tuple[str, str | None, float | None]


def judge(
    now: float, limit_s: float, loop_waiting_since: float | None, pumps: Iterable[PumpState]
) -> Verdict:
    """The verdict from what was observed at ``now`` (monotonic seconds).

    ``loop_waiting_since``: when the pending loop beat was posted (None: none pending).
    """
    states = list(pumps)
    for method, failure, _ in states:
        if failure is not None:
            return Verdict(False, f"{method}: {failure}")
    if loop_waiting_since is not None and now - loop_waiting_since > limit_s:
        return Verdict(
            False, f"the event loop has run nothing for {now - loop_waiting_since:.1f} s"
        )
    for method, _, since in states:
        if since is not None and now - since > limit_s:
            return Verdict(
                False, f"{method}: calls waiting on the completion queue for {now - since:.1f} s"
            )
    return LIVE


class LivenessWatchdog:
    """A daemon thread that judges the loop's and the pumps' progress and reports changes.

    ``on_change`` is called on the watchdog's thread with each new verdict.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        pumps: Sequence[Pump],
        limit_s: float,
        on_change: Callable[[Verdict], None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit_s <= 0:
            raise ValueError(f"the stall limit must be positive, got {limit_s}")
        self.loop = loop
        self._pumps = tuple(pumps)
        self.limit_s = limit_s
        self._on_change = on_change
        self._clock = clock
        self._interval_s = max(0.02, min(1.0, limit_s / 4))
        self._beat_posted_at: float | None = None
        self.verdict = LIVE
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="liveness-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop judging (the thread ends within one interval; not joined)."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            if not self.check():
                return

    def check(self) -> bool:
        """One judgement; False once the loop is closed (nothing left to watch)."""
        now = self._clock()
        if self._beat_posted_at is None:
            self._beat_posted_at = now
            try:
                self.loop.call_soon_threadsafe(self._beat)
            except RuntimeError:  # the loop is closed
                return False
        verdict = judge(
            now,
            self.limit_s,
            self._beat_posted_at,
            ((p.method, p.failure, p.stalled_since()) for p in self._pumps),
        )
        # A change is a flip of live; the reason's figures change every check.
        if verdict.live != self.verdict.live and not self._stopped.is_set():
            self.verdict = verdict
            self._on_change(verdict)
        return True

    def _beat(self) -> None:
        self._beat_posted_at = None
