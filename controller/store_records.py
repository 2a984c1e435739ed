"""What the controller's store holds: its records, their states, and the store's errors.

What it decides: the shape of every stored row as a value — a rollout, a decision with the
evidence behind it, a fleet event — and the states and actions they may name. Immutable values,
so a record read back is the record written; :mod:`controller.store` persists them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "ArmSnapshot",
    "DecisionAction",
    "DecisionRecord",
    "FleetEvent",
    "FleetEventKind",
    "RolloutConflict",
    "RolloutRecord",
    "RolloutStatus",
    "StoreError",
    "StoreUnavailable",
]


class StoreError(RuntimeError):
    """The store file cannot be used (newer schema, corrupt, …)."""


class StoreUnavailable(StoreError):
    """The store's database cannot be reached now (a PostgreSQL server down or the connection
    lost). The call that raised it wrote nothing (unless the break came during its COMMIT);
    the next call reconnects."""


class RolloutConflict(ValueError):
    """A model already has a progressing rollout."""


class RolloutStatus(StrEnum):
    PROGRESSING = "progressing"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"
    # An analysis-only rollout that reached its verdict (never routed, never made stable).
    ANALYZED = "analyzed"


class DecisionAction(StrEnum):
    START = "start"
    ADVANCE = "advance"
    HOLD = "hold"
    ROLLBACK = "rollback"
    PROMOTE = "promote"
    ABORT = "abort"


class FleetEventKind(StrEnum):
    REGISTERED = "registered"
    EXPIRED = "expired"
    REMOVED = "removed"
    DRAINED = "drained"
    UNDRAINED = "undrained"


@dataclass(frozen=True)
class ArmSnapshot:
    """One arm's metrics over an analysis window (stored as JSON with its decision)."""

    version: str
    requests: int = 0
    errors: int = 0
    shed: int = 0
    error_rate: float = 0.0
    p50_s: float = 0.0
    p95_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> ArmSnapshot | None:
        if text is None:
            return None
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class RolloutRecord:
    """A rollout as stored. ``id`` is 0 until inserted. Times are wall-clock epoch seconds.

    The gates (:mod:`controller.canary.gates`): ``paused`` and ``auto_rollback`` (set by pause /
    resume), ``approval`` (``none``, ``promotion`` or ``every_step``, fixed at start),
    ``awaiting_approval`` (the judge waits for an approve), ``analysis_only`` (a dry run, fixed
    at start); ``resumes_in_step`` counts the restarts the current step has been resumed from
    (0 again once it advances), so the judge does not grant a resumed step a fresh budget.
    """

    model: str
    baseline_version: str
    canary_version: str
    step_percents: tuple[float, ...]
    state: RolloutStatus
    started_at: float
    updated_at: float
    step_index: int = 0
    canary_weight_bp: int = 0
    policy: dict[str, Any] = field(default_factory=dict)
    id: int = 0
    paused: bool = False
    auto_rollback: bool = True
    approval: str = "none"
    awaiting_approval: bool = False
    analysis_only: bool = False
    resumes_in_step: int = 0


@dataclass(frozen=True)
class DecisionRecord:
    """A rollout decision and the evidence behind it. ``id`` is 0 until inserted.

    ``applied`` is False for what an analysis-only rollout would have done (recorded, never
    routed).
    """

    rollout_id: int
    model: str
    action: DecisionAction
    reason: str
    from_percent: float
    to_percent: float
    decided_at: float
    baseline: ArmSnapshot | None = None
    canary: ArmSnapshot | None = None
    detail: str = ""
    statistics: dict[str, float] = field(default_factory=dict)
    needed_requests: int = 0
    id: int = 0
    applied: bool = True


@dataclass(frozen=True)
class FleetEvent:
    """A change of fleet membership. ``at`` is wall-clock epoch seconds."""

    at: float
    kind: FleetEventKind
    replica_id: str
    model: str = ""
    version: str = ""
    address: str = ""
    detail: str = ""
    id: int = 0
