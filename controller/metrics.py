"""The controller's domain metrics (``halcyon_controller_*``), on the host's registry.

What it decides: names, types and labels. Labels have small fixed domains: ``kind`` is one of
ok / error / shed / late; ``reason`` (dropped outcomes) one of
:data:`controller.outcomes.DROP_REASONS`; ``model`` and ``version`` come from the fleet's
configured models.
Replica gauges are rebuilt from the registry on every membership change, so a (model, version)
whose last replica left disappears instead of lingering at its old value.
"""

from __future__ import annotations

import contextlib
from collections import Counter as Tally
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from controller.outcomes import DROP_REASONS, KIND_NAMES
from controller.registry import Member

__all__ = ["ControllerMetrics"]


class ControllerMetrics:
    """Every controller metric, registered on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.replicas = Gauge(
            "halcyon_controller_replicas",
            "Registered replicas by model and version",
            ["model", "version"],
            registry=r,
        )
        self.registrations = Counter(
            "halcyon_controller_registrations",
            "Accepted worker registrations (re-registrations included)",
            registry=r,
        )
        self.registrations_refused = Counter(
            "halcyon_controller_registrations_refused",
            "Worker registrations refused because their replica id is held by a live session",
            registry=r,
        )
        self.lease_expirations = Counter(
            "halcyon_controller_lease_expirations",
            "Members removed because their lease lapsed without a heartbeat",
            registry=r,
        )
        self.outcomes = Counter(
            "halcyon_controller_outcomes",
            "Request outcomes reported by gateways, by how they ended",
            ["kind"],
            registry=r,
        )
        self.dropped_outcomes = Counter(
            "halcyon_controller_dropped_outcomes",
            "Outcome items in gateway reports that were not counted, by why",
            ["reason"],
            registry=r,
        )
        self.rollouts_active = Gauge(
            "halcyon_controller_rollouts_active",
            "Rollouts in progress",
            registry=r,
        )
        self.fleet_watchers = Gauge(
            "halcyon_controller_fleet_watchers",
            "Open WatchFleet streams",
            registry=r,
        )
        self.fleet_generation = Gauge(
            "halcyon_controller_fleet_generation",
            "Generation of the latest fleet snapshot",
            registry=r,
        )
        # Rollout state for dashboards and alerts (deploy/prometheus, deploy/grafana).
        self.rollout_canary_weight = Gauge(
            "halcyon_controller_rollout_canary_weight",
            "Share of traffic (0..1) the active rollout gives its canary version",
            ["model", "canary_version"],
            registry=r,
        )
        self.rollout_decisions = Counter(
            "halcyon_controller_rollout_decisions",
            "Rollout decisions taken, by model, action (start, advance, hold, rollback, "
            "promote, abort) and reason",
            ["model", "action", "reason"],
            registry=r,
        )
        for kind in KIND_NAMES.values():
            self.outcomes.labels(kind=kind)
        for reason in DROP_REASONS:
            self.dropped_outcomes.labels(reason=reason)
        self._replica_labels: set[tuple[str, str]] = set()

    def set_members(self, members: Iterable[Member]) -> None:
        tally = Tally((m.descriptor.model, m.descriptor.version) for m in members)
        for gone in self._replica_labels - set(tally):
            self.replicas.remove(*gone)
        for (model, version), n in tally.items():
            self.replicas.labels(model=model, version=version).set(n)
        self._replica_labels = set(tally)

    def set_rollout(self, model: str, canary: str, weight_bp: int | None, active: int) -> None:
        """A rollout's canary share (None once it ended) and how many are running."""
        if weight_bp is None:
            with contextlib.suppress(KeyError):
                self.rollout_canary_weight.remove(model, canary)
        else:
            self.rollout_canary_weight.labels(model=model, canary_version=canary).set(
                weight_bp / 10_000
            )
        self.rollouts_active.set(active)

    def count_decision(self, model: str, action: str, reason: str) -> None:
        self.rollout_decisions.labels(model=model, action=action, reason=reason).inc()

    def count_outcomes(self, by_kind: Mapping[str, int], dropped: Mapping[str, int]) -> None:
        for kind, n in by_kind.items():
            if n:
                self.outcomes.labels(kind=kind).inc(n)
        for reason, n in dropped.items():
            self.dropped_outcomes.labels(reason=reason).inc(n)
