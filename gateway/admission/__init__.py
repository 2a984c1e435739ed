"""Admission policy: who may send work, how much, and what the fleet turns away first.

Pure policy (no gRPC, no asyncio, no wall clock): times are explicit ``now`` arguments.

* :class:`TenantRegistry` / :class:`TenantConfig` / :class:`Priority` — tenants from YAML,
  keys stored as SHA-256 and compared in constant time; :meth:`TenantRegistry.demo` for
  local runs (keys ``demo-key-premium``, ``demo-key-standard``, ``demo-key-batch``).
* :class:`TokenBucket`, :class:`TenantQuotas` — per-tenant quota in predicted-work tokens,
  charged on admission, refunded if shed, retry-after from the refill time.
* :class:`GradientLimiter` — adaptive concurrency limit from short- vs long-window latency.
* :class:`PriorityShedder` — lower priorities get a lower share of the limit.
* :class:`AdmissionController` — the three in order; returns an :class:`AdmissionTicket` or
  a refusal (:class:`QuotaExceeded`, :class:`Overloaded`) carrying its computed retry-after
  and ``ErrorInfo`` reason.

Example::

    from gateway.admission import (AdmissionController, AdmissionOutcome, GradientLimiter,
                                   Overloaded, QuotaExceeded, TenantQuotas, TenantRegistry,
                                   request_cost)

    registry = TenantRegistry.from_yaml("deploy/tenants.yaml")   # or TenantRegistry.demo()
    admission = AdmissionController(TenantQuotas(registry), GradientLimiter(now=clock.now()))

    tenant = registry.authenticate(api_key)
    if tenant is None:
        ...                                                    # UNAUTHENTICATED
    result = admission.admit(tenant, request_cost(prompt_tokens, max_output), clock.now())
    if isinstance(result, QuotaExceeded | Overloaded):
        ...                  # rich error: result.reason, result.retry_after_s
    else:
        ...                  # serve; then admission.finish(result, AdmissionOutcome.X, ...)
"""

from gateway.admission.controller import (
    AdmissionController,
    AdmissionOutcome,
    AdmissionTicket,
    request_cost,
)
from gateway.admission.limiter import GradientLimiter, GradientLimiterConfig
from gateway.admission.quota import QuotaCharge, QuotaExceeded, TenantQuotas
from gateway.admission.shedder import DEFAULT_SHARES, Overloaded, PriorityShedder
from gateway.admission.tenants import (
    Priority,
    Tenant,
    TenantConfig,
    TenantRegistry,
    hash_api_key,
)
from gateway.admission.token_bucket import TokenBucket

__all__ = [
    "DEFAULT_SHARES",
    "AdmissionController",
    "AdmissionOutcome",
    "AdmissionTicket",
    "GradientLimiter",
    "GradientLimiterConfig",
    "Overloaded",
    "Priority",
    "PriorityShedder",
    "QuotaCharge",
    "QuotaExceeded",
    "Tenant",
    "TenantConfig",
    "TenantQuotas",
    "TenantRegistry",
    "TokenBucket",
    "hash_api_key",
    "request_cost",
]
