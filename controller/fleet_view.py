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
    ) -> None:
        if epoch < 0:
            raise ValueError("epoch must be >= 0")
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
            )
        return self._snapshot
