"""The assembled controller: one object that opens the store and wires the parts together.

What it decides: construction and lifecycle order, shared by ``halcyon controller`` and the
tests — open the store (off the event loop), reconcile the stable versions with it and re-arm
every running rollout at its stored step and weight before anything can register or watch the
fleet; start the lease sweeper, the event writer and the rollout judge after the server binds;
on shutdown stop judging and end every stream cleanly first (:meth:`Controller.shutdown`), and
only after the server has stopped flush the pending fleet events and close the store
(:meth:`close`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from common.clock import Clock, MonotonicClock
from common.serving import ServiceHost
from controller.convert import WallClock
from controller.drop_log import DropLog
from controller.event_writer import FleetEventWriter
from controller.feed import ChangeFeed
from controller.fleet import FleetManager
from controller.fleet_view import FleetView
from controller.metrics import ControllerMetrics
from controller.outcomes import OutcomeAggregator
from controller.quotas.grants import QuotaGrants
from controller.registry import FleetRegistry
from controller.rollout_evidence import RolloutEvidence
from controller.rollouts import RolloutManager
from controller.routing_table import RoutingTable
from controller.servicer import SERVICE_NAME, ControlService
from controller.stable_versions import reconcile
from controller.store import ControllerStore
from halcyon.v1 import control_pb2_grpc

__all__ = ["Controller", "ControllerConfig"]

_log = logging.getLogger("halcyon.controller")


@dataclass(frozen=True)
class ControllerConfig:
    """Everything the controller needs besides the serving options."""

    db_path: str | Path  # the store: an SQLite path, or a URL (sqlite:///…, postgresql://…)
    stable: Mapping[str, str] = field(default_factory=dict)
    lease_ttl_s: float = 3.0
    heartbeat_interval_s: float = 1.0
    sweep_interval_s: float | None = None  # default lease_ttl_s / 4
    outcome_window_s: float = 60.0
    gateway_ttl_s: float = 60.0
    coalesce_s: float = 0.01
    generation_epoch: int | None = None  # default: wall-clock microseconds at start
    # How long snapshots say "warming up" after start (gateways merge them); None: one lease
    # TTL, 0: never (ADR 0011).
    warm_up_s: float | None = None
    rollout_tick_s: float = 1.0  # how often the canary judge looks at the evidence


class Controller:
    """Store, registry, routing table, outcome aggregator, fleet sessions and the servicer."""

    def __init__(
        self,
        config: ControllerConfig,
        store: ControllerStore,
        stable: Mapping[str, str],
        *,
        clock: Clock,
        metrics_registry: CollectorRegistry | None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.wall = WallClock(clock)
        self.metrics = ControllerMetrics(metrics_registry)
        self.registry = FleetRegistry(clock, config.lease_ttl_s)
        self.routing = RoutingTable(stable)
        epoch = (
            config.generation_epoch
            if config.generation_epoch is not None
            else time.time_ns() // 1000
        )
        warm_up = config.lease_ttl_s if config.warm_up_s is None else config.warm_up_s
        self.view = FleetView(
            self.registry,
            self.routing,
            self.wall,
            epoch=epoch,
            warm_up_until=clock.now() + warm_up if warm_up > 0 else None,
        )
        self.evidence = RolloutEvidence()
        self.outcomes = OutcomeAggregator(
            clock,
            window_s=config.outcome_window_s,
            gateway_ttl_s=config.gateway_ttl_s,
            tap=self.evidence,
        )
        self.events = FleetEventWriter(store)
        self.fleet = FleetManager(
            registry=self.registry,
            view=self.view,
            feed=ChangeFeed(),
            events=self.events,
            metrics=self.metrics,
            wall=self.wall,
            clock=clock,
            heartbeat_interval_s=config.heartbeat_interval_s,
            sweep_interval_s=config.sweep_interval_s,
        )
        self.rollouts = RolloutManager(
            store=store,
            routing=self.routing,
            registry=self.registry,
            view=self.view,
            publish=self.fleet.notify_changed,
            evidence=self.evidence,
            metrics=self.metrics,
            clock=clock,
            wall=self.wall,
            configured_stable=config.stable,
            tick_s=config.rollout_tick_s,
        )
        # Fleet-wide quotas (ADR 0003): leases ride on the fleet streams, woken by each grant.
        self.quotas = QuotaGrants(clock, self.fleet.feed.publish)
        self.servicer = ControlService(
            fleet=self.fleet,
            quotas=self.quotas,
            outcomes=self.outcomes,
            store=store,
            rollouts=self.rollouts,
            metrics=self.metrics,
            wall=self.wall,
            drop_log=DropLog(logging.getLogger("halcyon.controller.outcomes"), clock),
            coalesce_s=config.coalesce_s,
        )
        self._closed = False

    @classmethod
    async def open(
        cls,
        config: ControllerConfig,
        *,
        clock: Clock | None = None,
        metrics_registry: CollectorRegistry | None = None,
        active: bool = True,
    ) -> Controller:
        """Open the store and build the controller; ``active`` (the only controller, or the
        leader) also takes the store over (:meth:`activate`). A standby opens with
        ``active=False``: it writes nothing and re-arms nothing until it leads."""
        store = await asyncio.to_thread(ControllerStore, config.db_path)
        try:
            stored = await asyncio.to_thread(store.stable_versions)
            rec = reconcile(config.stable, stored, time.time())
        except BaseException:
            store.close()
            raise
        _log.info(
            "store open",
            extra={"db": store.path, "backend": str(store.backend),
                   "schema_version": store.schema_version, "stable": rec.effective},
        )  # fmt: skip
        controller = cls(
            config,
            store,
            rec.effective,
            clock=clock or MonotonicClock(),
            metrics_registry=metrics_registry,
        )
        if active:
            try:
                await controller.activate()
            except BaseException:
                store.close()
                raise
        return controller

    async def activate(self) -> None:
        """Take the store over, as a (re)started controller does before serving: record the
        stable versions the configuration and the store settle on, re-arm every running
        rollout at its stored step and weight (its "resumed" decision). A standby that
        becomes leader runs this then, reading what the previous leader decided."""
        stored = await asyncio.to_thread(self.store.stable_versions)
        rec = reconcile(self.config.stable, stored, time.time())
        await asyncio.to_thread(self.store.apply_reconciliation, rec)
        for note in rec.notes:
            _log.warning(note)
        for model, version in rec.effective.items():  # promotions since the standby opened
            self.routing.set_stable(model, version)
        await self.rollouts.resume()
        self.fleet.notify_changed()

    def add_to(self, host: ServiceHost) -> None:
        """Register the ControlService on a host (before ``host.start()``)."""
        host.add_service(
            control_pb2_grpc.add_ControlServiceServicer_to_server, self.servicer, SERVICE_NAME
        )

    def start(self) -> None:
        """Start the lease sweeper, the fleet event writer and the rollout judge (inside the
        running loop)."""
        self.events.start()
        self.fleet.start()
        self.rollouts.start()
        self.quotas.start()

    async def shutdown(self) -> None:
        """Stop judging; end every worker session, WatchFleet and decision stream with OK
        (before the server stops)."""
        await self.rollouts.close()
        await self.quotas.close()
        await self.fleet.close()

    async def close(self) -> None:
        """After the server stopped: write pending fleet events and close the store."""
        if self._closed:
            return
        self._closed = True
        await self.rollouts.close()
        await self.quotas.close()
        await self.fleet.close()
        await self.events.close()
        await asyncio.to_thread(self.store.close)
