"""Per-model routing: which version is stable, which is the canary, and the canary's share.

What it decides: the ``ModelRouting`` every gateway applies. The stable (baseline) version of a
model is the *configured* one (``--stable MODEL=VERSION``, the config file, or a persisted
promotion) — never "whichever registered first" (defect 1 of the original). Only when nothing
is configured for a model and exactly one version of it is registered (not counting a running
canary) is that version stable, because then there is no choice to get wrong. When several are
registered and none is configured, the model has *no* stable version: its routing entry carries
an empty ``stable_version``, the model is listed in ``RoutingResolution.unresolved`` (the
servicer logs a warning), and gateways refuse the model with a clear error rather than guess.

The canary (version + weight in basis points of the sticky-hash space, 0 while no rollout runs)
is set through one method, :meth:`RoutingTable.set_canary`, which the rollout controller owns.

``generation`` increases on every change of configuration held here; changes in which versions
are registered are the registry's generation. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from halcyon.v1 import control_pb2

__all__ = ["MAX_WEIGHT_BP", "Canary", "RoutingResolution", "RoutingTable"]

MAX_WEIGHT_BP = 10_000


@dataclass(frozen=True)
class Canary:
    """A model's canary: its version and share of the sticky-hash space in basis points."""

    version: str
    weight_bp: int


@dataclass(frozen=True)
class RoutingResolution:
    """Routing for every known model, plus the models that have no stable version."""

    routes: list[control_pb2.ModelRouting]
    # model -> the registered versions among which none is configured stable
    unresolved: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def for_model(self, model: str) -> control_pb2.ModelRouting | None:
        for route in self.routes:
            if route.model == model:
                return route
        return None


class RoutingTable:
    """Configured stable versions and running canaries; resolves them against the fleet."""

    def __init__(self, stable: Mapping[str, str] | None = None) -> None:
        self._stable: dict[str, str] = {}
        self._canary: dict[str, Canary] = {}
        self._generation = 0
        for model, version in (stable or {}).items():
            self._check_names(model, version)
            self._stable[model] = version

    @staticmethod
    def _check_names(model: str, version: str) -> None:
        if not model:
            raise ValueError("model must not be empty")
        if not version:
            raise ValueError(f"version for model {model!r} must not be empty")

    @property
    def generation(self) -> int:
        return self._generation

    def stable_versions(self) -> dict[str, str]:
        """The configured (or promoted) stable version per model."""
        return dict(self._stable)

    def configured_stable(self, model: str) -> str | None:
        return self._stable.get(model)

    def canary(self, model: str) -> Canary | None:
        return self._canary.get(model)

    def set_stable(self, model: str, version: str) -> None:
        """Make ``version`` the stable version of ``model`` (configuration or promotion).

        If that version was the model's canary, the canary is cleared: it is now the baseline.
        """
        self._check_names(model, version)
        changed = self._stable.get(model) != version
        self._stable[model] = version
        canary = self._canary.get(model)
        if canary is not None and canary.version == version:
            del self._canary[model]
            changed = True
        if changed:
            self._generation += 1

    def set_canary(self, model: str, version: str, weight_bp: int) -> None:
        """Set the canary of ``model`` — the one method the rollout controller moves traffic with.

        ``version=""`` with ``weight_bp=0`` clears the canary. A canary with weight 0 is allowed
        (a rollout holding at zero). The canary must differ from the model's stable version.
        """
        if not model:
            raise ValueError("model must not be empty")
        if not 0 <= weight_bp <= MAX_WEIGHT_BP:
            raise ValueError(f"weight_bp must be in [0, {MAX_WEIGHT_BP}], got {weight_bp}")
        if not version:
            if weight_bp != 0:
                raise ValueError("a canary weight needs a canary version")
            if self._canary.pop(model, None) is not None:
                self._generation += 1
            return
        if self._stable.get(model) == version:
            raise ValueError(f"canary {version!r} is the stable version of {model!r}")
        new = Canary(version, weight_bp)
        if self._canary.get(model) != new:
            self._canary[model] = new
            self._generation += 1

    def clear_canary(self, model: str) -> None:
        self.set_canary(model, "", 0)

    def resolve(self, registered: Mapping[str, Collection[str]]) -> RoutingResolution:
        """Routing for every model that is configured, has a canary, or has replicas.

        ``registered`` maps each model to the versions its live replicas serve.
        """
        models = sorted(set(self._stable) | set(self._canary) | set(registered))
        routes: list[control_pb2.ModelRouting] = []
        unresolved: dict[str, tuple[str, ...]] = {}
        for model in models:
            canary = self._canary.get(model)
            stable = self._stable.get(model)
            if stable is None:
                candidates = sorted(
                    v for v in registered.get(model, ()) if canary is None or v != canary.version
                )
                if len(candidates) == 1:
                    stable = candidates[0]
                elif candidates:
                    unresolved[model] = tuple(candidates)
            route = control_pb2.ModelRouting(model=model, stable_version=stable or "")
            # A canary is published only beside a baseline: a model without a stable version
            # is refused by the gateways, never sent wholesale to its canary.
            if canary is not None and stable is not None:
                route.canary_version = canary.version
                route.canary_weight_bp = canary.weight_bp
            routes.append(route)
        return RoutingResolution(routes=routes, unresolved=unresolved)
