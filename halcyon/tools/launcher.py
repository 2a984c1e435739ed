"""How a ``halcyon`` process is started, waited for and stopped by another one.

What it decides, once for ``halcyon stack``'s supervisor, ``halcyon rollout verify``'s extra
workers and the test suites' launcher:

* **The command.** ``python -m halcyon ARGV... --ready-file PATH`` with this interpreter; the
  stale ready file of an earlier run is removed first, so its presence means *this* process is
  serving. Its stdout and stderr go to a log file (appended: a restart continues it), or to
  this process's terminal with none.
* **Nothing left behind.** The child runs in its own process group (a Ctrl-C at a terminal
  reaches only the launcher, which stops its children in its own order, and :func:`kill`
  takes whatever the child started too), and is told the launcher's pid
  (:data:`common.parent_death.PARENT_PID_ENV`) so that it dies with the launcher even when
  the launcher is SIGKILLed. No ``preexec_fn``: it would force ``fork()``, which aborts the
  child of a process with live gRPC threads (see :mod:`common.parent_death`).
* **Ready.** The child writes its ready file atomically (tmp + rename) once it serves:
  :func:`wait_ready` polls for it and gives up at once if the child exits first.
* **Stop.** SIGTERM (the child drains and exits within its grace), SIGKILL to its process
  group if it outlives ``grace_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from common.parent_death import PARENT_PID_ENV

__all__ = [
    "NotReady", "kill", "launch", "read_ready", "reap", "stop", "terminate", "wait_ready",
]  # fmt: skip

KILL_REAP_TIMEOUT_S = 10.0


class NotReady(Exception):
    """No ready file: the process exited first (``returncode``) or ``timeout_s`` passed."""

    def __init__(self, returncode: int | None, timeout_s: float) -> None:
        self.returncode = returncode
        self.timeout_s = timeout_s
        what = f"exited with {returncode}" if returncode is not None else f"{timeout_s:g} s passed"
        super().__init__(f"no ready file: {what}")


def launch(
    argv: Sequence[str],
    *,
    ready_file: Path,
    log_path: Path | None,
    env: Mapping[str, str],
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``python -m halcyon ARGV --ready-file READY_FILE``; returns at once."""
    ready_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "halcyon", *argv, "--ready-file", str(ready_file)]
    child_env = {**env, PARENT_PID_ENV: str(os.getpid())}
    with open(log_path, "ab") if log_path is not None else contextlib.nullcontext() as log:
        # The child holds its own descriptor of the log: ours closes when Popen returns.
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            process_group=0,
        )


def read_ready(ready_file: Path) -> dict[str, Any] | None:
    """The ready file's addresses and pid, or None while there is none (yet)."""
    try:
        info = json.loads(ready_file.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def wait_ready(
    proc: subprocess.Popen[bytes],
    ready_file: Path,
    timeout_s: float,
    *,
    poll_s: float = 0.02,
    between: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The ready file's content once written; :class:`NotReady` if the process exits or
    ``timeout_s`` passes first. ``between`` runs before every look (it may raise to give up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        between()
        info = read_ready(ready_file)
        if info is not None:
            return info
        if proc.poll() is not None:
            raise NotReady(proc.returncode, timeout_s)
        if time.monotonic() > deadline:
            raise NotReady(None, timeout_s)
        time.sleep(poll_s)


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM without waiting (and SIGCONT: a stopped process cannot act on it)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and its process group, without waiting."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


def reap(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """Wait for the exit (after :func:`terminate`); SIGKILL if it outlives ``grace_s``."""
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill(proc)
        return proc.wait(timeout=KILL_REAP_TIMEOUT_S)


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM, then SIGKILL if it is still running ``grace_s`` later; the exit code."""
    terminate(proc)
    return reap(proc, grace_s)
