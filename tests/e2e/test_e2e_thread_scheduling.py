"""The gateway's helper threads run SCHED_BATCH, its event-loop thread does not; workers keep
the default policy unless told otherwise. Both run their loop thread with a 1 ns timer slack."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from common.thread_scheduling import HelperThreadScheduler

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not HelperThreadScheduler.supported(), reason="needs Linux SCHED_BATCH"),
]


def _policies(pid: int) -> dict[str, set[int]]:
    """Thread name -> the scheduling policies of the threads with that name."""
    found: dict[str, set[int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            policy = os.sched_getscheduler(int(task.name))
        except (OSError, ProcessLookupError):  # the thread exited meanwhile
            continue
        found.setdefault(name, set()).add(policy)
    return found


def test_grpc_io_threads_do_not_preempt_the_loop(fleet: Any) -> None:
    for i in range(4):  # traffic, so every process has started its I/O threads
        fleet.infer(session_key=f"sched-{i}")
    inherited = os.sched_getscheduler(0)  # what every process here starts with
    policies = _policies(fleet.gateway.pid)
    assert os.sched_getscheduler(fleet.gateway.pid) == inherited, policies  # the loop's thread
    assert policies.get("event_engine") == {os.SCHED_BATCH}, policies
    for worker in fleet.workers.values():
        assert _policies(worker.pid).get("event_engine") == {inherited}


def test_loop_threads_run_with_a_tight_timer_slack(fleet: Any) -> None:
    for proc in (fleet.gateway, *fleet.workers.values()):
        # /proc/PID/timerslack_ns is the slack of the thread group leader: the loop's thread.
        assert Path(f"/proc/{proc.pid}/timerslack_ns").read_text().strip() == "1"
