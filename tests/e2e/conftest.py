"""Fixtures for the end-to-end tests (the launcher and helpers are :mod:`tests.support.e2e`).

* ``fleet`` (module scope): one controller, two zero-device-time workers and a gateway, shared
  by the tests of a module that only send requests and read state.
* ``launch`` (function scope): a :class:`~tests.support.e2e.Launcher` for tests that kill or
  stop processes; they get their own.
* ``e2e``: the helpers (polling, metrics scraping, rich errors, grpcurl) and constants.

A failing test's report carries what its processes logged (the hook below).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import e2e as lib
from tests.support.e2e import Fleet, Launcher, pytest_runtest_makereport

__all__ = ["e2e", "fleet", "launch", "pytest_runtest_makereport"]


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    """A Launcher for this test only (for tests that kill or stop processes)."""
    launcher = Launcher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One controller, two instant workers (replica-a, replica-b) and a gateway, per module."""
    launcher = Launcher(tmp_path_factory.mktemp("fleet"))
    try:
        yield launcher.fleet()
    finally:
        launcher.close()


@pytest.fixture
def e2e() -> SimpleNamespace:
    """Helpers and constants for the e2e tests."""
    assert Path(lib.GRPCURL).exists(), f"grpcurl not found at {lib.GRPCURL}"
    return SimpleNamespace(
        MODEL=lib.MODEL,
        API_KEY=lib.API_KEY,
        FLEET_TOKEN=lib.FLEET_TOKEN,
        OPERATOR_TOKEN=lib.OPERATOR_TOKEN,
        INSTANT=lib.INSTANT,
        GRPCURL=lib.GRPCURL,
        wait_for=lib.wait_for,
        scrape=lib.scrape,
        sample=lib.sample,
        rich_error=lib.rich_error,
        duration=lib.duration,
        grpcurl=lib.grpcurl,
    )
