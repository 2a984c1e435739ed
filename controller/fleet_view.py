"""The fleet as gateways see it: one numbered snapshot of members and routing.

What it decides: when the published fleet has changed and what number it carries. The
snapshot a gateway receives (``WatchFleetResponse``) combines two sources that change
independently — registry membership and the routing table's configuration — so its
``generation`` is this view's own counter, advanced whenever either source's generation moved
since the last look. Snapshots are built once per generation and shared by every subscriber.

The counter starts at ``epoch`` (the controller passes wall-clock microseconds at start), so
generations normally keep increasing across controller restarts too; a gateway should still
accept the first snapshot of every new stream as authoritative. Leases and busy-slot counters
renewed by heartbeats do not advance the generation (see :mod:`controller.registry`); GetState
reads them fresh.

**Warm-up** (ADR 0011). A controller that has just started does not know the fleet: the
workers of the controller it replaced are still re-registering. Until ``warm_up_until`` (a
reading of the controller's clock; the controller passes start + one lease TTL) its snapshots
say ``warming_up``, and gateways merge them into the fleet they last knew instead of taking an
empty or partial list as the truth. Ending the warm-up is a change of its own: a new
generation whose snapshot says ``warming_up = false``. One lease TTL because a live worker
re-registers within its reconnect delay (well under a TTL) and a worker that has not
re-registered within one TTL would have lost its lease under the old controller anyway.
"""

from __future__ import annotations

from controller.convert import WallClock, member_to_pb
from controller.registry import FleetRegistry
from controller.routing_table import RoutingResolution, RoutingTable
from halcyon.v1 import control_pb2

__all__ = ["FleetView"]


class FleetView:
    """Numbered, cached snapshots of a registry and a routing table."""

    def __init__(
        self,
        registry: FleetRegistry,
        routing: RoutingTable,
        wall: WallClock,
        *,
        epoch: int = 0,
        warm_up_until: float | None = None,
    ) -> None:
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
        self._warm_up_until = warm_up_until
        self._registry = registry
        self._routing = routing
        self._wall = wall
        self._generation = epoch
        self._seen: tuple[int, int] | None = None
        self._resolution: RoutingResolution | None = None
        self._snapshot: control_pb2.WatchFleetResponse | None = None

    def _sync(self) -> None:
        key = (self._registry.generation, self._routing.generation)
        if key != self._seen:
            if self._seen is not None:
                self._generation += 1
            self._seen = key
            self._resolution = None
            self._snapshot = None

    @property
    def generation(self) -> int:
        self._sync()
        return self._generation

    @property
    def warming_up(self) -> bool:
        """Whether snapshots still say the fleet is not established (see the module doc)."""
        return self._warm_up_until is not None

    def warm_up_remaining(self, now: float) -> float:
        """Seconds of warm-up left at ``now`` (0 when over or never started)."""
        if self._warm_up_until is None:
            return 0.0
        return max(0.0, self._warm_up_until - now)

    def end_warm_up(self, now: float) -> bool:
        """End the warm-up if its time has come; True when it just ended (a new generation,
        whose snapshot gateways take as the whole fleet)."""
        if self._warm_up_until is None or now < self._warm_up_until:
            return False
        self._warm_up_until = None
        self._sync()
        self._generation += 1
        self._snapshot = None
        return True

    def resolution(self) -> RoutingResolution:
        """Routing for every known model, resolved against the live fleet."""
        self._sync()
        if self._resolution is None:
            self._resolution = self._routing.resolve(self._registry.versions_by_model())
        return self._resolution

    def snapshot(self) -> control_pb2.WatchFleetResponse:
        """The current snapshot (shared: callers must not modify it)."""
        self._sync()
        if self._snapshot is None:
            self._snapshot = control_pb2.WatchFleetResponse(
                generation=self._generation,
                replicas=[member_to_pb(m, self._wall) for m in self._registry.members()],
                routing=self.resolution().routes,
                warming_up=self._warm_up_until is not None,
            )
        return self._snapshot
