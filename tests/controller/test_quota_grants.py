"""QuotaGrants: contracts and demand from reports, leases per gateway, forget on leave."""

from __future__ import annotations

import pytest

from common.clock import ManualClock
from controller.quotas.grants import QuotaGrants
from halcyon.v1 import control_pb2


def _demand(rate: float) -> list[control_pb2.TenantDemand]:
    return [
        control_pb2.TenantDemand(
            tenant="t", rate_per_s=rate, contract_rate_per_s=100.0, contract_burst=200.0
        )
    ]


def test_grants_split_the_contract_and_wake_the_streams() -> None:
    clock = ManualClock()
    woken: list[int] = []
    grants = QuotaGrants(clock, lambda: woken.append(1))
    grants.report("a", _demand(150.0))
    grants.report("b", _demand(150.0))
    grants.grant()  # warm-up: nothing yet
    assert grants.leases_for("a") == [] and woken == []
    clock.advance(3.0)
    grants.report("a", _demand(150.0))
    grants.report("b", _demand(150.0))
    grants.grant()
    (lease_a,) = grants.leases_for("a")
    (lease_b,) = grants.leases_for("b")
    assert lease_a.rate_per_s + lease_b.rate_per_s == pytest.approx(100.0)
    assert lease_a.gateways_known == 2 and lease_a.ttl.seconds == 3
    assert woken == [1]
    grants.forget("b")
    grants.grant()
    (alone,) = grants.leases_for("a")
    assert alone.rate_per_s == pytest.approx(100.0) and alone.gateways_known == 1
    assert grants.leases_for("b") == []


def test_a_gateway_without_tenants_gets_no_lease() -> None:
    clock = ManualClock()
    grants = QuotaGrants(clock, lambda: None)
    clock.advance(3.0)
    grants.report("a", [])
    grants.grant()
    assert grants.leases_for("a") == []
