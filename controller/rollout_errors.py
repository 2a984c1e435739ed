"""What can go wrong in a rollout operation: one exception per refusal, each saying what to do.

What it decides: the message and the facts of each refusal (a model the controller has never
heard of, no stable version, no canary replica, a rollout already running or not running, a
gate in the wrong state, a decision the store refused). The servicer maps each to a gRPC status
with its ErrorInfo reason in one place.
"""

from __future__ import annotations

from controller.store import RolloutRecord

__all__ = [
    "AnalysisOnlyRollout",
    "DecisionNotStored",
    "NoActiveRollout",
    "NoCanaryReplica",
    "NoStableVersion",
    "NotAwaitingApproval",
    "RolloutAlreadyPaused",
    "RolloutBusy",
    "RolloutNotPaused",
    "UnknownModel",
]


class UnknownModel(LookupError):
    """No replica, configuration or rollout has ever named the model.

    ``precondition``: raised by a start, where the model is a precondition of the rollout
    rather than the thing looked up.
    """

    def __init__(self, model: str, *, precondition: bool = False) -> None:
        super().__init__(
            f"model {model!r} is unknown to the controller: no replica serves it, no stable "
            "version is configured for it and it has no rollout history"
        )
        self.model = model
        self.precondition = precondition


class NoStableVersion(LookupError):
    """The model has no stable version to compare a canary against."""

    def __init__(self, model: str, versions: tuple[str, ...]) -> None:
        listed = ", ".join(versions) or "none"
        super().__init__(
            f"model {model!r} has no stable version (registered versions: {listed}); "
            f"configure one with --stable {model}=VERSION before rolling out a canary"
        )
        self.model = model


class NoCanaryReplica(LookupError):
    """The canary version has no live replica to send traffic to."""

    def __init__(self, model: str, version: str) -> None:
        super().__init__(
            f"version {version!r} of model {model!r} has no live replica; start a worker "
            f"with --model {model} --version {version} and wait for it to register"
        )
        self.model = model
        self.version = version


class RolloutBusy(RuntimeError):
    """The model already has a running rollout."""

    def __init__(self, rollout: RolloutRecord) -> None:
        super().__init__(
            f"model {rollout.model!r} already has a running rollout (id {rollout.id}: "
            f"{rollout.canary_version} against {rollout.baseline_version}); promote or abort it "
            "first"
        )
        self.rollout = rollout


class NoActiveRollout(LookupError):
    """Promote or abort named a model with no running rollout."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} has no running rollout")
        self.model = model


class DecisionNotStored(RuntimeError):
    """The store refused an operator's decision; nothing changed, the caller may retry."""


class RolloutAlreadyPaused(RuntimeError):
    """Pause named a rollout that is paused already."""

    def __init__(self, rollout: RolloutRecord) -> None:
        super().__init__(
            f"the rollout of {rollout.model!r} (id {rollout.id}) is already paused at "
            f"{rollout.canary_weight_bp / 100:g}%; resume it with `halcyon rollout resume "
            f"{rollout.model}`"
        )
        self.rollout = rollout


class RolloutNotPaused(RuntimeError):
    """Resume named a rollout that is not paused."""

    def __init__(self, rollout: RolloutRecord) -> None:
        super().__init__(
            f"the rollout of {rollout.model!r} (id {rollout.id}) is not paused: it is "
            f"progressing at {rollout.canary_weight_bp / 100:g}%"
        )
        self.rollout = rollout


class NotAwaitingApproval(RuntimeError):
    """Approve named a rollout that waits for no approval; the message says where it is."""

    def __init__(self, rollout: RolloutRecord, why: str) -> None:
        super().__init__(f"{rollout.model!r} (rollout id {rollout.id}): {why}")
        self.rollout = rollout


class AnalysisOnlyRollout(RuntimeError):
    """Promote named an analysis-only rollout, which never moves traffic."""

    def __init__(self, rollout: RolloutRecord) -> None:
        super().__init__(
            f"the rollout of {rollout.model!r} (id {rollout.id}) is analysis-only: it never "
            "moves traffic or makes the canary stable; abort it, or start a rollout without "
            "--analysis-only to ship the canary"
        )
        self.rollout = rollout
