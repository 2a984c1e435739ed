"""Shared fixture for the batcher tests: a manual clock (policy tests never sleep)."""

from __future__ import annotations

import pytest

from common.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)
