"""The documents the console serves, built from the controller's own state by its owner.

What it decides: the shape of ``GET /api/state``, ``GET /api/traffic`` and the server-sent
events, and where each part comes from:

* ``state`` — ``GetState`` exactly as the RPC answers it (through
  :class:`controller.console.operations.Operations`, proto3 JSON, every field present);
* ``fleet`` — what GetState does not carry: whether snapshots still say ``warming_up`` and
  the fleet view's generation (:class:`controller.fleet_view.FleetView`);
* ``traffic`` — the console's own history (:class:`controller.console.history.TrafficHistory`)
  with slot times turned into wall-clock epoch seconds;
* ``capabilities`` — the actions this controller offers and the rollout gates it has (issue
  #20: pause, resume and approve, each a button the page draws on a running rollout when it
  applies, and analysis-only, a start option the page shows on the rollout it marks);
* a decision event — one stored decision (``RolloutDecision`` in proto3 JSON), as
  ``WatchRolloutDecisions`` would stream it.

Everything is read on the controller's event loop (the console runs there), so no part of the
state is read by anyone but its owner.
"""

from __future__ import annotations

from typing import Any

from controller.console.history import TrafficHistory
from controller.console.operations import Operations, to_json
from controller.convert import WallClock, decision_to_pb
from controller.fleet_view import FleetView
from controller.store import DecisionRecord

__all__ = ["ACTIONS", "GATES", "Snapshots"]

# What an operator can do from the console today (each is the RPC of the same name).
ACTIONS = ("promote", "abort", "pause", "resume", "approve", "drain", "undrain")
# Rollout gates (issue #20): the gate actions above, and analysis-only (set at start).
GATES: tuple[str, ...] = ("pause", "resume", "approve", "analysis_only")


class Snapshots:
    """Builds the console's documents."""

    def __init__(
        self,
        operations: Operations,
        history: TrafficHistory,
        view: FleetView,
        wall: WallClock,
        *,
        lease_ttl_s: float,
    ) -> None:
        self._ops = operations
        self._history = history
        self._view = view
        self._wall = wall
        self._lease_ttl_s = lease_ttl_s

    async def state(self) -> dict[str, Any]:
        """``GET /api/state``."""
        state = await self._ops.state()
        return {
            "server_time": round(self._wall.now(), 3),
            "fleet": {
                "warming_up": self._view.warming_up,
                "generation": str(self._view.generation),
                "lease_ttl_s": self._lease_ttl_s,
            },
            "capabilities": {"actions": list(ACTIONS), "gates": list(GATES)},
            "state": state,
        }

    def traffic(self, since_wall: float | None = None) -> dict[str, Any]:
        """``GET /api/traffic``: complete slots, oldest first (``since_wall``: from then on)."""
        offset = self._wall.wall(0.0)
        since = None if since_wall is None else since_wall - offset
        points = self._history.points(since)
        for point in points:
            point["t"] = round(point["t"] + offset, 3)
        return {
            "slot_s": self._history.slot_s,
            "horizon_s": self._history.horizon_s,
            "dropped": self._history.dropped,
            "points": points,
        }

    @staticmethod
    def decision(decision: DecisionRecord) -> dict[str, Any]:
        """One decision as an event carries it."""
        return to_json(decision_to_pb(decision))
