"""What a gateway's report says of its breakers, sheds and tenants: read from the metrics'
own counters and the routers' breakers, tenants capped with the rest summed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from common.buffered_metrics import ScrapeHooks
from gateway.controller_link import (
    MAX_REPORTED_TENANTS,
    OTHER_TENANTS,
    GatewayHealth,
    add_health,
)
from gateway.metrics import NO_TENANT, GatewayMetrics, TenantTotals
from gateway.routing.breaker import BreakerState
from halcyon.v1 import control_pb2


def metrics() -> GatewayMetrics:
    registry = CollectorRegistry()
    hooks = ScrapeHooks()
    registry.register(hooks)
    return GatewayMetrics(registry, hooks)


def test_shed_totals_sum_priorities_and_are_the_counters_themselves() -> None:
    m = metrics()
    for priority in ("critical", "standard", "sheddable"):
        m.count_shed("quota_exceeded", priority)
    m.count_shed("overloaded", "standard")
    totals = m.shed_totals()
    assert totals["quota_exceeded"] == 3
    assert totals["overloaded"] == 1
    assert totals["queue_full"] == 0
    m.count_shed("quota_exceeded", "standard")
    assert m.shed_totals()["quota_exceeded"] == 4  # cumulative: never reset by a read


def test_tenant_totals_classify_outcomes_and_leave_out_calls_with_no_tenant() -> None:
    m = metrics()
    acme = m.series("acme", "resnet", "v1")
    for _ in range(3):
        acme.answered(0.01, on_time=True)
    acme.outcomes["upstream_failure"].inc()
    acme.outcomes["queue_full"].inc()
    m.series("acme", "resnet", "none").outcomes["quota_exceeded"].inc()
    m.series("acme", "resnet", "none").outcomes["quota_exceeded"].inc()
    m.series(NO_TENANT, "unknown", "none").outcomes["unauthenticated"].inc()
    totals = m.tenant_totals()
    assert set(totals) == {"acme"}
    assert totals["acme"] == TenantTotals(
        requests=7, admitted=5, quota_refused=2, shed=1, ok=3, errors=1
    )


def test_report_names_breakers_sheds_and_tenants() -> None:
    report = control_pb2.ReportOutcomesRequest()
    add_health(
        report,
        GatewayHealth(
            breakers=[("r2", BreakerState.OPEN), ("r1", BreakerState.HALF_OPEN)],
            sheds={"quota_exceeded": 4, "overloaded": 0},
            tenants={"acme": TenantTotals(requests=5, quota_refused=4, ok=1, admitted=1)},
        ),
    )
    assert [(b.replica_id, b.state) for b in report.breakers] == [
        ("r1", control_pb2.BREAKER_STATE_HALF_OPEN),
        ("r2", control_pb2.BREAKER_STATE_OPEN),
    ]
    assert [(s.reason, s.count) for s in report.sheds] == [("overloaded", 0), ("quota_exceeded", 4)]
    [acme] = report.tenants
    assert (acme.tenant, acme.requests, acme.quota_refused, acme.ok) == ("acme", 5, 4, 1)


def test_tenants_beyond_the_cap_are_summed_as_other_in_name_order() -> None:
    n = MAX_REPORTED_TENANTS + 4
    tenants = {f"t{i:04d}": TenantTotals(requests=1, ok=1) for i in range(n)}
    report = control_pb2.ReportOutcomesRequest()
    add_health(report, GatewayHealth(tenants=tenants))
    assert len(report.tenants) == MAX_REPORTED_TENANTS + 1
    assert [t.tenant for t in report.tenants[:2]] == ["t0000", "t0001"]
    other = report.tenants[-1]
    assert (other.tenant, other.requests, other.ok) == (OTHER_TENANTS, 4, 4)
    assert sum(t.requests for t in report.tenants) == n
