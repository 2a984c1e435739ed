"""Helpers for the deployment tests: the external tools they drive, and the e2e launcher.

The tools (``kubectl``, ``promtool``, ``prometheus``) are real binaries, asked for with
:func:`tests.support.tools.require_tool`: ``.ci/run`` installs them on CI's fresh machine, so
under CI a missing one fails the test loudly; on a developer's machine it skips with one line
naming the Debian package.

Real processes are started with the end-to-end launcher (:mod:`tests.support.e2e`), so every
suite starts, watches and stops processes the same way.
"""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support import e2e
from tests.support.tools import require_tool

__all__ = ["DEPLOY", "REPO", "e2e", "free_port", "require_tool"]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def free_port() -> int:
    """A loopback port free now (for tools that take no port 0 and report nothing back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
