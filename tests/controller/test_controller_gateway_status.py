"""A gateway's breakers, sheds by reason and tenants: validated per item, kept, in GetState."""

from __future__ import annotations

from controller_helpers import FLEET, OPERATOR, StackFactory

from common.clock import ManualClock
from controller.outcomes import MAX_TENANTS, OutcomeAggregator
from halcyon.v1 import control_pb2

B = control_pb2.BreakerState


def status_report(**kw: object) -> control_pb2.ReportOutcomesRequest:
    fields: dict[str, object] = {
        "gateway_id": "gw-1",
        "breakers": [
            control_pb2.ReplicaBreaker(replica_id="r1", state=B.BREAKER_STATE_CLOSED),
            control_pb2.ReplicaBreaker(replica_id="r2", state=B.BREAKER_STATE_OPEN),
        ],
        "sheds": [control_pb2.ShedCount(reason="quota_exceeded", count=7)],
        "tenants": [
            control_pb2.TenantTraffic(
                tenant="acme", requests=10, admitted=3, quota_refused=7, ok=3, errors=0
            )
        ],
    }
    fields.update(kw)
    return control_pb2.ReportOutcomesRequest(**fields)  # type: ignore[arg-type]


def test_well_formed_status_is_kept_as_reported() -> None:
    outcomes = OutcomeAggregator(ManualClock(0.0))
    result = outcomes.ingest(status_report())
    assert result.dropped == {}
    [gw] = outcomes.gateways()
    assert [(b.replica_id, b.state) for b in gw.breakers] == [
        ("r1", B.BREAKER_STATE_CLOSED),
        ("r2", B.BREAKER_STATE_OPEN),
    ]
    assert [(s.reason, s.count) for s in gw.sheds] == [("quota_exceeded", 7)]
    assert [(t.tenant, t.requests, t.quota_refused) for t in gw.tenants] == [("acme", 10, 7)]


def test_each_malformed_item_is_dropped_and_counted_and_the_rest_kept() -> None:
    outcomes = OutcomeAggregator(ManualClock(0.0))
    report = status_report(
        breakers=[
            control_pb2.ReplicaBreaker(replica_id="r1", state=B.BREAKER_STATE_HALF_OPEN),
            control_pb2.ReplicaBreaker(replica_id="", state=B.BREAKER_STATE_OPEN),
            control_pb2.ReplicaBreaker(replica_id="r3"),  # state unset
            control_pb2.ReplicaBreaker(replica_id="r4", state=99),  # type: ignore[arg-type]
            control_pb2.ReplicaBreaker(replica_id="r" * 254, state=B.BREAKER_STATE_OPEN),
            control_pb2.ReplicaBreaker(replica_id="r1", state=B.BREAKER_STATE_OPEN),  # repeat
        ],
        sheds=[
            control_pb2.ShedCount(reason="overloaded", count=2),
            control_pb2.ShedCount(reason="x" * 65, count=1),
            control_pb2.ShedCount(reason="", count=1),
        ],
        tenants=[
            control_pb2.TenantTraffic(tenant="acme", requests=1),
            control_pb2.TenantTraffic(tenant="t" * 129, requests=1),
            control_pb2.TenantTraffic(tenant=" ", requests=1),
            control_pb2.TenantTraffic(tenant="acme", requests=5),  # repeat
        ],
    )
    result = outcomes.ingest(report)
    assert result.dropped == {"invalid_breaker": 5, "invalid_shed_count": 2, "invalid_tenant": 3}
    assert result.problem == "breakers[1].replica_id: must not be empty"
    [gw] = outcomes.gateways()
    assert [(b.replica_id, b.state) for b in gw.breakers] == [("r1", B.BREAKER_STATE_HALF_OPEN)]
    assert [s.reason for s in gw.sheds] == ["overloaded"]
    assert [(t.tenant, t.requests) for t in gw.tenants] == [("acme", 1)]


def test_tenants_beyond_the_limit_are_dropped_and_counted() -> None:
    outcomes = OutcomeAggregator(ManualClock(0.0))
    tenants = [control_pb2.TenantTraffic(tenant=f"t{i:04d}") for i in range(MAX_TENANTS + 3)]
    result = outcomes.ingest(status_report(tenants=tenants))
    assert result.dropped == {"invalid_tenant": 3}
    [gw] = outcomes.gateways()
    assert len(gw.tenants) == MAX_TENANTS


def test_a_new_report_replaces_the_status_and_a_silent_gateway_ages_out() -> None:
    clock = ManualClock(0.0)
    outcomes = OutcomeAggregator(clock, gateway_ttl_s=10.0)
    outcomes.ingest(status_report())
    clock.advance(5.0)
    outcomes.ingest(status_report(breakers=[], sheds=[control_pb2.ShedCount(reason="a", count=1)]))
    [gw] = outcomes.gateways()
    assert (len(gw.breakers), [s.reason for s in gw.sheds]) == (0, ["a"])
    clock.advance(10.5)
    assert outcomes.gateways() == []


async def test_getstate_returns_breakers_sheds_and_tenants(start_stack: StackFactory) -> None:
    stack = await start_stack()
    bad = control_pb2.ShedCount(reason="y" * 100, count=1)
    report = status_report()
    report.sheds.append(bad)
    resp = await stack.stub.ReportOutcomes(iter([report]), metadata=FLEET)
    assert resp.reports_received == 1
    state = await stack.stub.GetState(control_pb2.GetStateRequest(), metadata=OPERATOR)
    [gw] = state.gateways
    assert [(b.replica_id, b.state) for b in gw.breakers] == [
        ("r1", B.BREAKER_STATE_CLOSED),
        ("r2", B.BREAKER_STATE_OPEN),
    ]
    assert [(s.reason, s.count) for s in gw.sheds] == [("quota_exceeded", 7)]
    [tenant] = gw.tenants
    assert (tenant.tenant, tenant.requests, tenant.admitted, tenant.quota_refused, tenant.ok) == (
        "acme", 10, 3, 7, 3,
    )  # fmt: skip
    dropped = stack.metric("halcyon_controller_dropped_outcomes_total", reason="invalid_shed_count")
    assert dropped == 1
