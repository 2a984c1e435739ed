"""Fan-out of rollout decisions to ``WatchRolloutDecisions`` streams.

What it decides: how every decision reaches every watcher, in order and without gaps, and what
happens to a watcher that stops reading. Unlike fleet snapshots (where only the latest matters,
see :mod:`controller.feed`) every decision matters, so each watcher has a bounded queue.
Decisions are rare — at most one per rollout per tick — so a watcher that lets
``max_backlog`` pile up is not reading at all: its subscription is ended as ``overflowed``
(the stream closes with a status telling it to watch again with replay) rather than let it
hold memory or see a stream with a silent hole in it.
"""

from __future__ import annotations

import asyncio

from controller.store import DecisionRecord

__all__ = ["DecisionFeed", "DecisionSubscription"]

_END = None


class DecisionSubscription:
    """One watcher's queue of decisions (of one model, or all when ``model`` is None)."""

    def __init__(self, feed: DecisionFeed, model: str | None, max_backlog: int) -> None:
        self._feed = feed
        self.model = model
        self._queue: asyncio.Queue[DecisionRecord | None] = asyncio.Queue(max_backlog + 1)
        self._max_backlog = max_backlog
        self.overflowed = False
        self.ended = False

    def _offer(self, decision: DecisionRecord) -> None:
        if self.ended or (self.model is not None and decision.model != self.model):
            return
        if self._queue.qsize() >= self._max_backlog:
            self.overflowed = True
            self._end()
            return
        self._queue.put_nowait(decision)

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            self._queue.put_nowait(_END)

    async def next(self) -> DecisionRecord | None:
        """The next decision; None once the feed closed (or this watcher overflowed)."""
        return await self._queue.get()

    def close(self) -> None:
        self._feed._subscribers.discard(self)
        self._end()

    def __enter__(self) -> DecisionSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DecisionFeed:
    """Publishers call :meth:`publish`; every matching subscriber gets the decision."""

    def __init__(self, *, max_backlog: int = 1024) -> None:
        self._subscribers: set[DecisionSubscription] = set()
        self._max_backlog = max_backlog
        self.closed = False

    def subscribe(self, model: str | None = None) -> DecisionSubscription:
        sub = DecisionSubscription(self, model or None, self._max_backlog)
        if self.closed:
            sub._end()
        else:
            self._subscribers.add(sub)
        return sub

    def publish(self, decision: DecisionRecord) -> None:
        for sub in list(self._subscribers):
            sub._offer(decision)
            if sub.ended:
                self._subscribers.discard(sub)

    def close(self) -> None:
        """End every subscription: their ``next()`` returns None after what is queued."""
        self.closed = True
        for sub in list(self._subscribers):
            sub._end()
        self._subscribers.clear()

    def __len__(self) -> int:
        return len(self._subscribers)
