"""The controller's live quota ledger: demand reports in, a grant a second, leases per watcher.

What it decides: when leases are granted and which a gateway's WatchFleet stream carries. It
wraps the pure policy (:class:`controller.quotas.leases.QuotaLeases`) with the controller's
clock and a one-second grant loop, and turns the leases into ``QuotaLease`` messages.

Rules:

* **Contracts come with the demand.** Gateways share one tenants file, and each report names
  every tenant's configured rate and burst (``TenantDemand``); the controller adopts the latest
  it was told, so it needs no tenants file of its own. A tenant nobody reports has no contract
  and is in no lease.
* **A grant a second** (``grant_interval_s``): each one renews every live gateway's leases, and
  ``publish`` wakes the WatchFleet streams, which send their gateway a snapshot with them — an
  ordinary snapshot, whose fleet part is unchanged when only the leases were renewed.
* **A watcher whose stream ends is forgotten** at once: its share goes back to the others at
  the next grant instead of after the report TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from common.clock import Clock
from common.durations import to_duration
from controller.quotas.leases import Contract, QuotaLease, QuotaLeases
from halcyon.v1 import control_pb2

__all__ = ["QuotaGrants"]

_log = logging.getLogger("halcyon.controller.quotas")

DEFAULT_GRANT_INTERVAL_S = 1.0


class QuotaGrants:
    """One per controller: :class:`QuotaLeases` fed by reports, granted on a timer."""

    def __init__(
        self,
        clock: Clock,
        publish: Callable[[], None],
        *,
        grant_interval_s: float = DEFAULT_GRANT_INTERVAL_S,
    ) -> None:
        self._clock = clock
        self._publish = publish
        self._interval = grant_interval_s
        self._leases = QuotaLeases([], clock.now())
        self._contracts: dict[str, Contract] = {}
        self._granted: dict[str, list[control_pb2.QuotaLease]] = {}
        self.round = 0  # grants so far: a fleet stream sends a snapshot when it moves on
        self._task: asyncio.Task[None] | None = None

    def report(self, gateway: str, demands: Iterable[control_pb2.TenantDemand]) -> None:
        """One gateway's report: its demand per tenant, and the contracts it enforces."""
        rates: dict[str, float] = {}
        contracts = dict(self._contracts)
        for demand in demands:
            if not demand.tenant:
                continue
            rates[demand.tenant] = demand.rate_per_s
            try:
                contract = Contract(
                    demand.tenant, demand.contract_rate_per_s, demand.contract_burst
                )
            except ValueError:
                continue
            contracts[demand.tenant] = contract
        if contracts != self._contracts:
            self._contracts = contracts
            self._leases.set_contracts(contracts.values())
        if rates:  # a gateway with no tenants enforces no quota: it gets no share either
            self._leases.report(gateway, rates, self._clock.now())

    def forget(self, gateway: str) -> None:
        """A gateway whose fleet stream ended: it holds no share from the next grant on."""
        self._leases.forget(gateway)
        self._granted.pop(gateway, None)

    def leases_for(self, gateway: str) -> list[control_pb2.QuotaLease]:
        """The leases of the latest grant for ``gateway`` (empty if it has none)."""
        return self._granted.get(gateway, [])

    def grant(self) -> None:
        """Renew every live gateway's leases and wake the fleet streams."""
        granted = self._leases.grant(self._clock.now())
        self._granted = {gateway: [_to_pb(lease) for lease in leases]
                         for gateway, leases in granted.items() if leases}  # fmt: skip
        self.round += 1
        if self._granted:
            self._publish()

    def start(self) -> None:
        """Start granting (inside the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._grant_forever(), name="quota-grants")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _grant_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                self.grant()
            except Exception:  # one bad grant must not stop the leases for good
                _log.exception("quota grant failed")


def _to_pb(lease: QuotaLease) -> control_pb2.QuotaLease:
    return control_pb2.QuotaLease(
        tenant=lease.tenant,
        rate_per_s=lease.rate,
        burst=lease.burst,
        ttl=to_duration(lease.ttl_s),
        gateways_known=lease.gateways_known,
    )
