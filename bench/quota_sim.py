"""The quota benchmark's strategies: what each gateway admits, replayed on the same world.

What it decides: for every arrival of the world (``bench.quota_world``), whether it is
admitted under one of four ways of enforcing a fleet-wide contract, using the gateway's own
admission classes (:class:`~gateway.admission.quota.TenantQuotas`, its token buckets) and,
for leases, the same policy objects the live controller and gateways use
(:class:`~controller.quotas.leases.QuotaLeases`, :class:`~gateway.admission.quota_lease.
LeasedQuotas`, :class:`~gateway.admission.quota_lease.DemandMeter`):

* ``full`` — every gateway enforces the whole quota (today: ``n`` gateways admit ``n`` times).
* ``static`` — every gateway enforces ``rate / n`` for the ``n`` it started with, never updated.
* ``leases`` — gateways report demand every second, the controller grants leases every second;
  both messages arrive one tick (0.1 s) late. During the outage reports are lost and no lease
  is granted; the controller then restarts with no memory (and warms up before granting).
* ``ideal`` — a reference, not a strategy: one bucket per tenant shared by the whole fleet,
  what a single perfect enforcer would admit (the refusals it makes are the noise floor).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bench.quota_world import Scenario, Tick, generate
from controller.quotas import Contract, QuotaLease, QuotaLeases
from gateway.admission.quota import QuotaCharge, TenantQuotas
from gateway.admission.quota_lease import DemandMeter, LeasedQuotas, QuotaLimit
from gateway.admission.tenants import TenantConfig, TenantRegistry

__all__ = ["STRATEGIES", "Series", "run_strategy"]

STRATEGIES = ("full", "static", "leases", "ideal")
REPORT_EVERY_TICKS = 10
"""Demand reports and lease grants: once a second."""


@dataclass(frozen=True)
class Series:
    """Per tenant and tick: requests offered and admitted, and the model's offered rate."""

    strategy: str
    offered: npt.NDArray[np.int64]
    admitted: npt.NDArray[np.int64]
    intensity: npt.NDArray[np.float64]


class _Enforcer(ABC):
    """How one strategy admits: the hooks the replay calls."""

    def tick(self, tick: Tick) -> None:  # noqa: B027 (most strategies have nothing to do)
        """Membership changes and messages, at the start of ``tick``."""

    @abstractmethod
    def admit(self, gateway: int, tenant: TenantConfig, at: float) -> bool: ...


def _opened(tick: Tick) -> tuple[int, ...]:
    """The gateways that start at ``tick``: all of them at the first, then those joining."""
    return tick.live if tick.index == 0 else tick.joined


class _PerGateway(_Enforcer):
    """Independent buckets per gateway; ``share`` (if any) caps each at a fixed split."""

    def __init__(self, registry: TenantRegistry, share: Callable[[TenantConfig], float] | None):
        self._registry = registry
        self._share = share
        self._quotas: dict[int, TenantQuotas] = {}

    def _open(self, gateway: int, now: float) -> None:
        quotas = TenantQuotas(self._registry)
        if self._share is not None:
            for tenant in self._registry:
                split = self._share(tenant)
                quotas.set_share(tenant, tenant.rate * split, tenant.burst * split, now)
        self._quotas[gateway] = quotas

    def tick(self, tick: Tick) -> None:
        for gateway in tick.left:
            del self._quotas[gateway]
        for gateway in _opened(tick):
            self._open(gateway, tick.start)

    def admit(self, gateway: int, tenant: TenantConfig, at: float) -> bool:
        return isinstance(self._quotas[gateway].charge(tenant, 1.0, at), QuotaCharge)


class _Shared(_Enforcer):
    def __init__(self, registry: TenantRegistry) -> None:
        self._quotas = TenantQuotas(registry)

    def admit(self, gateway: int, tenant: TenantConfig, at: float) -> bool:
        return isinstance(self._quotas.charge(tenant, 1.0, at), QuotaCharge)


@dataclass
class _LeaseGateway:
    quotas: TenantQuotas
    policy: LeasedQuotas
    meter: DemandMeter
    phase: int
    """The tick (mod the report interval) at which this gateway reports."""
    enforced: dict[str, QuotaLimit]


