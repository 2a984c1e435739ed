"""Processes for the reliability scenarios: the e2e launcher, plus what faults need on top.

The launcher (``Launcher``, ``Fleet``, ``Proc``: real ``halcyon`` processes on 127.0.0.1 with
ready files, logs and guaranteed teardown) is :mod:`tests.support.e2e`, so both suites start
processes the same way and this suite does not carry a copy. On top of it: restarting a killed
worker, reading a process's memory, and waiting until a worker is in the middle of a batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.e2e import (
    API_KEY,
    INSTANT,
    MODEL,
    Launcher,
    Proc,
    sample,
    scrape,
    wait_for,
)

# Attach the processes' logs to a failed scenario's report (the e2e suite's hook).
from tests.support.e2e import pytest_runtest_makereport as attach_logs_on_failure

# The launcher's names this suite's modules use, and what this module adds on top.
__all__ = [
    "API_KEY", "DEFAULT_BACKOFF", "INSTANT", "MODEL", "Launcher", "Proc",
    "attach_logs_on_failure", "busy_slots", "memory_kib", "restart_worker", "sample", "scrape",
    "wait_mid_batch",
]  # fmt: skip

# Workers as a deployment runs them: the default reconnect backoff (10 s ceiling), not the
# 1 s the e2e launcher uses to keep its tests short — a controller restart must not depend on
# workers happening to retry soon.
DEFAULT_BACKOFF = ("--reconnect-max-s", "10")


def memory_kib(proc: Any, field: str) -> int:
    """A /proc/PID/status memory field in KiB: ``VmRSS`` now, ``VmHWM`` the peak so far."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{proc.pid}/status")


def busy_slots(worker: Any) -> float:
    return float(sample(scrape(worker), "halcyon_worker_busy_slots"))


def wait_mid_batch(worker: Any, timeout_s: float = 5.0) -> None:
    """Until the worker reports a batch on its device (polled, so still very likely on it)."""
    wait_for(lambda: busy_slots(worker) >= 1, timeout_s, f"{worker.name} to run a batch")


def restart_worker(launcher: Any, fleet: Any, replica_id: str) -> Any:
    """The killed worker again (same flags and address); the fleet converges with it."""
    proc = launcher.restart(fleet.workers[replica_id])
    fleet.wait_converged()
    return proc
