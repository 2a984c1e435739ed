"""How a serving process's threads are scheduled: the loop thread's timer slack, and which
threads may preempt it.

What it decides, first: which of the process's threads may preempt the thread that runs the
event loop. A gateway or worker is one Python thread doing the decisions (it holds the GIL for
almost all of its work) plus helpers that need no GIL: gRPC's event-engine pool reading and
writing sockets, its timer and lifeguard threads, the completion-queue poller, the metrics
server.
Under load those helpers wake thousands of times a second; with the default policy each wake-up
on the loop's CPU preempts the loop mid-request, and on a 2-core VM the context switches cost
more than the socket work they were woken for (``finish_task_switch`` was the hottest kernel
symbol in the gateway's profile).

So every thread except the loop's is switched to ``SCHED_BATCH``: a woken helper still runs at
once on an idle CPU, and gets its fair share of a busy one, but no longer preempts the loop on
wake-up; it runs when the loop's slice ends or the loop blocks. Measured on the gateway at
~4,300 Infer/s (zero device time, 52 clients): 0.18 ms of CPU per request instead of
0.20–0.23, more throughput and a lower p99; at light load, no change beyond the noise. The
gateway does this by default; a worker does not, because on a shared machine its
batch-scheduled I/O threads wait behind the gateway's loop (ADR 0007).

Threads appear after start-up (gRPC grows its pool under load, ``asyncio.to_thread`` starts
executor threads), so the scan repeats on a timer. Only Linux has ``SCHED_BATCH``; elsewhere,
or where the process may not change it, nothing happens.

Second, the loop thread's timer slack. Each time the loop finds the completion queue empty
(``common.raw_unary``), gRPC's core waits on a futex with a zero timeout. Linux delays such a
timer by the thread's slack, 50 µs by default, so every empty poll stalled the loop for
~80 µs of wall time; it is ~20 µs with 1 ns of slack. A request at light load meets a few of
these on each hop. Measured with a zero-time fleet, alternating runs: added p50 at
``--clients 1`` 1.91–2.03 ms instead of 2.06–2.31 ms, at ``--rate 50`` 0.2–0.5 ms less, and
0.192 ms of CPU per request at 52 clients instead of 0.201–0.208. A tight slack costs nothing
but a few more precise timer interrupts.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "HELPER_POLICIES",
    "HelperThreadScheduler",
    "add_helper_threads_argument",
    "schedule_helper_threads",
    "tighten_timer_slack",
    "tune_threads",
]

_log = logging.getLogger("halcyon.thread_scheduling")

# The values of --helper-threads.
HELPER_POLICIES = ("batch", "normal")
# How often new threads are looked for.
RESCAN_S = 10.0
# prctl(2) option: set the calling thread's timer slack, in nanoseconds.
_PR_SET_TIMERSLACK = 29


class HelperThreadScheduler:
    """Switches every thread of this process except one (the loop's) to ``SCHED_BATCH``."""

    def __init__(
        self,
        keep_tid: int | None = None,
        *,
        tasks: Path = Path("/proc/self/task"),
        set_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.keep_tid = keep_tid if keep_tid is not None else threading.get_native_id()
        self._tasks = tasks
        self._set_batch = set_batch if set_batch is not None else _set_batch
        self._done: set[int] = set()
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "SCHED_BATCH") and Path("/proc/self/task").is_dir()

    @property
    def switched(self) -> int:
        """Threads switched and still alive at the last scan."""
        return len(self._done)

    def apply(self) -> int:
        """Switch the threads not seen before; how many were switched now."""
        if self._refused:
            return 0
        try:
            tids = [int(name) for name in os.listdir(self._tasks) if name.isdigit()]
        except OSError:
            return 0
        self._done.intersection_update(tids)  # forget threads that have exited
        switched = 0
        for tid in tids:
            if tid == self.keep_tid or tid in self._done:
                continue
            try:
                self._set_batch(tid)
            except ProcessLookupError:  # exited between the listing and the call
                continue
            except OSError as exc:  # not allowed here (a seccomp profile, say): stop trying
                _log.info("helper threads keep their scheduling policy", extra={"error": str(exc)})
                self._refused = True
                return switched
            self._done.add(tid)
            switched += 1
        return switched

    def keep_applied(self, loop: asyncio.AbstractEventLoop, every_s: float = RESCAN_S) -> None:
        """Apply now and again every ``every_s`` on ``loop`` until :meth:`stop`."""

        def tick() -> None:
            self.apply()
            self._timer = loop.call_later(every_s, tick)

        tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def add_helper_threads_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """``--helper-threads {batch,normal}`` in a "tuning" group."""
    parser.add_argument_group("tuning").add_argument(
        "--helper-threads",
        choices=HELPER_POLICIES,
        default=default,
        help="scheduling policy of the threads other than the event loop's: 'batch' keeps "
        "gRPC's I/O threads from preempting the loop on wake-up (Linux SCHED_BATCH), "
        "'normal' leaves them as they are (default %(default)s)",
    )


def schedule_helper_threads(policy: str) -> HelperThreadScheduler | None:
    """On the loop's thread, after start-up: apply ``policy`` and keep it applied."""
    if policy != "batch" or not HelperThreadScheduler.supported():
        return None
    scheduler = HelperThreadScheduler()
    scheduler.keep_applied(asyncio.get_running_loop())
    return scheduler


def tighten_timer_slack(nanoseconds: int = 1) -> bool:
    """Set the calling thread's timer slack (Linux); False where that is not possible.

    Threads it starts afterwards inherit the value; threads that exist already keep theirs.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done = libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(nanoseconds), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if not done:
        _log.info("the loop thread keeps the default timer slack")
    return bool(done)


def tune_threads(helper_policy: str) -> HelperThreadScheduler | None:
    """Everything this module decides, for a serving process: call on the loop's thread after
    start-up. Tightens the loop thread's timer slack and applies ``helper_policy``."""
    tighten_timer_slack()
    return schedule_helper_threads(helper_policy)


def _set_batch(tid: int) -> None:
    os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
