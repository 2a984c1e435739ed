"""Which refusals of admitted work the gateway hands the limiter as evidence of its own queue."""

from __future__ import annotations

from common.errors import Reason, deadline_missed, deadline_unreachable, unavailable
from gateway.app import _queue_shed_budget


def test_refusals_that_blame_the_queue_carry_the_budget() -> None:
    queued = deadline_unreachable(
        "queued", 2.5, deadline_s=2.0, parts_s={"queued_ahead": 2.3, "own": 0.1, "margin": 0.1}
    )
    assert _queue_shed_budget(queued, 2.0) == 2.0
    assert _queue_shed_budget(deadline_missed("evicted"), 2.0) == 2.0
    assert _queue_shed_budget(unavailable(Reason.QUEUE_FULL, "full", 0.1), 2.0) == 2.0


def test_refusals_a_request_earned_itself_are_not_evidence() -> None:
    # Its own work and margin take half its budget or more: the request, not the queue.
    alone = deadline_unreachable(
        "too big", 1.2, deadline_s=1.0, parts_s={"queued_ahead": 0.0, "own": 0.9, "margin": 0.3}
    )
    assert _queue_shed_budget(alone, 1.0) is None
    passed = deadline_unreachable("passed", 0.0, deadline_s=-0.01)
    assert _queue_shed_budget(passed, 0.0) is None
    # Not a batcher refusal about the queue at all.
    assert _queue_shed_budget(unavailable(Reason.NO_CAPACITY, "none", None), 2.0) is None
    assert _queue_shed_budget(unavailable(Reason.SHUTTING_DOWN, "bye", None), 2.0) is None
