"""What a gateway enforces for a tenant whose quota is shared by the fleet, and what it reports.

What it decides: for each tenant under a fleet-wide contract, the rate and burst this
gateway's bucket holds it to now (:meth:`LeasedQuotas.limit`), and the demand it measured for
that tenant, to report to the controller (:class:`DemandMeter`).

Rules:

* **A fresh lease is obeyed.** The controller's share (``controller.quotas``) holds until the
  lease's TTL runs out, measured on this gateway's clock from receipt (hosts' clocks differ;
  the transit delay makes the lease a little longer, never a lot).
* **An expired lease falls back to ``rate / gateways_known``** (and the burst likewise), the
  fleet size the last lease counted: the controller being away must never turn into every
  gateway admitting the whole contract again (ADR 0003). It is conservative: with skewed
  demand the busy gateways refuse what idle ones would not use.
* **Before any lease** the gateway enforces ``rate / expected_gateways``, the fleet size it was
  started with (the deployment's replica count). There is deliberately no default: only a
  gateway told ``expected_gateways=1`` — that it is alone — enforces the whole quota before the
  controller has spoken. Guessing "alone" would reopen the n-fold overshoot at every restart.
* Tenants not under a fleet contract get ``None``: their quota stays as configured, as today.
* **Demand** is an exponentially weighted rate of arrivals per second, admitted *and*
  refused (refusals are demand the share did not cover; counting only admissions would
  report the share back and never grow it). Time constant ``tau_s``, 1 s (the report
  interval) by default: in ``halcyon bench --scenario quotas`` it refused less under-quota
  demand than 0.5, 2 or 4 s — shorter is noisier, longer lags a hot spot moving.

Pure: time is the caller's ``now`` (seconds); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from gateway.admission.tenants import TenantConfig

__all__ = ["DemandMeter", "LeasedQuotas", "LimitSource", "QuotaLimit"]

DEFAULT_DEMAND_TAU_S = 1.0
_MIN_BURST = 1e-6
"""A token bucket needs a burst > 0; a lease of rate 0 gets this (nothing, in effect)."""


class LimitSource(StrEnum):
    """Where the limit in force comes from."""

    LEASE = "lease"
    FALLBACK = "fallback"
    """The lease expired: ``rate / gateways_known``."""
    STARTUP = "startup"
    """No lease yet: ``rate / expected_gateways``."""


@dataclass(frozen=True)
class QuotaLimit:
    """The rate and burst this gateway holds one tenant to now."""

    rate: float
    burst: float
    source: LimitSource


@dataclass(frozen=True)
class _Held:
    rate: float
    burst: float
    expires_at: float
    gateways_known: int


class LeasedQuotas:
    """Per tenant under a fleet contract: the latest lease, and the limit it implies now."""

    def __init__(self, tenants: Iterable[TenantConfig], *, expected_gateways: int) -> None:
        if expected_gateways < 1:
            raise ValueError(f"expected_gateways must be >= 1, got {expected_gateways}")
        self._tenants = {tenant.name: tenant for tenant in tenants}
        self._expected = expected_gateways
        self._held: dict[str, _Held] = {}

    def covers(self, tenant: str) -> bool:
        return tenant in self._tenants

    def apply(
        self, tenant: str, rate: float, burst: float, ttl_s: float, gateways_known: int, now: float
    ) -> bool:
        """Adopt a lease received at ``now``; False (ignored) for a tenant not covered or a
        malformed lease (the previous one, or the fallback, stays in force)."""
        if tenant not in self._tenants:
            return False
        if not all(math.isfinite(v) and v >= 0.0 for v in (rate, burst, ttl_s)):
            return False
        if gateways_known < 1:
            return False
        self._held[tenant] = _Held(rate, max(burst, _MIN_BURST), now + ttl_s, gateways_known)
        return True

    def limit(self, tenant: str, now: float) -> QuotaLimit | None:
        """The limit in force for ``tenant`` at ``now``; None if it is not under a contract."""
        config = self._tenants.get(tenant)
        if config is None:
            return None
        held = self._held.get(tenant)
        if held is not None and now < held.expires_at:
            return QuotaLimit(held.rate, held.burst, LimitSource.LEASE)
        if held is not None:
            divisor, source = held.gateways_known, LimitSource.FALLBACK
        else:
            divisor, source = self._expected, LimitSource.STARTUP
        return QuotaLimit(config.rate / divisor, config.burst / divisor, source)


class DemandMeter:
    """Arrivals per second per tenant, exponentially weighted with time constant ``tau_s``.

    Each arrival adds ``cost / tau_s`` to a rate that decays by ``exp(-dt / tau_s)``: the
    estimate of a steady Poisson stream is unbiased, and it needs no ticks or buckets.
    """

    def __init__(self, tau_s: float = DEFAULT_DEMAND_TAU_S) -> None:
        if not (math.isfinite(tau_s) and tau_s > 0.0):
            raise ValueError(f"tau_s must be finite and > 0, got {tau_s}")
        self._tau = tau_s
        # tenant -> [rate as of its last arrival, that arrival's time]: one lookup per arrival
        # (it runs on the Infer path, once per request).
        self._state: dict[str, list[float]] = {}

    def observe(self, tenant: str, cost: float, now: float) -> None:
        """One arrival (admitted or refused) of ``cost`` work tokens."""
        state = self._state.get(tenant)
        if state is None:
            self._state[tenant] = [cost / self._tau, now]
            return
        elapsed = now - state[1]
        if elapsed > 0.0:
            state[0] = state[0] * math.exp(-elapsed / self._tau) + cost / self._tau
            state[1] = now
        else:  # the same instant (or a clock read out of order): no decay
            state[0] += cost / self._tau

    def rates(self, now: float) -> dict[str, float]:
        """The demand to report: tenant → work tokens per second, as of ``now``."""
        rates = {}
        for tenant in sorted(self._state):
            rate, last = self._state[tenant]
            elapsed = now - last
            rates[tenant] = rate * math.exp(-elapsed / self._tau) if elapsed > 0.0 else rate
        return rates
