"""Fleet events to the store without blocking the event loop.

What it decides: when fleet events reach SQLite. Handlers call :meth:`FleetEventWriter.record`,
which only appends to an in-memory list; a background task writes whatever has accumulated in
one transaction on a worker thread (``asyncio.to_thread``), so a registration or an expiry
never waits for a disk sync. The buffer is bounded (oldest events are dropped, counted and
logged, if the disk stalls for that long), the table is pruned to ``keep`` rows, and
:meth:`close` writes everything still pending before the store is closed.
"""

from __future__ import annotations

import asyncio
import logging

from controller.store import ControllerStore, FleetEvent

__all__ = ["FleetEventWriter"]

_log = logging.getLogger("halcyon.controller.events")


class FleetEventWriter:
    """Buffers fleet events and writes them to a :class:`ControllerStore` in the background."""

    def __init__(
        self, store: ControllerStore, *, keep: int = 100_000, max_pending: int = 10_000
    ) -> None:
        self._store = store
        self._keep = keep
        self._max_pending = max_pending
        self._pending: list[FleetEvent] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._written_since_prune = 0
        self._closing = False
        self.dropped = 0
        self.written = 0

    def record(self, event: FleetEvent) -> None:
        """Queue an event for writing; never blocks."""
        self._pending.append(event)
        if len(self._pending) > self._max_pending:
            excess = len(self._pending) - self._max_pending
            del self._pending[:excess]
            self.dropped += excess
            _log.warning("fleet event buffer full; dropped oldest", extra={"dropped": excess})
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fleet-event-writer")

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write everything recorded so far."""
        async with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return
            try:
                await asyncio.to_thread(self._store.record_fleet_events, batch)
            except Exception:
                _log.exception("cannot write fleet events", extra={"events": len(batch)})
                return
            self.written += len(batch)
            self._written_since_prune += len(batch)
            if self._written_since_prune >= max(1, self._keep // 10):
                self._written_since_prune = 0
                try:
                    await asyncio.to_thread(self._store.prune_fleet_events, self._keep)
                except Exception:
                    _log.exception("cannot prune fleet events")

    async def close(self) -> None:
        """Let the background task finish its write, then write what is still pending."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        await self.flush()
