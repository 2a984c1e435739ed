"""Per-tenant quotas: one token bucket per tenant, charged on admission, refunded on shed.

What it decides: whether a tenant's request fits its quota now; if not, a
:class:`QuotaExceeded` carrying everything the ``RESOURCE_EXHAUSTED`` rich error needs (the
tenant, the cost, the quota and the retry-after computed from the bucket's refill time).

Why charge and refund as separate steps: the original spent quota on requests that were
then shed, so retrying clients burned their quota on work that never ran and success fell to
42 % (defect 9). Here a charge is a :class:`QuotaCharge` handle that can be refunded once.

Quotas are per gateway instance: ``n`` gateways allow ``n`` times the burst. Quotas are
fairness between tenants; protecting the fleet is the concurrency limiter's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.admission.tenants import TenantConfig, TenantRegistry
from gateway.admission.token_bucket import TokenBucket

__all__ = ["QuotaCharge", "QuotaExceeded", "TenantQuotas"]


def _duration(seconds: float) -> str:
    return f"{seconds * 1000.0:.1f} ms" if seconds < 1.0 else f"{seconds:.2f} s"


@dataclass(frozen=True)
class QuotaExceeded:
    """A request refused for the tenant's own quota (``RESOURCE_EXHAUSTED``)."""

    tenant: str
    cost: float
    retry_after_s: float
    """Seconds until the bucket holds the cost (refill time); ``inf`` if it never refills."""
    rate: float
    burst: float
    reason: str = "QUOTA_EXCEEDED"
    """The ``ErrorInfo.reason`` (``common.errors.Reason`` value)."""
    balance: float | None = None
    """Work tokens in the tenant's bucket when it was refused (negative while paying off a
    request larger than the burst)."""

    @property
    def subject(self) -> str:
        """``QuotaFailure.Violation.subject``."""
        return f"tenant:{self.tenant}"

    @property
    def description(self) -> str:
        """What was asked, what is left, and when it will be enough: without the balance,
        "needs 66 tokens, burst 40000" reads like a bug."""
        need = f"request needs {self.cost:.0f} work tokens"
        if self.cost > self.burst:
            need += f" (more than the burst: it waits for a full bucket of {self.burst:.0f})"
        have = "" if self.balance is None else f", the tenant has {self.balance:.0f} left"
        quota = f"quota {self.rate:.0f}/s, burst {self.burst:.0f}"
        if not math.isfinite(self.retry_after_s):
            return f"{need}{have} ({quota}); the quota never refills: raise it"
        return f"{need}{have} ({quota}); enough in {_duration(self.retry_after_s)}, retry then"


@dataclass(eq=False)
class QuotaCharge:
    """Tokens taken from one tenant for one admitted request; refundable once."""

    tenant: str
    cost: float
    _refunded: bool = field(default=False, repr=False)

    @property
    def refunded(self) -> bool:
        return self._refunded


class TenantQuotas:
    """A bucket per tenant in a :class:`TenantRegistry`, created full on first use."""

    def __init__(self, registry: TenantRegistry) -> None:
        self._registry = registry
        self._buckets: dict[str, TokenBucket] = {}

    @property
    def registry(self) -> TenantRegistry:
        return self._registry

    def _bucket(self, tenant: TenantConfig, now: float) -> TokenBucket:
        bucket = self._buckets.get(tenant.name)
        if bucket is None:
            bucket = TokenBucket(tenant.rate, tenant.burst, now)
            self._buckets[tenant.name] = bucket
        return bucket

    def check(self, tenant: TenantConfig, cost: float, now: float) -> QuotaExceeded | None:
        """None if ``cost`` fits now, else the refusal with its retry-after. Charges nothing."""
        bucket = self._bucket(tenant, now)
        wait = bucket.time_until(cost, now)
        if wait <= 0.0:
            return None
        return QuotaExceeded(
            tenant.name, cost, wait, bucket.rate, bucket.burst, balance=bucket.tokens(now)
        )

    def charge(self, tenant: TenantConfig, cost: float, now: float) -> QuotaCharge | QuotaExceeded:
        """Take ``cost`` tokens if they fit now."""
        refusal = self.check(tenant, cost, now)
        if refusal is not None:
            return refusal
        self._bucket(tenant, now).take(cost, now)
        return QuotaCharge(tenant.name, cost)

    def take(self, tenant: TenantConfig, cost: float, now: float) -> QuotaCharge:
        """Take ``cost`` tokens that :meth:`check` just said fit (same ``now``, no check)."""
        self._bucket(tenant, now).take(cost, now)
        return QuotaCharge(tenant.name, cost)

    def refund(self, charge: QuotaCharge, now: float) -> bool:
        """Return a charge's tokens (request shed before doing work). False if already done."""
        if charge._refunded:
            return False
        charge._refunded = True
        bucket = self._buckets.get(charge.tenant)
        if bucket is not None:
            bucket.refund(charge.cost, now)
        return True

    def set_share(self, tenant: TenantConfig, rate: float, burst: float, now: float) -> None:
        """Hold ``tenant`` to ``rate`` and ``burst`` instead of its configured quota: its share
        of a fleet-wide contract (``gateway.admission.quota_lease``). The balance carries over
        (refilled at the old rate up to ``now``, then capped at the new burst); a tenant not
        seen yet starts with a full bucket of the share, never of the whole quota."""
        bucket = self._buckets.get(tenant.name)
        if bucket is None:
            self._buckets[tenant.name] = TokenBucket(rate, burst, now)
        else:
            bucket.reconfigure(rate, burst, now)

    def available(self, tenant: TenantConfig, now: float) -> float:
        return self._bucket(tenant, now).tokens(now)

    def reload(self, registry: TenantRegistry, now: float) -> None:
        """Adopt a new tenant config; balances carry over, removed tenants are forgotten."""
        self._registry = registry
        for name in list(self._buckets):
            tenant = registry.get(name)
            if tenant is None:
                del self._buckets[name]
            else:
                self._buckets[name].reconfigure(tenant.rate, tenant.burst, now)
