"""Fan-out of "something changed" to many stream subscribers, without queues.

What it decides: how fleet changes reach WatchFleet subscribers. Each subscriber has a
one-slot mailbox — a flag meaning "a newer snapshot exists" — instead of a queue of every
change: a burst of changes while a subscriber is busy collapses into one wake-up, and the
subscriber then sends whatever snapshot is latest. A slow subscriber (a gateway not reading)
therefore holds only itself up, and memory stays constant however far behind it falls.
"""

from __future__ import annotations

import asyncio

__all__ = ["ChangeFeed", "Subscription"]


class Subscription:
    """One subscriber's mailbox. ``await wait()`` until a change (True) or the feed closes."""

    def __init__(self, feed: ChangeFeed) -> None:
        self._feed = feed
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()

    async def wait(self) -> bool:
        """True after a change since the last wait; False once the feed is closed."""
        if self._feed.closed:
            return False
        await self._changed.wait()
        self._changed.clear()
        return not self._feed.closed

    def close(self) -> None:
        self._feed._subscribers.discard(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChangeFeed:
    """Publishers call :meth:`publish`; every subscriber's flag is raised."""

    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()
        self.closed = False

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        if not self.closed:
            self._subscribers.add(sub)
        return sub

    def publish(self) -> None:
        for sub in self._subscribers:
            sub._notify()

    def close(self) -> None:
        """End every subscription: pending and future ``wait()`` calls return False."""
        self.closed = True
        for sub in list(self._subscribers):
            sub._notify()
        self._subscribers.clear()

    def __len__(self) -> int:
        return len(self._subscribers)
