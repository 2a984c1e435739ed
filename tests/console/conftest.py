"""Fixtures for the console tests (helpers in ``console_support``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from console_support import e2e, start_fleet  # type: ignore[import-not-found]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One controller with its console on a free port, three workers (v1, v1, v2) and a
    gateway, shared by the tests of a module."""
    launcher = e2e.Launcher(tmp_path_factory.mktemp("console"))
    try:
        yield start_fleet(launcher)
    finally:
        launcher.close()
