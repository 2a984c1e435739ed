"""Fleet-wide quota leases: who is asking for how much of each tenant, and what each may use.

What it decides: from the per-tenant demand every gateway reports with its outcome stream,
the lease each gateway gets for each tenant with a contract — its share of the rate and burst
(:func:`controller.quotas.allocator.allocate`), until when it holds, and how many gateways the
controller counted (the gateway's fallback divisor if the lease is not renewed).

Rules:

* A gateway is *live* while its latest report is younger than ``report_ttl_s``; one that stops
  reporting (crashed, partitioned, drained) is dropped from the allocation after that, and its
  share goes back to the others. :meth:`QuotaLeases.forget` drops it at once (a clean leave).
* Every live gateway gets a lease for every contracted tenant, also with zero demand: the
  equal headroom of an under-used tenant is what lets it start using it without a round trip.
* A lease holds for ``lease_ttl_s`` (a few report intervals): one lost push or report does not
  send the gateway to its fallback, and a controller that is gone stops being obeyed soon.
* **Warm-up.** A controller that just started (or restarted after an outage) grants nothing
  for one ``report_ttl_s``: before every gateway has had the chance to report, it would split
  the whole contract among the few that already did, while the others still enforce their
  fallback share on top — an overshoot of up to the whole quota.

Deterministic: the same reports at the same times give the same leases. Time is the caller's
``now`` (seconds, the controller's clock); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controller.quotas.allocator import allocate

__all__ = ["Contract", "QuotaLease", "QuotaLeases"]

DEFAULT_REPORT_TTL_S = 2.5
"""Gateways report every second: two missed reports in a row and half a second of delay."""
DEFAULT_LEASE_TTL_S = 3.0


@dataclass(frozen=True)
class Contract:
    """A tenant's fleet-wide quota: work tokens per second and bucket size."""

    tenant: str
    rate: float
    burst: float


@dataclass(frozen=True)
class QuotaLease:
    """What one gateway may admit for one tenant until ``expires_at``."""

    tenant: str
    rate: float
    burst: float
    expires_at: float
    gateways_known: int
    """Live gateways the allocation counted: the gateway's fallback is ``rate / this``."""
    granted_at: float

    @property
    def ttl_s(self) -> float:
        """How long the lease holds from its grant (what goes on the wire: clocks differ)."""
        return self.expires_at - self.granted_at


@dataclass(frozen=True)
class _Report:
    at: float
    demands: Mapping[str, float]


class QuotaLeases:
    """The controller's quota ledger: demand reports in, per-gateway leases out."""

    def __init__(
        self,
        contracts: Iterable[Contract],
        now: float,
        *,
        report_ttl_s: float = DEFAULT_REPORT_TTL_S,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
    ) -> None:
        if not (report_ttl_s > 0.0 and lease_ttl_s > 0.0):
            raise ValueError("report_ttl_s and lease_ttl_s must be > 0")
        self._contracts: dict[str, Contract] = {}
        self.set_contracts(contracts)
        self._report_ttl = report_ttl_s
        self._lease_ttl = lease_ttl_s
        self._warm_at = now + report_ttl_s
        self._reports: dict[str, _Report] = {}

    def set_contracts(self, contracts: Iterable[Contract]) -> None:
        """Adopt a new tenant config (tenants not listed get no more leases)."""
        table = {}
        for contract in contracts:
            if contract.tenant in table:
                raise ValueError(f"duplicate contract for tenant {contract.tenant!r}")
            table[contract.tenant] = contract
        self._contracts = table

    def report(self, gateway: str, demands: Mapping[str, float], now: float) -> None:
        """A gateway's measured demand per tenant (work tokens per second), as of ``now``.

        Replaces its previous report; an older report than the one held is ignored (streams
        may deliver late). Tenants without a contract are kept out of the allocation.
        """
        held = self._reports.get(gateway)
        if held is not None and held.at > now:
            return
        clean = {}
        for tenant, demand in demands.items():
            if math.isfinite(demand) and demand >= 0.0:
                clean[tenant] = float(demand)
        self._reports[gateway] = _Report(now, clean)

    def forget(self, gateway: str) -> None:
        """A gateway that left cleanly: its share goes back to the others at the next grant."""
        self._reports.pop(gateway, None)

    def live(self, now: float) -> list[str]:
        """Gateways with a report younger than the report TTL, sorted; older ones are dropped."""
        for gateway in [g for g, r in self._reports.items() if now - r.at > self._report_ttl]:
            del self._reports[gateway]
        return sorted(self._reports)

    def grant(self, now: float) -> dict[str, list[QuotaLease]]:
        """Leases for every live gateway and contracted tenant (empty during warm-up)."""
        if now < self._warm_at:
            return {}
        gateways = self.live(now)
        leases: dict[str, list[QuotaLease]] = {gateway: [] for gateway in gateways}
        if not gateways:
            return leases
        expires_at = now + self._lease_ttl
        for tenant in sorted(self._contracts):
            contract = self._contracts[tenant]
            demands = {g: self._reports[g].demands.get(tenant, 0.0) for g in gateways}
            shares = allocate(contract.rate, demands, contract.burst)
            for gateway in gateways:
                share = shares[gateway]
                leases[gateway].append(
                    QuotaLease(tenant, share.rate, share.burst, expires_at, len(gateways), now)
                )
        return leases
