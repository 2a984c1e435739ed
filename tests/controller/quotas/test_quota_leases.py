"""Quota leases: reports in, per-gateway leases out; gateways leaving; warm-up after a start."""

from __future__ import annotations

import math

import pytest

from controller.quotas import Contract, QuotaLease, QuotaLeases

ACME = Contract("acme", rate=100.0, burst=200.0)
GLOBEX = Contract("globex", rate=40.0, burst=40.0)


def ledger(now: float = 0.0) -> QuotaLeases:
    return QuotaLeases([ACME, GLOBEX], now, report_ttl_s=2.5, lease_ttl_s=3.0)


def by_tenant(leases: list[QuotaLease]) -> dict[str, QuotaLease]:
    return {lease.tenant: lease for lease in leases}


def test_grants_nothing_during_warm_up_then_every_gateway_and_tenant() -> None:
    q = ledger()
    q.report("g1", {"acme": 80.0}, 0.5)
    q.report("g2", {"acme": 80.0, "globex": 10.0}, 0.6)
    assert q.grant(2.0) == {}
    grants = q.grant(3.0)
    assert sorted(grants) == ["g1", "g2"]
    g1, g2 = by_tenant(grants["g1"]), by_tenant(grants["g2"])
    assert g1["acme"].rate == pytest.approx(50.0) and g2["acme"].rate == pytest.approx(50.0)
    assert g1["acme"].burst + g2["acme"].burst == pytest.approx(200.0)
    # g1 wants no globex but gets half of the unclaimed 30/s, so it can start at once.
    assert g1["globex"].rate == pytest.approx(15.0)
    assert g2["globex"].rate == pytest.approx(25.0)
    lease = g1["acme"]
    assert (lease.expires_at, lease.gateways_known, lease.ttl_s) == (6.0, 2, 3.0)


def test_a_gateway_that_stops_reporting_is_dropped_after_the_ttl() -> None:
    q = ledger()
    q.report("g1", {"acme": 80.0}, 0.0)
    q.report("g2", {"acme": 80.0}, 0.0)
    q.report("g1", {"acme": 80.0}, 2.0)
    assert q.live(2.5) == ["g1", "g2"]
    assert q.live(2.6) == ["g1"]
    grants = q.grant(3.0)
    assert list(grants) == ["g1"]
    assert by_tenant(grants["g1"])["acme"].rate == pytest.approx(100.0)
    assert by_tenant(grants["g1"])["acme"].gateways_known == 1


def test_forget_drops_a_gateway_at_once() -> None:
    q = ledger()
    q.report("g1", {"acme": 1.0}, 0.0)
    q.forget("g1")
    q.forget("never-seen")
    assert q.live(0.0) == []
    assert q.grant(5.0) == {}


def test_late_reports_do_not_replace_newer_ones_and_bad_values_are_dropped() -> None:
    q = ledger()
    q.report("g1", {"acme": 10.0}, 2.0)
    q.report("g1", {"acme": 90.0}, 1.0)
    q.report("g2", {"acme": math.nan, "globex": -1.0, "unknown": 5.0}, 2.0)
    grants = q.grant(3.0)
    # g1 keeps its newer 10/s; g2 asked for nothing usable: both share the rest equally.
    assert by_tenant(grants["g1"])["acme"].rate == pytest.approx(55.0)
    assert by_tenant(grants["g2"])["acme"].rate == pytest.approx(45.0)
    assert {lease.tenant for lease in grants["g2"]} == {"acme", "globex"}


def test_same_inputs_same_leases() -> None:
    def run() -> dict[str, list[QuotaLease]]:
        q = ledger()
        for i, gateway in enumerate(["g3", "g1", "g2"]):
            q.report(gateway, {"acme": 30.0 * (i + 1), "globex": 5.0 * i}, 0.1 * i)
        return q.grant(2.5)

    assert run() == run()


def test_new_contracts_replace_the_old_ones() -> None:
    q = ledger()
    q.report("g1", {"acme": 1.0}, 0.0)
    q.set_contracts([GLOBEX])
    assert [lease.tenant for lease in q.grant(2.5)["g1"]] == ["globex"]
    with pytest.raises(ValueError):
        q.set_contracts([ACME, ACME])


def test_rejects_nonsense_ttls() -> None:
    with pytest.raises(ValueError):
        QuotaLeases([ACME], 0.0, report_ttl_s=0.0)
