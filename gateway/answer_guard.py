"""The backstop that answers a request nobody else answered, shortly after its deadline.

What it decides: when the gateway gives up on an answer itself. The batcher answers every
queued request before its deadline and the dispatcher every dispatched one when its batch
returns or fails; this guard only bounds a bug or a lost worker reply. Requests are kept in
coarse buckets with one timer per bucket, not one per request: a timer per request is a heap
push on the hot path for a backstop that should never fire, and being late by up to one
bucket's width is harmless here.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["AnswerGuard"]


class _Answerable(Protocol):
    @property
    def answered(self) -> bool: ...


T = TypeVar("T", bound=_Answerable)


class AnswerGuard(Generic[T]):
    """Calls ``expire(item)`` for every watched item still unanswered when its time comes."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        expire: Callable[[T], None],
        resolution_s: float = 0.05,
    ) -> None:
        if resolution_s <= 0:
            raise ValueError("resolution must be positive")
        self._loop = loop
        self._expire = expire
        self._resolution = resolution_s
        self._buckets: dict[int, list[T]] = {}

    def watch(self, item: T, after_s: float) -> None:
        """Expire ``item`` about ``after_s`` from now (never earlier) unless answered."""
        key = math.ceil((self._loop.time() + after_s) / self._resolution)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = []
            self._loop.call_at(key * self._resolution, self._fire, key)
        bucket.append(item)

    def _fire(self, key: int) -> None:
        for item in self._buckets.pop(key, ()):
            if not item.answered:
                self._expire(item)

    @property
    def watched(self) -> int:
        return sum(len(b) for b in self._buckets.values())
