"""Fixtures for the deployment tests (helpers in ``deploy_support``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_support import e2e  # type: ignore[import-not-found]


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[object]:
    """An e2e Launcher (real ``halcyon`` processes on 127.0.0.1:0), stopped at teardown."""
    launch = e2e.Launcher(tmp_path)
    try:
        yield launch
    finally:
        launch.close()
