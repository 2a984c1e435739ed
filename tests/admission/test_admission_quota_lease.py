"""A gateway's share of a fleet-wide quota: lease, fallback, startup; demand it reports."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.admission.quota import QuotaCharge, TenantQuotas
from gateway.admission.quota_lease import DemandMeter, LeasedQuotas, LimitSource, QuotaLimit
from gateway.admission.tenants import TenantConfig, TenantRegistry

ACME = TenantConfig("acme", (), rate=100.0, burst=200.0)


def test_before_any_lease_the_startup_count_divides_the_quota() -> None:
    policy = LeasedQuotas([ACME], expected_gateways=4)
    assert policy.limit("acme", 0.0) == QuotaLimit(25.0, 50.0, LimitSource.STARTUP)


def test_only_a_gateway_told_it_is_alone_starts_with_the_whole_quota() -> None:
    alone = LeasedQuotas([ACME], expected_gateways=1)
    assert alone.limit("acme", 0.0) == QuotaLimit(100.0, 200.0, LimitSource.STARTUP)
    with pytest.raises(ValueError):
        LeasedQuotas([ACME], expected_gateways=0)


def test_a_fresh_lease_is_obeyed_then_falls_back_to_rate_over_the_fleet_it_counted() -> None:
    policy = LeasedQuotas([ACME], expected_gateways=4)
    assert policy.apply("acme", 70.0, 140.0, ttl_s=3.0, gateways_known=5, now=10.0)
    assert policy.limit("acme", 12.9) == QuotaLimit(70.0, 140.0, LimitSource.LEASE)
    assert policy.limit("acme", 13.0) == QuotaLimit(20.0, 40.0, LimitSource.FALLBACK)
    # Renewed: the lease again.
    policy.apply("acme", 10.0, 20.0, ttl_s=3.0, gateways_known=5, now=20.0)
    assert policy.limit("acme", 21.0) == QuotaLimit(10.0, 20.0, LimitSource.LEASE)


def test_tenants_without_a_fleet_contract_keep_their_configured_quota() -> None:
    policy = LeasedQuotas([ACME], expected_gateways=2)
    assert not policy.covers("other")
    assert policy.limit("other", 0.0) is None
    assert not policy.apply("other", 1.0, 1.0, 3.0, 2, 0.0)


@pytest.mark.parametrize(
    ("rate", "burst", "ttl", "known"),
    [(math.nan, 1.0, 3.0, 2), (-1.0, 1.0, 3.0, 2), (1.0, math.inf, 3.0, 2), (1.0, 1.0, 3.0, 0)],
)
def test_a_malformed_lease_is_ignored(rate: float, burst: float, ttl: float, known: int) -> None:
    policy = LeasedQuotas([ACME], expected_gateways=2)
    assert not policy.apply("acme", rate, burst, ttl, known, 0.0)
    limit = policy.limit("acme", 0.0)
    assert limit is not None and limit.source is LimitSource.STARTUP


def test_a_zero_lease_still_gives_the_bucket_a_valid_burst() -> None:
    policy = LeasedQuotas([ACME], expected_gateways=2)
    policy.apply("acme", 0.0, 0.0, 3.0, 2, 0.0)
    limit = policy.limit("acme", 1.0)
    assert limit is not None and limit.rate == 0.0 and limit.burst > 0.0
    TenantQuotas(TenantRegistry([ACME])).set_share(ACME, limit.rate, limit.burst, 1.0)


@given(
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=0.0, max_value=1e3),
    st.floats(min_value=0.0, max_value=10.0),
)
def test_never_the_whole_quota_on_expiry_unless_alone(
    known: int, rate: float, after: float
) -> None:
    policy = LeasedQuotas([ACME], expected_gateways=known)
    policy.apply("acme", rate, rate * 2.0, ttl_s=1.0, gateways_known=known, now=0.0)
    limit = policy.limit("acme", 1.0 + after)
    assert limit is not None and limit.source is LimitSource.FALLBACK
    assert limit.rate == pytest.approx(ACME.rate / known)
    assert limit.rate < ACME.rate or known == 1


def test_set_share_keeps_the_balance_refilled_at_the_old_rate() -> None:
    quotas = TenantQuotas(TenantRegistry([ACME]))
    quotas.set_share(ACME, 10.0, 40.0, 0.0)  # first use: full bucket of the share
    assert quotas.available(ACME, 0.0) == 40.0
    assert isinstance(quotas.charge(ACME, 40.0, 0.0), QuotaCharge)
    quotas.set_share(ACME, 100.0, 20.0, 1.0)  # one second at 10/s, then the new share
    assert quotas.available(ACME, 1.0) == pytest.approx(10.0)
    assert quotas.available(ACME, 1.05) == pytest.approx(15.0)
    quotas.set_share(ACME, 100.0, 5.0, 1.05)  # a smaller burst caps the balance
    assert quotas.available(ACME, 1.05) == pytest.approx(5.0)


def test_demand_meter_measures_a_steady_stream() -> None:
    meter = DemandMeter(tau_s=1.0)
    for i in range(2000):
        meter.observe("acme", 2.0, i * 0.01)  # 100 arrivals/s of cost 2
    assert meter.rates(20.0)["acme"] == pytest.approx(200.0, rel=0.02)
    # Silence decays it: one time constant later, e^-1 of it.
    assert meter.rates(21.0)["acme"] == pytest.approx(200.0 / math.e, rel=0.02)


def test_demand_meter_ignores_time_going_backwards_and_rejects_bad_tau() -> None:
    meter = DemandMeter(tau_s=2.0)
    meter.observe("acme", 1.0, 5.0)
    meter.observe("acme", 1.0, 4.0)
    assert meter.rates(5.0) == {"acme": pytest.approx(1.0)}
    assert DemandMeter().rates(0.0) == {}
    with pytest.raises(ValueError):
        DemandMeter(tau_s=0.0)
