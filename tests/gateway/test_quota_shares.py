"""QuotaShares: leases re-size the tenant buckets only when the share changes."""

from __future__ import annotations

import pytest

from gateway.admission import TenantConfig, TenantQuotas, TenantRegistry
from gateway.admission.quota_shares import QuotaShares


def _registry() -> TenantRegistry:
    return TenantRegistry([TenantConfig("t", (), rate=100.0, burst=200.0)])


def test_a_lone_gateway_keeps_its_configured_quota() -> None:
    quotas = TenantQuotas(_registry())
    shares = QuotaShares(_registry(), quotas, expected_gateways=1, now=0.0)
    assert shares.shares() == {"t": (100.0, "configured")}
    assert quotas.available(_registry().get("t"), 0.0) == pytest.approx(200.0)  # type: ignore[arg-type]


def test_initial_share_then_lease_then_fallback() -> None:
    registry = _registry()
    tenant = registry.get("t")
    assert tenant is not None
    quotas = TenantQuotas(registry)
    shares = QuotaShares(registry, quotas, expected_gateways=2, now=0.0)
    assert shares.shares() == {"t": (50.0, "initial")}
    assert quotas.available(tenant, 0.0) == pytest.approx(100.0)
    shares.apply("t", 30.0, 60.0, 3.0, 3, now=1.0)
    shares.refresh(1.0)
    assert shares.shares() == {"t": (30.0, "lease")}
    shares.refresh(4.5)  # the lease ran out: contract / gateways_known
    rate, source = shares.shares()["t"]
    assert source == "fallback"
    assert rate == pytest.approx(100.0 / 3)


def test_demand_is_reported_with_the_contract() -> None:
    registry = _registry()
    shares = QuotaShares(registry, TenantQuotas(registry), expected_gateways=1, now=0.0)
    shares.demand.observe("t", 10.0, 0.0)
    (line,) = shares.demands(0.0)
    assert (line.tenant, line.contract_rate, line.contract_burst) == ("t", 100.0, 200.0)
    assert line.rate == pytest.approx(10.0)
