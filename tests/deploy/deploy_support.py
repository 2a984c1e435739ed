"""Helpers for the deployment tests: the external tools they drive, and the e2e launcher.

The tools (``kubectl``, ``promtool``, ``prometheus``) are real binaries. ``.ci/run`` installs
them on CI's fresh machine, so under CI (``CI`` set) a missing one fails the test loudly; on a
developer's machine it skips with the command that installs it.

Real processes are started with the end-to-end launcher (``tests/e2e/conftest.py``), loaded
here as a library so both suites start, watch and stop processes the same way.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
INSTALL = {
    "kubectl": "apt-get install -y kubectl (or the kubectl your cluster uses)",
    "promtool": "apt-get update && apt-get install -y --no-install-recommends prometheus",
    "prometheus": "apt-get update && apt-get install -y --no-install-recommends prometheus",
}


def _load_e2e() -> ModuleType:
    name = "halcyon_tests_e2e_launcher"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "e2e" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


e2e = _load_e2e()


def require_tool(name: str) -> str:
    """The path of ``name``; skips (a developer's machine) or fails (CI) when it is missing."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed: {INSTALL.get(name, 'install it')}"
    if os.environ.get("CI"):
        pytest.fail(f"{message} (.ci/run installs it on CI)")
    pytest.skip(message)


def free_port() -> int:
    """A loopback port free now (for tools that take no port 0 and report nothing back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
