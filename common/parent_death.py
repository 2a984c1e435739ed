"""A service process that dies with the process that launched it.

What it decides: that a controller, gateway or worker started by a launcher (``halcyon stack``,
``halcyon rollout verify``, the test suites) never outlives it, however the launcher dies —
SIGKILL included, where no ``finally`` runs. The launcher puts its pid in the environment
(:data:`PARENT_PID_ENV`); the service calls :func:`die_with_parent` first thing, which asks the
kernel (Linux ``PR_SET_PDEATHSIG``) for SIGKILL when its parent goes, then checks the parent is
still the launcher: one that died before the request was made has already handed the child to
init, and no signal would ever come.

Why the child does it and not the launcher: the usual way is a ``preexec_fn``, but that makes
``subprocess`` use ``fork()`` instead of ``vfork()``, and a fork of a process with live gRPC
threads (``rollout verify`` starts workers while its load runs) runs gRPC's fork handlers in the
child, which abort it. SIGKILL, not SIGTERM (ADR 0013): with the launcher gone nobody waits
for a graceful stop, and one would hold the ports through its drain delay and grace, so the
next ``halcyon stack`` could fail to bind them.

The signal follows the *thread* that started the child: a launcher must start children from a
thread that lives as long as they should (the launchers here use their main thread).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["PARENT_PID_ENV", "die_with_parent"]

PARENT_PID_ENV = "HALCYON_PARENT_PID"
EXIT_PARENT_GONE = 1
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Get SIGKILL when the launcher dies; exit now if it already has. No-op unless launched.

    The variable is taken out of the environment so that this process's own children do not
    mistake it for theirs.
    """
    raw = os.environ.pop(PARENT_PID_ENV, "")
    if not raw.isdigit():
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != int(raw):  # the launcher died before prctl: no signal will come
        raise SystemExit(EXIT_PARENT_GONE)
