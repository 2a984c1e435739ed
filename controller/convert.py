"""Translations between the controller's own records and the ``halcyon.v1`` wire messages.

What it decides: how times cross the boundary — policy code runs on an injected monotonic
clock, the wire carries wall-clock ``Timestamp``s, so :class:`WallClock` maps one onto the
other with a single offset taken at start (a wall-clock step later does not reorder leases) —
and how stored rollouts and decisions become ``Rollout`` / ``RolloutDecision`` messages (with
the rollout's gates, and whether a decision took effect).
Keeping these in one module keeps the servicer a thin adapter and the policy modules free of
wall time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import timestamp_pb2

from common.clock import Clock
from common.durations import to_duration
from controller.outcomes import GatewayReport, VersionOutcomes
from controller.registry import Member
from controller.rollout_policy import policy_from_dict, policy_to_pb
from controller.store import (
    ArmSnapshot,
    DecisionAction,
    DecisionRecord,
    RolloutRecord,
    RolloutStatus,
)
from halcyon.v1 import control_pb2

__all__ = [
    "APPROVAL_FROM_PB",
    "WallClock",
    "arm_to_pb",
    "decision_to_pb",
    "gateway_to_pb",
    "member_to_pb",
    "rollout_to_pb",
    "stored_policy_to_pb",
    "timestamp",
]

_ROLLOUT_STATE = {
    RolloutStatus.PROGRESSING: control_pb2.ROLLOUT_STATE_PROGRESSING,
    RolloutStatus.PROMOTED: control_pb2.ROLLOUT_STATE_PROMOTED,
    RolloutStatus.ROLLED_BACK: control_pb2.ROLLOUT_STATE_ROLLED_BACK,
    RolloutStatus.ABORTED: control_pb2.ROLLOUT_STATE_ABORTED,
    RolloutStatus.ANALYZED: control_pb2.ROLLOUT_STATE_ANALYZED,
}
# The stored approval mode (controller.canary.ApprovalMode's values) on the wire and back.
_APPROVAL = {
    "none": control_pb2.APPROVAL_MODE_NONE,
    "promotion": control_pb2.APPROVAL_MODE_PROMOTION,
    "every_step": control_pb2.APPROVAL_MODE_EVERY_STEP,
}
APPROVAL_FROM_PB: Mapping[int, str] = {
    control_pb2.APPROVAL_MODE_UNSPECIFIED: "none",
    **{wire: stored for stored, wire in _APPROVAL.items()},
}
_ACTION = {
    DecisionAction.START: control_pb2.DECISION_ACTION_START,
    DecisionAction.ADVANCE: control_pb2.DECISION_ACTION_ADVANCE,
    DecisionAction.HOLD: control_pb2.DECISION_ACTION_HOLD,
    DecisionAction.ROLLBACK: control_pb2.DECISION_ACTION_ROLLBACK,
    DecisionAction.PROMOTE: control_pb2.DECISION_ACTION_PROMOTE,
    DecisionAction.ABORT: control_pb2.DECISION_ACTION_ABORT,
}


class WallClock:
    """Maps readings of an injected (monotonic) clock to wall-clock epoch seconds."""

    def __init__(self, clock: Clock, wall_now: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._offset = wall_now() - clock.now()

    def wall(self, reading: float) -> float:
        """The wall time of a reading of the injected clock."""
        return reading + self._offset

    def now(self) -> float:
        return self.wall(self._clock.now())


def timestamp(wall_s: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(round(wall_s * 1e9))
    return ts


def member_to_pb(member: Member, wall: WallClock) -> control_pb2.FleetMember:
    return control_pb2.FleetMember(
        replica=member.descriptor,
        load=member.effective_load(),
        lease_expires_at=timestamp(wall.wall(member.lease_expires_at)),
        registered_at=timestamp(wall.wall(member.registered_at)),
    )


def gateway_to_pb(report: GatewayReport, wall: WallClock) -> control_pb2.GatewayStatus:
    return control_pb2.GatewayStatus(
        gateway_id=report.gateway_id,
        last_report_at=timestamp(wall.wall(report.last_report_at)),
        concurrency_limit=report.concurrency_limit,
        inflight=report.inflight,
        cost_models=list(report.cost_models),
        # Breakers, sheds and tenants as the gateway reported them (validated on ingest).
        breakers=list(report.breakers),
        sheds=list(report.sheds),
        tenants=list(report.tenants),
    )


def stored_policy_to_pb(policy: Mapping[str, Any]) -> control_pb2.RolloutPolicy:
    """A rollout's stored (effective) policy as a message; empty if it cannot be read.

    The API bounds every policy it stores (:mod:`controller.rollout_policy`); one stored
    before it did (an infinite or int64-max duration) cannot be a Duration, and must not
    break GetState for every other rollout: it shows as empty.
    """
    try:
        return policy_to_pb(policy_from_dict(policy))
    except (ValueError, OverflowError):
        return control_pb2.RolloutPolicy()


def rollout_to_pb(
    r: RolloutRecord, last_decision: DecisionRecord | None = None
) -> control_pb2.Rollout:
    out = control_pb2.Rollout(
        id=r.id,
        model=r.model,
        baseline_version=r.baseline_version,
        canary_version=r.canary_version,
        step_percents=list(r.step_percents),
        step_index=r.step_index,
        canary_weight_bp=r.canary_weight_bp,
        state=_ROLLOUT_STATE[r.state],
        policy=stored_policy_to_pb(r.policy),
        started_at=timestamp(r.started_at),
        updated_at=timestamp(r.updated_at),
        paused=r.paused,
        auto_rollback=r.auto_rollback,
        approval=_APPROVAL.get(r.approval, control_pb2.APPROVAL_MODE_UNSPECIFIED),
        awaiting_approval=r.awaiting_approval,
        analysis_only=r.analysis_only,
    )
    if last_decision is not None:
        out.last_decision.CopyFrom(decision_to_pb(last_decision))
    return out


def arm_to_pb(arm: ArmSnapshot) -> control_pb2.ArmMetrics:
    out = control_pb2.ArmMetrics(
        version=arm.version,
        requests=arm.requests,
        errors=arm.errors,
        shed=arm.shed,
        error_rate=arm.error_rate,
    )
    # An arm with no answered request has no latency quantiles (NaN): leave them unset.
    if math.isfinite(arm.p50_s):
        out.p50.CopyFrom(to_duration(arm.p50_s))
    if math.isfinite(arm.p95_s):
        out.p95.CopyFrom(to_duration(arm.p95_s))
    return out


def decision_to_pb(d: DecisionRecord) -> control_pb2.RolloutDecision:
    out = control_pb2.RolloutDecision(
        id=d.id,
        rollout_id=d.rollout_id,
        model=d.model,
        action=_ACTION[d.action],
        reason=d.reason,
        from_percent=d.from_percent,
        to_percent=d.to_percent,
        decided_at=timestamp(d.decided_at),
        detail=d.detail,
        statistics=d.statistics,
        needed_requests=d.needed_requests,
        applied=d.applied,
    )
    if d.baseline is not None:
        out.baseline.CopyFrom(arm_to_pb(d.baseline))
    if d.canary is not None:
        out.canary.CopyFrom(arm_to_pb(d.canary))
    return out


def version_outcomes_to_pb(w: VersionOutcomes) -> control_pb2.VersionOutcomes:
    """A (model, version) rolling window as GetState shows it."""
    answered = w.latency.count > 0
    return control_pb2.VersionOutcomes(
        model=w.model,
        metrics=control_pb2.ArmMetrics(
            version=w.version,
            requests=w.requests,
            errors=w.error,
            shed=w.shed,
            error_rate=w.error_rate,
            p50=to_duration(w.latency.quantile(0.50)) if answered else None,
            p95=to_duration(w.latency.quantile(0.95)) if answered else None,
        ),
    )
