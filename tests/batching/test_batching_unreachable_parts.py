"""A ``DEADLINE_UNREACHABLE`` refusal carries its prediction's parts, and they add up.

The device is known exactly (10 ms + 0.1 ms/token, no spread), so every part is a number
the test can compute: the batch on the device, the batches queued ahead, the requests
ahead of it in its own batch, its own work.
"""

from __future__ import annotations

import pytest
from batching_helpers import INTERCEPT, SLOPE, make_batcher

from common.clock import ManualClock
from gateway.batching import Accepted, DropReason, PredictionParts, Rejected


def _refused(result: object) -> PredictionParts:
    assert isinstance(result, Rejected) and result.reason is DropReason.DEADLINE_UNREACHABLE
    assert result.parts is not None
    return result.parts


def test_idle_replica_and_empty_queue_leave_only_its_own_work(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    now = clock.now()
    result = batcher.submit("big", tokens=1000, deadline=now + 0.050)  # costs 110 ms alone
    parts = _refused(result)
    assert parts.deadline_in == pytest.approx(0.050)
    assert parts.own == pytest.approx(INTERCEPT + SLOPE * 1000)
    assert (parts.on_device, parts.queued_ahead, parts.sharing_batch) == (0.0, 0.0, 0.0)
    assert (parts.queued_requests, parts.batch_mates) == (0, 0)
    assert isinstance(result, Rejected) and result.predicted_completion is not None
    assert parts.total == pytest.approx(result.predicted_completion - now)


def test_a_deadline_already_past_has_nothing_to_predict(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    parts = _refused(batcher.submit("old", tokens=10, deadline=clock.now() - 0.003))
    assert parts.deadline_in == pytest.approx(-0.003)
    assert parts.total == 0.0


def test_device_and_queue_ahead_are_told_apart(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    t0 = clock.now()
    cost = INTERCEPT + SLOPE * 400
    batcher.submit("busy", tokens=400, deadline=t0 + cost + 0.0005)  # 50 ms on the device
    assert batcher.take_batch("r1") is not None
    for name in "abcd":  # one 90 ms batch planned after the device
        assert isinstance(batcher.submit(name, tokens=200, deadline=t0 + 0.200), Accepted)
    result = batcher.submit("x", tokens=1000, deadline=t0 + 0.205)
    parts = _refused(result)
    assert parts.deadline_in == pytest.approx(0.205)
    assert parts.on_device == pytest.approx(0.050)
    assert parts.queued_ahead == pytest.approx(0.090)
    assert parts.own == pytest.approx(INTERCEPT + SLOPE * 1000)
    assert (parts.sharing_batch, parts.batch_mates) == (0.0, 0)  # it follows that batch
    assert parts.queued_requests == 4
    assert isinstance(result, Rejected) and result.predicted_completion is not None
    assert parts.total == pytest.approx(result.predicted_completion - t0)


def test_requests_ahead_in_its_own_batch_are_counted(clock: ManualClock) -> None:
    batcher = make_batcher(clock)
    t0 = clock.now()
    cost = INTERCEPT + SLOPE * 400
    batcher.submit("busy", tokens=400, deadline=t0 + cost + 0.0005)  # 50 ms on the device
    assert batcher.take_batch("r1") is not None
    # a (due +150 ms) is planned in a 40 ms batch after the device.
    assert isinstance(batcher.submit("a", tokens=300, deadline=t0 + 0.150), Accepted)
    # x, due at the same time, would join that batch behind a: 50 + 10 + 0.1 x (300 + 800)
    # = 170 ms > 150 ms. (a is smaller than x, so shedding a for x is no trade.)
    result = batcher.submit("x", tokens=800, deadline=t0 + 0.150)
    parts = _refused(result)
    assert parts.deadline_in == pytest.approx(0.150)
    assert parts.on_device == pytest.approx(0.050)
    assert parts.queued_ahead == pytest.approx(0.0)
    assert (parts.batch_mates, parts.queued_requests) == (1, 1)
    assert parts.sharing_batch == pytest.approx(SLOPE * 300)
    assert parts.own == pytest.approx(INTERCEPT + SLOPE * 800)
    assert isinstance(result, Rejected) and result.predicted_completion is not None
    assert parts.total == pytest.approx(result.predicted_completion - t0)
