"""The admission decision: quota, then fleet limit with priority shedding, charged once.

What it decides: whether a request may enter the gateway's queue. Order matters:

1. **Quota** (:class:`~gateway.admission.quota.TenantQuotas`): a tenant over its own quota is
   refused first (``QUOTA_EXCEEDED``), so one tenant's retry storm is attributed to that
   tenant instead of tripping fleet-wide shedding that punishes everyone.
2. **Fleet limit** (:class:`~gateway.admission.limiter.GradientLimiter` with
   :class:`~gateway.admission.shedder.PriorityShedder`): refused with ``OVERLOADED`` when
   the request's priority has used its share of the current limit.
3. Only then is anything charged: quota tokens are taken and an inflight slot is counted.
   A refused request costs the tenant nothing.

The :class:`AdmissionTicket` is finished exactly once with an :class:`AdmissionOutcome`:
SUCCESS feeds the limiter its latency; FAILED and CANCELLED release the slot without a
sample; SHED (the batcher later found it could not meet its deadline, or its queue was full)
also refunds the quota, because no work was done for it.

Example (servicer side)::

    admission = AdmissionController(TenantQuotas(registry), GradientLimiter(now=clock.now()))
    tenant = registry.authenticate(api_key)            # None -> UNAUTHENTICATED
    cost = request_cost(prompt_tokens, request.max_output_tokens)
    ticket = admission.admit(tenant, cost, clock.now(), requested=priority_from_proto)
    if isinstance(ticket, QuotaExceeded):              # RESOURCE_EXHAUSTED + QuotaFailure
        raise quota_exceeded(ticket.subject, ticket.description, ticket.retry_after_s)
    if isinstance(ticket, Overloaded):                 # UNAVAILABLE / OVERLOADED
        raise unavailable(ticket.reason, retry_after_s=ticket.retry_after_s)
    try:
        reply = await batcher.submit(...)
    except Shed:
        admission.finish(ticket, AdmissionOutcome.SHED, None, clock.now())
        raise
    except BaseException:
        admission.finish(ticket, AdmissionOutcome.FAILED, None, clock.now())
        raise
    admission.finish(ticket, AdmissionOutcome.SUCCESS, clock.now() - ticket.admitted_at,
                     clock.now())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gateway.admission.limiter import GradientLimiter
from gateway.admission.quota import QuotaCharge, QuotaExceeded, TenantQuotas
from gateway.admission.shedder import Overloaded, PriorityShedder
from gateway.admission.tenants import Priority, TenantConfig

__all__ = [
    "AdmissionController",
    "AdmissionOutcome",
    "AdmissionTicket",
    "request_cost",
]


def request_cost(prompt_tokens: int, max_output_tokens: int) -> float:
    """A request's cost in tokens of predicted work: what it asks the device to process.

    Prompt tokens plus the output tokens it may generate, at least 1.
    """
    if prompt_tokens < 0 or max_output_tokens < 0:
        raise ValueError("token counts must be non-negative")
    return float(max(1, prompt_tokens + max_output_tokens))


class AdmissionOutcome(StrEnum):
    SUCCESS = "success"
    """Served: latency is a limiter sample."""
    FAILED = "failed"
    """Admitted, attempted, failed: slot released, no sample, quota kept."""
    CANCELLED = "cancelled"
    """The client went away: slot released, no sample, quota kept."""
    SHED = "shed"
    """Dropped before any work was done: slot released, no sample, quota refunded."""


@dataclass(eq=False)
class AdmissionTicket:
    """An admitted request; finish it exactly once with :meth:`AdmissionController.finish`."""

    tenant: str
    priority: Priority
    cost: float
    admitted_at: float
    _charge: QuotaCharge = field(repr=False)
    _finished: bool = field(default=False, repr=False)

    @property
    def finished(self) -> bool:
        return self._finished


class AdmissionController:
    def __init__(
        self,
        quotas: TenantQuotas,
        limiter: GradientLimiter,
        shedder: PriorityShedder | None = None,
    ) -> None:
        self._quotas = quotas
        self._limiter = limiter
        self._shedder = shedder or PriorityShedder()

    @property
    def limiter(self) -> GradientLimiter:
        return self._limiter

    @property
    def quotas(self) -> TenantQuotas:
        return self._quotas

    @property
    def shedder(self) -> PriorityShedder:
        return self._shedder

    def admit(
        self,
        tenant: TenantConfig,
        cost: float,
        now: float,
        requested: Priority | None = None,
    ) -> AdmissionTicket | QuotaExceeded | Overloaded:
        """Admit one request of ``cost`` predicted-work tokens, or say why not.

        ``requested`` is the priority the request asked for; it is capped at the tenant's
        (a request may lower its own importance, never raise it above its tenant's).
        """
        priority = tenant.priority if requested is None else requested.capped_by(tenant.priority)
        refusal = self._quotas.check(tenant, cost, now)
        if refusal is not None:
            return refusal
        limiter = self._limiter
        overloaded = self._shedder.check(
            priority, limiter.inflight, limiter.limit, limiter.latency_estimate()
        )
        if overloaded is not None:
            return overloaded
        charge = self._quotas.take(tenant, cost, now)  # check() said it fits, same now
        limiter.acquire(now)
        return AdmissionTicket(tenant.name, priority, cost, now, charge)

    def finish(
        self,
        ticket: AdmissionTicket,
        outcome: AdmissionOutcome,
        latency_s: float | None,
        now: float,
        *,
        queue_shed_budget_s: float | None = None,
    ) -> bool:
        """Release ``ticket``. Returns False (doing nothing) if it was already finished.

        ``latency_s`` is used only for SUCCESS (default: ``now - ticket.admitted_at``).
        ``queue_shed_budget_s``, only for SHED: the request was shed because of the queue ahead
        of it, with this much time to its deadline when admitted (limiter evidence).
        """
        if ticket._finished:
            return False
        ticket._finished = True
        if outcome is AdmissionOutcome.SUCCESS:
            sample = now - ticket.admitted_at if latency_s is None else latency_s
            self._limiter.release(now, sample)
        elif outcome is AdmissionOutcome.SHED:
            self._limiter.release(now, None, queue_shed_budget_s=queue_shed_budget_s)
        else:
            self._limiter.release(now, None)
        if outcome is AdmissionOutcome.SHED:
            self._quotas.refund(ticket._charge, now)
        return True
