"""The ``start_stack`` fixture: in-process controllers, each closed at teardown."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from controller_helpers import Stack, StackFactory, close_stack, open_stack


@pytest.fixture
async def start_stack(tmp_path: Path) -> AsyncIterator[StackFactory]:
    """``await start_stack(**config)``: a controller on its own store file (pass ``db_path`` to
    reopen an earlier one, as a restart does)."""
    started: list[Stack] = []

    async def start(**config: Any) -> Stack:
        db_path = config.pop("db_path", tmp_path / f"c{len(started)}.sqlite")
        stack = await open_stack(db_path, **config)
        started.append(stack)
        return stack

    yield start
    for stack in started:
        await close_stack(stack)
