"""A gateway's share of each tenant's fleet-wide quota, kept in its buckets (ADR 0003).

What it decides: when the tenant buckets (:class:`gateway.admission.quota.TenantQuotas`) are
re-sized to the share :class:`gateway.admission.quota_lease.LeasedQuotas` says is in force,
and what the gateway reports as demand. The leases arrive with fleet snapshots and the share
is re-checked once a report interval (a lease expiring is noticed then): the data path only
reads the buckets and counts arrivals, it never waits on the controller.

A bucket is re-sized only when the share changes. Before the first change it is the
configured quota, so a lone gateway (``expected_gateways=1``) that never gets a lease behaves
exactly as a gateway did before leases: its share is its configured quota.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gateway.admission.quota import TenantQuotas
from gateway.admission.quota_lease import DemandMeter, LeasedQuotas, LimitSource
from gateway.admission.tenants import TenantRegistry

__all__ = ["QuotaShares", "TenantDemandReport"]

_SOURCE_LABELS = {
    LimitSource.LEASE: "lease",
    LimitSource.FALLBACK: "fallback",
    LimitSource.STARTUP: "initial",
}


@dataclass(frozen=True)
class TenantDemandReport:
    """One tenant's line in the report: measured demand and the configured contract."""

    tenant: str
    rate: float
    contract_rate: float
    contract_burst: float


class QuotaShares:
    """Leases in, bucket sizes out, arrivals counted; one per gateway."""

    def __init__(
        self, tenants: TenantRegistry, quotas: TenantQuotas, *, expected_gateways: int, now: float
    ) -> None:
        self._tenants = tenants
        self._quotas = quotas
        self._leased = LeasedQuotas(tenants, expected_gateways=expected_gateways)
        self.demand = DemandMeter()
        # tenant -> (rate, burst) the bucket holds now: the configured quota until re-sized.
        self._in_force = {t.name: (t.rate, t.burst) for t in tenants}
        self._sources: dict[str, str] = {}
        self.refresh(now)

    def apply(
        self, tenant: str, rate: float, burst: float, ttl_s: float, gateways_known: int, now: float
    ) -> None:
        """Adopt one lease from a snapshot (a malformed one or an unknown tenant is ignored)."""
        self._leased.apply(tenant, rate, burst, ttl_s, gateways_known, now)

    def refresh(self, now: float) -> None:
        """Re-size every bucket whose share changed (a new lease, one expired)."""
        for tenant in self._tenants:
            limit = self._leased.limit(tenant.name, now)
            if limit is None:
                continue
            share = (limit.rate, limit.burst)
            configured = share == (tenant.rate, tenant.burst)
            self._sources[tenant.name] = (
                "configured"
                if configured and limit.source is LimitSource.STARTUP
                else _SOURCE_LABELS[limit.source]
            )
            if share != self._in_force[tenant.name]:
                self._quotas.set_share(tenant, limit.rate, limit.burst, now)
                self._in_force[tenant.name] = share

    def shares(self) -> dict[str, tuple[float, str]]:
        """tenant → (rate in force, source label), for the scrape."""
        return {name: (self._in_force[name][0], src) for name, src in self._sources.items()}

    def demands(self, now: float) -> Iterator[TenantDemandReport]:
        """Every tenant's demand as of ``now`` (0 if none arrived) with its contract."""
        rates = self.demand.rates(now)
        for tenant in self._tenants:
            yield TenantDemandReport(
                tenant.name, rates.get(tenant.name, 0.0), tenant.rate, tenant.burst
            )