class _Leases(_Enforcer):
    """Gateways and controller exchanging demand reports and leases, one tick late each way."""

    def __init__(self, registry: TenantRegistry, scenario: Scenario) -> None:
        self._registry = registry
        self._tenants = list(registry)
        self._contracts = [Contract(t.name, t.rate, t.burst) for t in self._tenants]
        self._tick_s = scenario.tick_s
        self._outage = (
            round(scenario.outage[0] / scenario.tick_s),
            round(scenario.outage[1] / scenario.tick_s),
        )
        self._gateways: dict[int, _LeaseGateway] = {}
        self._controller = QuotaLeases(self._contracts, 0.0)
        self._reports: list[tuple[int, dict[str, float], float]] = []
        self._pushes: list[tuple[int, list[QuotaLease]]] = []

    def _open(self, gateway: int, fleet_size: int) -> None:
        self._gateways[gateway] = _LeaseGateway(
            TenantQuotas(self._registry),
            LeasedQuotas(self._tenants, expected_gateways=fleet_size),
            DemandMeter(),
            (gateway * 3) % REPORT_EVERY_TICKS,
            {},
        )

    def _controller_up(self, index: int) -> bool:
        return not self._outage[0] <= index < self._outage[1]

    def tick(self, tick: Tick) -> None:
        now = tick.start
        for gateway in tick.left:
            del self._gateways[gateway]
        for gateway in _opened(tick):
            self._open(gateway, len(tick.live))
        if tick.index == self._outage[1]:
            self._controller = QuotaLeases(self._contracts, now)  # restarted, no memory
        up = self._controller_up(tick.index)
        # Last tick's messages arrive now; a lease pushed to a gateway that crashed is lost.
        for gateway, demands, sent_at in self._reports:
            if up:
                self._controller.report(str(gateway), demands, sent_at)
        self._reports = []
        for gateway, leases in self._pushes:
            target = self._gateways.get(gateway)
            if target is None:
                continue
            for lease in leases:
                target.policy.apply(
                    lease.tenant, lease.rate, lease.burst, lease.ttl_s, lease.gateways_known, now
                )
        self._pushes = []
        if up and tick.index % REPORT_EVERY_TICKS == REPORT_EVERY_TICKS // 2:
            grants = self._controller.grant(now)
            self._pushes = [(int(g), leases) for g, leases in grants.items()]
        for gateway, state in self._gateways.items():
            if tick.index % REPORT_EVERY_TICKS == state.phase:
                self._reports.append((gateway, state.meter.rates(now), now))
            self._enforce(state, now)

    def _enforce(self, state: _LeaseGateway, now: float) -> None:
        for tenant in self._tenants:
            limit = state.policy.limit(tenant.name, now)
            if limit is not None and state.enforced.get(tenant.name) != limit:
                state.quotas.set_share(tenant, limit.rate, limit.burst, now)
                state.enforced[tenant.name] = limit

    def admit(self, gateway: int, tenant: TenantConfig, at: float) -> bool:
        state = self._gateways[gateway]
        state.meter.observe(tenant.name, 1.0, at)
        return isinstance(state.quotas.charge(tenant, 1.0, at), QuotaCharge)


def _enforcer(strategy: str, registry: TenantRegistry, scenario: Scenario) -> _Enforcer:
    if strategy == "full":
        return _PerGateway(registry, None)
    if strategy == "static":
        return _PerGateway(registry, lambda _tenant: 1.0 / scenario.initial_gateways)
    if strategy == "leases":
        return _Leases(registry, scenario)
    if strategy == "ideal":
        return _Shared(registry)
    raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def registry_of(scenario: Scenario) -> TenantRegistry:
    return TenantRegistry(TenantConfig(t.name, (), t.rate, t.burst) for t in scenario.tenants)


def run_strategy(strategy: str, scenario: Scenario, seed: int) -> Series:
    """One strategy on the world of ``seed``."""
    return replay(strategy, scenario, generate(scenario, seed))


def replay(strategy: str, scenario: Scenario, ticks: Iterable[Tick]) -> Series:
    registry = registry_of(scenario)
    tenants = list(registry)
    enforcer = _enforcer(strategy, registry, scenario)
    shape = (len(tenants), scenario.ticks)
    offered = np.zeros(shape, dtype=np.int64)
    admitted = np.zeros(shape, dtype=np.int64)
    intensity = np.zeros(shape, dtype=np.float64)
    for tick in ticks:
        enforcer.tick(tick)
        intensity[:, tick.index] = tick.offered_rate
        for batch in tick.arrivals:
            tenant = tenants[batch.tenant]
            offered[batch.tenant, tick.index] += len(batch.times)
            admitted[batch.tenant, tick.index] += sum(
                enforcer.admit(batch.gateway, tenant, at) for at in batch.times
            )
    return Series(strategy, offered, admitted, intensity)
