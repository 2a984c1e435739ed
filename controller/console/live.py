"""The console's tick: gauges into the history, and one state document per tick for all viewers.

What it decides: how often the console looks at the controller and what one look costs. Once
per ``tick_s`` (default 1 s) on the controller's loop it samples each gateway's limiter and
its cumulative shed and tenant counts (from the latest outcome reports) and each model's busy
and total slots (from worker heartbeats) into the traffic history — always, so the charts
have a past when a page opens — and, only while some page is watching, builds the state
document once and hands the same one to every server-sent-event stream
(:meth:`LiveState.wait_newer`). A hundred open pages cost one GetState per tick, not a
hundred.

Decisions are not polled: each stream subscribes to the rollout manager's
:class:`controller.decision_feed.DecisionFeed` and sends a decision the moment it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

from controller.console.history import (
    TENANT_FIELDS,
    GatewayCounters,
    GatewayGauge,
    LoadGauge,
    TrafficHistory,
)
from controller.console.problems import ConsoleError
from controller.console.snapshot import Snapshots
from controller.outcomes import OutcomeAggregator
from controller.registry import FleetRegistry

__all__ = ["TRAFFIC_OVERLAP_SLOTS", "LiveState"]

# How many of the latest history slots each state document carries.
TRAFFIC_OVERLAP_SLOTS = 10

_log = logging.getLogger("halcyon.controller.console")


class LiveState:
    """The tick loop and the latest state document, with a way to wait for the next one."""

    def __init__(
        self,
        snapshots: Snapshots,
        history: TrafficHistory,
        registry: FleetRegistry,
        outcomes: OutcomeAggregator,
        *,
        tick_s: float = 1.0,
    ) -> None:
        if not tick_s > 0.0:
            raise ValueError(f"tick_s must be positive, got {tick_s}")
        self._snapshots = snapshots
        self._history = history
        self._registry = registry
        self._outcomes = outcomes
        self.tick_s = tick_s
        self.viewers = 0
        self.version = 0
        self.latest: dict[str, Any] | None = None
        self.closed = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="console-tick")

    async def close(self) -> None:
        self.closed = True
        self._publish()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def sample(self) -> None:
        """Put the gateways' limiters and counters and the replicas' load in the current
        history slot."""
        reports = self._outcomes.gateways()
        gateways = [
            (g.gateway_id, GatewayGauge(limit=g.concurrency_limit, inflight=g.inflight))
            for g in reports
        ]
        counters = [
            (
                g.gateway_id,
                GatewayCounters(
                    sheds={s.reason: s.count for s in g.sheds},
                    tenants={
                        t.tenant: {f: getattr(t, f) for f in TENANT_FIELDS} for t in g.tenants
                    },
                ),
            )
            for g in reports
        ]
        busy: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for member in self._registry.members():
            entry = busy[member.descriptor.model]
            entry[0] += member.effective_load().busy_slots
            entry[1] += member.descriptor.slots
        load = [(m, LoadGauge(busy=b, slots=s)) for m, (b, s) in sorted(busy.items())]
        self._history.sample(gateways, load, counters)

    async def refresh(self) -> dict[str, Any]:
        """Build a new state document now and wake every stream waiting for one."""
        document = await self._snapshots.state()
        # The last few slots, overlapping the previous document's: a page merges them by
        # time, so one it missed (a slow reader skips documents) leaves no hole.
        since = document["server_time"] - TRAFFIC_OVERLAP_SLOTS * self._history.slot_s
        document["traffic"] = self._snapshots.traffic(since)
        self.latest = document
        self._publish()
        return document

    def _publish(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_newer(self, version: int) -> dict[str, Any] | None:
        """The first document newer than ``version``; None once closed."""
        while self.version <= version and not self.closed:
            await self._changed.wait()
        return None if self.closed else self.latest

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
                if self.viewers > 0:
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except ConsoleError as exc:
                _log.warning("console state unavailable", extra={"error": exc.message})
            except Exception:
                _log.exception("console tick failed")
            await asyncio.sleep(self.tick_s)
