"""Increases from cumulative counts: what each gateway's shed and tenant counters did lately.

What it decides: how the console turns counts a gateway reports *cumulatively* (since that
gateway started, as its Prometheus counters are: :class:`halcyon.v1.control_pb2.ShedCount`,
``TenantTraffic``) into what happened since the previous look, so the history
(:mod:`controller.console.history`) can keep per-second rates. Rules, each pinned by a test:

* the first look at a gateway only takes its counts as the baseline: what it counted before
  the console saw it is not this second's traffic (a chart must not start with a spike);
* afterwards the increase of each counter is its count minus the previous one; a counter seen
  for the first time (a tenant's first call) increases by its whole count;
* if *any* counter of a gateway went down, that gateway restarted: every counter of it then
  increases by its whole new count (everything since the restart), as Prometheus's
  ``increase()`` treats a counter reset; a restart whose counts all came back higher than
  before cannot be told from traffic, with Prometheus as here;
* a gateway that is no longer reported (it aged out of the controller's status) is forgotten,
  so its next report is a first look again and the memory held is one count per counter of
  the gateways reporting now.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

__all__ = ["CumulativeDeltas"]

K = TypeVar("K", bound=Hashable)


class CumulativeDeltas(Generic[K]):
    """Per-gateway cumulative counters in, increases since the previous update out."""

    def __init__(self) -> None:
        self._last: dict[str, dict[K, int]] = {}
        # Gateway restarts seen (some counter of a gateway went down).
        self.resets = 0

    def update(self, seen: Mapping[str, Mapping[K, int]]) -> dict[K, int]:
        """``seen``: gateway id -> counter -> cumulative count, for every gateway reporting now.

        Returns counter -> increase since the previous update, summed over the gateways
        (counters that did not increase are left out).
        """
        out: dict[K, int] = {}
        for gateway_id, counts in seen.items():
            previous = self._last.get(gateway_id)
            current = {key: int(value) for key, value in counts.items()}
            self._last[gateway_id] = current
            if previous is None:
                continue  # first look: the baseline
            restarted = any(value < previous.get(key, 0) for key, value in current.items())
            if restarted:
                self.resets += 1
            for key, value in current.items():
                increase = value if restarted else value - previous.get(key, 0)
                if increase > 0:
                    out[key] = out.get(key, 0) + increase
        for gateway_id in [g for g in self._last if g not in seen]:
            del self._last[gateway_id]
        return out
