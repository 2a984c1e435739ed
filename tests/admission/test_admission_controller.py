"""Admission as a whole: quota before the fleet limit, charge only on admission, refund on
shed, priority-graded shedding, computed retry advice, exactly-once finish."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import (
    DEFAULT_SHARES,
    AdmissionController,
    AdmissionOutcome,
    AdmissionTicket,
    GradientLimiter,
    GradientLimiterConfig,
    Overloaded,
    Priority,
    PriorityShedder,
    QuotaExceeded,
    TenantConfig,
    TenantQuotas,
    TenantRegistry,
    request_cost,
)

FIXED_20 = GradientLimiterConfig(initial_limit=20, min_limit=20, max_limit=20, min_window_samples=1)


def tenant(
    name: str, priority: Priority, rate: float = 1000.0, burst: float = 10_000.0
) -> TenantConfig:
    return TenantConfig(name, (), rate=rate, burst=burst, priority=priority)


def controller(
    *tenants: TenantConfig, limiter: GradientLimiter | None = None
) -> AdmissionController:
    return AdmissionController(
        TenantQuotas(TenantRegistry(tenants)), limiter or GradientLimiter(FIXED_20, now=0.0)
    )


def admitted(result: AdmissionTicket | QuotaExceeded | Overloaded) -> AdmissionTicket:
    assert isinstance(result, AdmissionTicket), result
    return result


def test_request_cost_is_predicted_work_not_a_flat_one() -> None:
    assert request_cost(100, 28) == 128.0
    assert request_cost(0, 0) == 1.0
    with pytest.raises(ValueError):
        request_cost(-1, 5)


def test_quota_exceeded_carries_tenant_and_refill_time() -> None:
    t = tenant("acme", Priority.STANDARD, rate=100.0, burst=1000.0)
    ac = controller(t)
    admitted(ac.admit(t, 900.0, 0.0))
    refusal = ac.admit(t, 300.0, 0.0)
    assert isinstance(refusal, QuotaExceeded)
    assert refusal.tenant == "acme" and refusal.reason == "QUOTA_EXCEEDED"
    assert refusal.retry_after_s == pytest.approx(2.0)  # 100 held, 200 more at 100/s
    assert refusal.subject == "tenant:acme" and "300" in refusal.description
    admitted(ac.admit(t, 300.0, 2.0))


def test_quota_is_checked_before_the_fleet_limit() -> None:
    t = tenant("acme", Priority.STANDARD, rate=1.0, burst=10.0)
    ac = controller(
        t,
        limiter=GradientLimiter(
            GradientLimiterConfig(initial_limit=1, min_limit=1, max_limit=1), now=0.0
        ),
    )
    admitted(ac.admit(t, 5.0, 0.0))  # fills the single slot
    # Over quota AND over the limit: the tenant is told it is their quota.
    assert isinstance(ac.admit(t, 50.0, 0.0), QuotaExceeded)


def test_nothing_is_charged_when_the_fleet_refuses() -> None:
    t = tenant("acme", Priority.SHEDDABLE)
    ac = controller(t)
    before = ac.quotas.available(t, 0.0)
    tickets = [admitted(ac.admit(t, 10.0, 0.0)) for _ in range(12)]  # 60 % of 20
    refusal = ac.admit(t, 10.0, 0.0)
    assert isinstance(refusal, Overloaded)
    assert ac.quotas.available(t, 0.0) == before - 12 * 10.0
    assert ac.limiter.inflight == len(tickets)


def test_quota_is_refunded_when_the_request_is_shed_later() -> None:
    t = tenant("acme", Priority.STANDARD, rate=0.0, burst=100.0)
    ac = controller(t)
    ticket = admitted(ac.admit(t, 60.0, 0.0))
    assert ac.quotas.available(t, 0.0) == 40.0
    assert ac.finish(ticket, AdmissionOutcome.SHED, None, 0.1)
    assert ac.quotas.available(t, 0.1) == 100.0
    assert ac.limiter.inflight == 0
    # Served or failed requests keep their charge.
    for outcome in (AdmissionOutcome.SUCCESS, AdmissionOutcome.FAILED, AdmissionOutcome.CANCELLED):
        ticket = admitted(ac.admit(t, 10.0, 0.2))
        ac.finish(ticket, outcome, 0.05, 0.3)
    assert ac.quotas.available(t, 0.3) == 70.0


def test_finish_is_exactly_once() -> None:
    t = tenant("acme", Priority.STANDARD, rate=0.0, burst=100.0)
    ac = controller(t)
    ticket = admitted(ac.admit(t, 60.0, 0.0))
    assert ac.finish(ticket, AdmissionOutcome.SHED, None, 0.0)
    assert not ac.finish(ticket, AdmissionOutcome.SHED, None, 0.0)
    assert not ac.finish(ticket, AdmissionOutcome.SUCCESS, 0.01, 0.0)
    assert ac.quotas.available(t, 0.0) == 100.0 and ac.limiter.inflight == 0


def test_only_successes_feed_the_limiter() -> None:
    t = tenant("acme", Priority.CRITICAL)
    limiter = GradientLimiter(GradientLimiterConfig(min_window_samples=3), now=0.0)
    ac = controller(t, limiter=limiter)
    for outcome in (AdmissionOutcome.FAILED, AdmissionOutcome.CANCELLED, AdmissionOutcome.SHED):
        for i in range(10):
            ticket = admitted(ac.admit(t, 1.0, i * 0.5))
            ac.finish(ticket, outcome, 0.001, i * 0.5 + 0.001)
    assert limiter.updates == 0 and limiter.latency_estimate() == limiter.config.default_latency_s
    for i in range(4):
        ticket = admitted(ac.admit(t, 1.0, 10.0 + i))
        ac.finish(ticket, AdmissionOutcome.SUCCESS, None, 10.0 + i + 0.2)
    assert limiter.updates >= 1
    assert limiter.short_latency_s == pytest.approx(0.2)


def test_under_overload_sheddable_goes_first_and_critical_last() -> None:
    tenants = {p: tenant(p.value, p) for p in Priority}
    ac = controller(*tenants.values())
    held: list[AdmissionTicket] = []
    first_refused: dict[Priority, int] = {}
    for load in range(21):  # rising load: ``load`` requests already in flight
        while ac.limiter.inflight < load:
            held.append(admitted(ac.admit(tenants[Priority.CRITICAL], 1.0, 0.0)))
        for p, t in tenants.items():
            result = ac.admit(t, 1.0, 0.0)
            if isinstance(result, AdmissionTicket):
                ac.finish(result, AdmissionOutcome.CANCELLED, None, 0.0)
            else:
                assert isinstance(result, Overloaded)
                first_refused.setdefault(p, load)
    assert first_refused == {
        Priority.SHEDDABLE: 12,  # 60 % of 20
        Priority.STANDARD: 17,  # 85 % of 20
        Priority.CRITICAL: 20,  # the whole limit
    }


def test_requested_priority_is_capped_by_the_tenants() -> None:
    std = tenant("s", Priority.STANDARD)
    ac = controller(std)
    ticket = admitted(ac.admit(std, 1.0, 0.0, requested=Priority.CRITICAL))
    assert ticket.priority is Priority.STANDARD
    ticket = admitted(ac.admit(std, 1.0, 0.0, requested=Priority.SHEDDABLE))
    assert ticket.priority is Priority.SHEDDABLE


def test_overloaded_retry_after_is_computed_from_latency_and_excess() -> None:
    shedder = PriorityShedder()
    refusal = shedder.check(Priority.SHEDDABLE, inflight=20, limit=20, latency_s=0.5)
    assert isinstance(refusal, Overloaded) and refusal.reason == "OVERLOADED"
    # allowed 12; 9 of the 20 in flight must finish; 20 finish per 0.5 s.
    assert refusal.allowed == 12
    assert refusal.retry_after_s == pytest.approx(9 * 0.5 / 20)
    worse = shedder.check(Priority.SHEDDABLE, inflight=20, limit=20, latency_s=2.0)
    assert worse is not None and worse.retry_after_s > refusal.retry_after_s
    assert shedder.check(Priority.CRITICAL, inflight=19, limit=20, latency_s=0.5) is None


def test_shedder_validates_shares() -> None:
    with pytest.raises(ValueError, match="larger share"):
        PriorityShedder(
            shares={Priority.CRITICAL: 0.5, Priority.STANDARD: 0.9, Priority.SHEDDABLE: 0.1}
        )
    with pytest.raises(ValueError, match="no share"):
        PriorityShedder(shares={Priority.CRITICAL: 1.0})
    assert DEFAULT_SHARES[Priority.CRITICAL] == 1.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(Priority)),
            st.sampled_from(list(AdmissionOutcome)),
            st.floats(min_value=1.0, max_value=400.0),
            st.booleans(),
        ),
        max_size=120,
    )
)
def test_quota_balance_equals_burst_minus_work_not_shed(
    ops: list[tuple[Priority, AdmissionOutcome, float, bool]],
) -> None:
    """With no refill, a tenant's balance is exactly its burst minus admitted-and-not-shed
    work, whatever mix of refusals, sheds and finishes happens."""
    t = tenant("t", Priority.CRITICAL, rate=0.0, burst=5_000.0)
    ac = controller(t)
    open_tickets: list[AdmissionTicket] = []
    charged = 0.0
    for prio, outcome, cost, finish_one in ops:
        result = ac.admit(t, cost, 0.0, requested=prio)
        if isinstance(result, AdmissionTicket):
            open_tickets.append(result)
            charged += cost
        else:
            assert result.retry_after_s > 0 and not math.isnan(result.retry_after_s)
        if finish_one and open_tickets:
            ticket = open_tickets.pop(0)
            ac.finish(ticket, outcome, 0.01, 0.0)
            if outcome is AdmissionOutcome.SHED:
                charged -= ticket.cost
        assert ac.quotas.available(t, 0.0) == pytest.approx(5_000.0 - charged)
        assert ac.limiter.inflight == len(open_tickets)


def test_quota_refund_is_once_and_reload_keeps_balances() -> None:
    t = tenant("acme", Priority.STANDARD, rate=0.0, burst=100.0)
    quotas = TenantQuotas(TenantRegistry([t]))
    charge = quotas.charge(t, 70.0, 0.0)
    assert not isinstance(charge, QuotaExceeded)
    assert quotas.refund(charge, 0.0) and not quotas.refund(charge, 0.0)
    assert quotas.available(t, 0.0) == 100.0
    quotas.charge(t, 70.0, 0.0)  # 30 left
    smaller = tenant("acme", Priority.STANDARD, rate=10.0, burst=20.0)
    quotas.reload(TenantRegistry([smaller]), 0.0)
    assert quotas.available(smaller, 0.0) == 20.0  # balance kept, capped at the new burst
    assert quotas.check(smaller, 25.0, 0.0) is None  # a full bucket admits a larger request
    quotas.charge(smaller, 25.0, 0.0)
    refusal = quotas.check(smaller, 10.0, 0.0)
    assert refusal is not None and refusal.retry_after_s == pytest.approx(1.5)
    quotas.reload(TenantRegistry([]), 0.0)
    assert quotas.registry.get("acme") is None


def test_a_shed_blamed_on_the_queue_reaches_the_limiter() -> None:
    """``finish(..., queue_shed_budget_s=...)`` is limiter evidence; a plain shed is not."""

    def limit_after(budget: float | None) -> int:
        t = tenant("acme", Priority.STANDARD)
        limiter = GradientLimiter(
            GradientLimiterConfig(initial_limit=40, min_limit=4, max_limit=100), now=0.0
        )
        ac = controller(t, limiter=limiter)
        now = 0.0
        for _ in range(6):  # 20 offered a window; of those admitted, 1 in 5 shed for the queue
            offered = [ac.admit(t, 10.0, now) for _ in range(20)]
            tickets = [x for x in offered if isinstance(x, AdmissionTicket)]
            for i, ticket in enumerate(tickets):
                now += 0.05
                if i % 5 == 0:
                    ac.finish(ticket, AdmissionOutcome.SHED, None, now, queue_shed_budget_s=budget)
                else:
                    ac.finish(ticket, AdmissionOutcome.SUCCESS, 0.05, now)
        return limiter.limit

    assert limit_after(2.0) < 40
    assert limit_after(None) >= 40
