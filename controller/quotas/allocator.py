"""Splitting one tenant's contracted rate and burst among the gateways that serve it.

What it decides: each gateway's share of a tenant's quota, from the demand each reported.

Rules (in the spirit of YouTube's Doorman):

* **Max-min fair on demand (water-filling).** Every gateway is granted its demand, except
  that when the demands add up to more than the capacity, the largest are cut to one common
  level, the highest at which the grants still fit. A gateway asking little is never cut for
  one asking a lot.
* **Leftover as equal headroom.** When demand is below capacity, what is left is not held
  back: it is split *equally* among all the gateways reporting, including those that asked
  for nothing. Demand is measured (an average of past arrivals) and reported once a round, so
  a gateway whose clients just got busier would otherwise refuse them until the next round
  although the tenant is under its contract. Equal rather than pro-rata, because the gateway
  most likely to be starved is one whose demand was near zero (a hot spot moving onto it, a
  gateway that just joined). The shares then add up to exactly the capacity, never more: the
  headroom costs no overshoot, only the controller's ability to notice who uses it.
  When demand exceeds capacity there is no leftover and no headroom: the contract is full.
* **Burst in proportion to rate.** Each gateway's burst is the tenant's burst times its
  fraction of the rate, so the buckets of the fleet together never hold more than one
  contract's burst.

Pure: no clock, no I/O. Demands are in the quota's own unit (work tokens per second).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Share", "allocate"]


@dataclass(frozen=True)
class Share:
    """One gateway's part of one tenant's quota."""

    rate: float
    """Work tokens per second: ``fair + headroom``."""
    burst: float
    """Bucket size: the tenant's burst times ``rate / capacity``."""
    fair: float
    """The max-min fair grant on the reported demand (never more than the demand)."""
    headroom: float
    """The equal slice of unclaimed capacity every gateway gets on top (0 when contended)."""


def _check(value: float, what: str) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{what} must be finite and >= 0, got {value}")


def _water_level(capacity: float, demands: list[float]) -> float:
    """The level L with ``sum(min(d, L)) == capacity``, for ascending demands summing above it."""
    remaining = capacity
    for index, demand in enumerate(demands):
        left = len(demands) - index
        if demand * left >= remaining:
            return remaining / left
        remaining -= demand
    return demands[-1]  # unreachable when sum(demands) > capacity; keeps the type honest


def allocate(capacity: float, demands: Mapping[str, float], burst: float = 0.0) -> dict[str, Share]:
    """Each gateway's :class:`Share` of ``capacity`` (and of ``burst``) given its demand.

    ``demands`` maps gateway id to reported demand; an empty mapping gets an empty result.
    """
    _check(capacity, "capacity")
    _check(burst, "burst")
    for gateway, demand in demands.items():
        _check(demand, f"demand of {gateway!r}")
    if not demands:
        return {}
    total = math.fsum(demands.values())
    if total <= capacity:
        fair = dict(demands)
        # fsum keeps the shares' sum within an ulp of the capacity, not above it by rounding.
        headroom = max(0.0, (capacity - total) / len(demands))
    else:
        level = _water_level(capacity, sorted(demands.values()))
        fair = {gateway: min(demand, level) for gateway, demand in demands.items()}
        headroom = 0.0
    shares = {}
    for gateway, granted in fair.items():
        rate = granted + headroom
        fraction = rate / capacity if capacity > 0.0 else 1.0 / len(demands)
        shares[gateway] = Share(rate=rate, burst=burst * fraction, fair=granted, headroom=headroom)
    return shares
