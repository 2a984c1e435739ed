"""Fixtures for the reliability suite, and the one table it prints at the end.

The scenarios are marked ``reliability``; ``pyproject.toml`` deselects that marker by default,
so ``make test`` does not run them and ``make test-reliability`` (``pytest -m reliability
tests/reliability``) runs only them. Each scenario records its row on the ``scoreboard``
*before* it asserts, so a failing scenario is still in the table; the table is printed in the
terminal summary (see ``reliability_table`` for what the columns mean).

``launcher`` is per module: a module's scenarios share one fleet, restarting what they break.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from reliability_fleet import Launcher, attach_logs_on_failure
from reliability_table import Row, render

pytest_runtest_makereport = attach_logs_on_failure

_ROWS = pytest.StashKey[list[Row]]()


class Scoreboard:
    """Rows of the table, in the order the scenarios ran."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def check(self, row: Row) -> None:
        """Record the row, then fail the scenario if it lost requests or a property broke."""
        self.rows.append(row)
        assert row.passed, "\n" + render([row])


@pytest.fixture
def scoreboard(request: pytest.FixtureRequest) -> Scoreboard:
    stash = request.config.stash
    if _ROWS not in stash:
        stash[_ROWS] = []
    return Scoreboard(stash[_ROWS])


@pytest.fixture(scope="module")
def launcher(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """Starts processes for one module's scenarios and stops all of them afterwards."""
    launch = Launcher(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))
    try:
        yield launch
    finally:
        launch.close()


# The table's order: processes failing, then overload, then fuzzing (the order).
_MODULE_ORDER = ("test_process_faults", "test_overload", "test_fuzz")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order this suite's scenarios (the hook sees every test; others keep their places)."""

    def module(item: pytest.Item) -> str:
        return str(getattr(item.module, "__name__", "")).rpartition(".")[2]

    slots = [i for i, item in enumerate(items) if module(item) in _MODULE_ORDER]
    ours = sorted((items[i] for i in slots), key=lambda item: _MODULE_ORDER.index(module(item)))
    for i, item in zip(slots, ours, strict=True):
        items[i] = item


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows = config.stash.get(_ROWS, [])
    if rows:
        terminalreporter.write_sep("=", "Halcyon reliability: every request's outcome")
        terminalreporter.write_line(render(rows))
