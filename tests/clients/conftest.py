"""Fixtures for the client tests: a real stack, and the Node client installed once.

* ``stack`` (module scope): a controller, one zero-device-time worker and a gateway, started
  with the end-to-end launcher (:mod:`tests.support.e2e`) on 127.0.0.1:0.
* ``launcher`` (function scope): a Launcher of its own, for a test that needs a different stack.
* ``node_client`` (session scope): ``npm ci`` of ``clients/node`` from its lockfile, once, and
  the command that runs ``infer.js``. ``node`` and ``npm`` are asked for with
  :func:`tests.support.tools.require_tool`: a machine without them skips with one line naming
  the Debian package; under CI the absence fails.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clients_support import CLIENTS, e2e  # type: ignore[import-not-found]

from tests.support.tools import require_tool

NPM_CI_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A controller, one instant worker (replica-a) and a gateway, per module."""
    launch = e2e.Launcher(tmp_path_factory.mktemp("clients-stack"))
    try:
        yield launch.fleet({"replica-a": e2e.INSTANT})
    finally:
        launch.close()


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Any]:
    """An e2e Launcher for this test only, stopped at teardown."""
    launch = e2e.Launcher(tmp_path)
    try:
        yield launch
    finally:
        launch.close()


@pytest.fixture(scope="session")
def node_client() -> list[str]:
    """``[node, clients/node/infer.js]``, after ``npm ci`` installed its locked dependencies."""
    node = require_tool("node")
    npm = require_tool("npm")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
        cwd=CLIENTS / "node",
        capture_output=True,
        text=True,
        timeout=NPM_CI_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"npm ci in clients/node failed:\n{done.stdout}\n{done.stderr}"
    return [node, str(CLIENTS / "node" / "infer.js")]
