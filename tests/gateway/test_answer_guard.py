"""AnswerGuard: the backstop fires for unanswered items only, never early, one timer per bucket."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.answer_guard import AnswerGuard


class FakeLoop:
    """Just what AnswerGuard uses of a loop: time() and call_at(), driven by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[..., Any], tuple[Any, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        self.timers.append((when, callback, args))

    def advance(self, to: float) -> None:
        """Run every timer due by ``to`` at its own time, in order; then stand at ``to``."""
        while True:
            due = [t for t in self.timers if t[0] <= to]
            if not due:
                break
            first = min(due, key=lambda t: t[0])
            self.timers.remove(first)
            self.now = max(self.now, first[0])
            first[1](*first[2])
        self.now = max(self.now, to)


@dataclass(eq=False)
class Item:
    answered: bool = False
    expired_at: list[float] = field(default_factory=list)


def make(resolution: float = 0.05) -> tuple[FakeLoop, AnswerGuard[Item], list[Item]]:
    loop = FakeLoop()
    expired: list[Item] = []

    def expire(item: Item) -> None:
        item.expired_at.append(loop.now)
        expired.append(item)

    return loop, AnswerGuard(loop, expire, resolution), expired  # type: ignore[arg-type]


def test_only_unanswered_items_expire() -> None:
    loop, guard, expired = make()
    answered, forgotten = Item(), Item()
    guard.watch(answered, 1.0)
    guard.watch(forgotten, 1.0)
    answered.answered = True
    loop.advance(2.0)
    assert expired == [forgotten]
    assert guard.watched == 0


def test_one_timer_per_bucket() -> None:
    loop, guard, _ = make(resolution=0.1)
    for i in range(100):
        guard.watch(Item(), 1.01 + i * 0.0005)  # all within one 0.1 s bucket
    assert len(loop.timers) == 1


def test_resolution_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        AnswerGuard(FakeLoop(), lambda _item: None, 0.0)  # type: ignore[arg-type]


@given(
    st.lists(st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 3.0)), min_size=1, max_size=40),
    st.floats(0.001, 0.5),
)
def test_never_early_and_at_most_one_bucket_late(
    watches: list[tuple[float, float]], resolution: float
) -> None:
    loop, guard, expired = make(resolution)
    items = []
    for start, after in sorted(watches):
        loop.advance(start)
        item = Item()
        guard.watch(item, after)
        items.append((item, start + after))
    loop.advance(20.0)
    assert len(expired) == len(items)
    for item, due in items:
        (fired,) = item.expired_at
        assert due - 1e-9 <= fired <= due + resolution + 1e-9
