import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from halcyon.v1 import fleet_pb2 as _fleet_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STATE_UNSPECIFIED: _ClassVar[RolloutState]
    ROLLOUT_STATE_PROGRESSING: _ClassVar[RolloutState]
    ROLLOUT_STATE_PROMOTED: _ClassVar[RolloutState]
    ROLLOUT_STATE_ROLLED_BACK: _ClassVar[RolloutState]
    ROLLOUT_STATE_ABORTED: _ClassVar[RolloutState]
    ROLLOUT_STATE_ANALYZED: _ClassVar[RolloutState]

class ApprovalMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_MODE_UNSPECIFIED: _ClassVar[ApprovalMode]
    APPROVAL_MODE_NONE: _ClassVar[ApprovalMode]
    APPROVAL_MODE_PROMOTION: _ClassVar[ApprovalMode]
    APPROVAL_MODE_EVERY_STEP: _ClassVar[ApprovalMode]

class DecisionAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_ACTION_UNSPECIFIED: _ClassVar[DecisionAction]
    DECISION_ACTION_START: _ClassVar[DecisionAction]
    DECISION_ACTION_ADVANCE: _ClassVar[DecisionAction]
    DECISION_ACTION_HOLD: _ClassVar[DecisionAction]
    DECISION_ACTION_ROLLBACK: _ClassVar[DecisionAction]
    DECISION_ACTION_PROMOTE: _ClassVar[DecisionAction]
    DECISION_ACTION_ABORT: _ClassVar[DecisionAction]

class RequestOutcomeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_OUTCOME_KIND_UNSPECIFIED: _ClassVar[RequestOutcomeKind]
    REQUEST_OUTCOME_KIND_OK: _ClassVar[RequestOutcomeKind]
    REQUEST_OUTCOME_KIND_ERROR: _ClassVar[RequestOutcomeKind]
    REQUEST_OUTCOME_KIND_SHED: _ClassVar[RequestOutcomeKind]
    REQUEST_OUTCOME_KIND_LATE: _ClassVar[RequestOutcomeKind]

class BreakerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BREAKER_STATE_UNSPECIFIED: _ClassVar[BreakerState]
    BREAKER_STATE_CLOSED: _ClassVar[BreakerState]
    BREAKER_STATE_OPEN: _ClassVar[BreakerState]
    BREAKER_STATE_HALF_OPEN: _ClassVar[BreakerState]
ROLLOUT_STATE_UNSPECIFIED: RolloutState
ROLLOUT_STATE_PROGRESSING: RolloutState
ROLLOUT_STATE_PROMOTED: RolloutState
ROLLOUT_STATE_ROLLED_BACK: RolloutState
ROLLOUT_STATE_ABORTED: RolloutState
ROLLOUT_STATE_ANALYZED: RolloutState
APPROVAL_MODE_UNSPECIFIED: ApprovalMode
APPROVAL_MODE_NONE: ApprovalMode
APPROVAL_MODE_PROMOTION: ApprovalMode
APPROVAL_MODE_EVERY_STEP: ApprovalMode
DECISION_ACTION_UNSPECIFIED: DecisionAction
DECISION_ACTION_START: DecisionAction
DECISION_ACTION_ADVANCE: DecisionAction
DECISION_ACTION_HOLD: DecisionAction
DECISION_ACTION_ROLLBACK: DecisionAction
DECISION_ACTION_PROMOTE: DecisionAction
DECISION_ACTION_ABORT: DecisionAction
REQUEST_OUTCOME_KIND_UNSPECIFIED: RequestOutcomeKind
REQUEST_OUTCOME_KIND_OK: RequestOutcomeKind
REQUEST_OUTCOME_KIND_ERROR: RequestOutcomeKind
REQUEST_OUTCOME_KIND_SHED: RequestOutcomeKind
REQUEST_OUTCOME_KIND_LATE: RequestOutcomeKind
BREAKER_STATE_UNSPECIFIED: BreakerState
BREAKER_STATE_CLOSED: BreakerState
BREAKER_STATE_OPEN: BreakerState
BREAKER_STATE_HALF_OPEN: BreakerState

class FleetMember(_message.Message):
    __slots__ = ("replica", "load", "lease_expires_at", "registered_at")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    replica: _fleet_pb2.ReplicaDescriptor
    load: _fleet_pb2.ReplicaLoad
    lease_expires_at: _timestamp_pb2.Timestamp
    registered_at: _timestamp_pb2.Timestamp
    def __init__(self, replica: _Optional[_Union[_fleet_pb2.ReplicaDescriptor, _Mapping]] = ..., load: _Optional[_Union[_fleet_pb2.ReplicaLoad, _Mapping]] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ModelRouting(_message.Message):
    __slots__ = ("model", "stable_version", "canary_version", "canary_weight_bp")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STABLE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_BP_FIELD_NUMBER: _ClassVar[int]
    model: str
    stable_version: str
    canary_version: str
    canary_weight_bp: int
    def __init__(self, model: _Optional[str] = ..., stable_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., canary_weight_bp: _Optional[int] = ...) -> None: ...

class RolloutPolicy(_message.Message):
    __slots__ = ("window", "min_requests", "max_error_rate_increase", "max_error_rate_ratio", "max_p95_ratio", "healthy_windows_to_advance", "unhealthy_windows_to_rollback", "max_duration", "false_alarm_rate")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATE_INCREASE_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATE_RATIO_FIELD_NUMBER: _ClassVar[int]
    MAX_P95_RATIO_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_WINDOWS_TO_ADVANCE_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_WINDOWS_TO_ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    MAX_DURATION_FIELD_NUMBER: _ClassVar[int]
    FALSE_ALARM_RATE_FIELD_NUMBER: _ClassVar[int]
    window: _duration_pb2.Duration
    min_requests: int
    max_error_rate_increase: float
    max_error_rate_ratio: float
    max_p95_ratio: float
    healthy_windows_to_advance: int
    unhealthy_windows_to_rollback: int
    max_duration: _duration_pb2.Duration
    false_alarm_rate: float
    def __init__(self, window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min_requests: _Optional[int] = ..., max_error_rate_increase: _Optional[float] = ..., max_error_rate_ratio: _Optional[float] = ..., max_p95_ratio: _Optional[float] = ..., healthy_windows_to_advance: _Optional[int] = ..., unhealthy_windows_to_rollback: _Optional[int] = ..., max_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., false_alarm_rate: _Optional[float] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("id", "model", "baseline_version", "canary_version", "step_percents", "step_index", "canary_weight_bp", "state", "policy", "started_at", "updated_at", "last_decision", "paused", "auto_rollback", "approval", "awaiting_approval", "analysis_only")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BASELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_PERCENTS_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    CANARY_WEIGHT_BP_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_DECISION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    AUTO_ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    AWAITING_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_ONLY_FIELD_NUMBER: _ClassVar[int]
    id: int
    model: str
    baseline_version: str
    canary_version: str
    step_percents: _containers.RepeatedScalarFieldContainer[float]
    step_index: int
    canary_weight_bp: int
    state: RolloutState
    policy: RolloutPolicy
    started_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    last_decision: RolloutDecision
    paused: bool
    auto_rollback: bool
    approval: ApprovalMode
    awaiting_approval: bool
    analysis_only: bool
    def __init__(self, id: _Optional[int] = ..., model: _Optional[str] = ..., baseline_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., step_percents: _Optional[_Iterable[float]] = ..., step_index: _Optional[int] = ..., canary_weight_bp: _Optional[int] = ..., state: _Optional[_Union[RolloutState, str]] = ..., policy: _Optional[_Union[RolloutPolicy, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_decision: _Optional[_Union[RolloutDecision, _Mapping]] = ..., paused: _Optional[bool] = ..., auto_rollback: _Optional[bool] = ..., approval: _Optional[_Union[ApprovalMode, str]] = ..., awaiting_approval: _Optional[bool] = ..., analysis_only: _Optional[bool] = ...) -> None: ...

class ArmMetrics(_message.Message):
    __slots__ = ("version", "requests", "errors", "shed", "error_rate", "p50", "p95")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    P50_FIELD_NUMBER: _ClassVar[int]
    P95_FIELD_NUMBER: _ClassVar[int]
    version: str
    requests: int
    errors: int
    shed: int
    error_rate: float
    p50: _duration_pb2.Duration
    p95: _duration_pb2.Duration
    def __init__(self, version: _Optional[str] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., shed: _Optional[int] = ..., error_rate: _Optional[float] = ..., p50: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., p95: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class RolloutDecision(_message.Message):
    __slots__ = ("id", "rollout_id", "model", "action", "reason", "from_percent", "to_percent", "baseline", "canary", "decided_at", "detail", "statistics", "needed_requests", "applied")
    class StatisticsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FROM_PERCENT_FIELD_NUMBER: _ClassVar[int]
    TO_PERCENT_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STATISTICS_FIELD_NUMBER: _ClassVar[int]
    NEEDED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    id: int
    rollout_id: int
    model: str
    action: DecisionAction
    reason: str
    from_percent: float
    to_percent: float
    baseline: ArmMetrics
    canary: ArmMetrics
    decided_at: _timestamp_pb2.Timestamp
    detail: str
    statistics: _containers.ScalarMap[str, float]
    needed_requests: int
    applied: bool
    def __init__(self, id: _Optional[int] = ..., rollout_id: _Optional[int] = ..., model: _Optional[str] = ..., action: _Optional[_Union[DecisionAction, str]] = ..., reason: _Optional[str] = ..., from_percent: _Optional[float] = ..., to_percent: _Optional[float] = ..., baseline: _Optional[_Union[ArmMetrics, _Mapping]] = ..., canary: _Optional[_Union[ArmMetrics, _Mapping]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., detail: _Optional[str] = ..., statistics: _Optional[_Mapping[str, float]] = ..., needed_requests: _Optional[int] = ..., applied: _Optional[bool] = ...) -> None: ...

class GatewayStatus(_message.Message):
    __slots__ = ("gateway_id", "last_report_at", "concurrency_limit", "inflight", "cost_models", "breakers", "sheds", "tenants")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_AT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    COST_MODELS_FIELD_NUMBER: _ClassVar[int]
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    SHEDS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    last_report_at: _timestamp_pb2.Timestamp
    concurrency_limit: int
    inflight: int
    cost_models: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.CostModel]
    breakers: _containers.RepeatedCompositeFieldContainer[ReplicaBreaker]
    sheds: _containers.RepeatedCompositeFieldContainer[ShedCount]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantTraffic]
    def __init__(self, gateway_id: _Optional[str] = ..., last_report_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., concurrency_limit: _Optional[int] = ..., inflight: _Optional[int] = ..., cost_models: _Optional[_Iterable[_Union[_fleet_pb2.CostModel, _Mapping]]] = ..., breakers: _Optional[_Iterable[_Union[ReplicaBreaker, _Mapping]]] = ..., sheds: _Optional[_Iterable[_Union[ShedCount, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantTraffic, _Mapping]]] = ...) -> None: ...

class ReplicaBreaker(_message.Message):
    __slots__ = ("replica_id", "state")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: BreakerState
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[_Union[BreakerState, str]] = ...) -> None: ...

class ShedCount(_message.Message):
    __slots__ = ("reason", "count")
    REASON_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    count: int
    def __init__(self, reason: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class TenantTraffic(_message.Message):
    __slots__ = ("tenant", "requests", "admitted", "quota_refused", "shed", "ok", "errors")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REFUSED_FIELD_NUMBER: _ClassVar[int]
    SHED_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    requests: int
    admitted: int
    quota_refused: int
    shed: int
    ok: int
    errors: int
    def __init__(self, tenant: _Optional[str] = ..., requests: _Optional[int] = ..., admitted: _Optional[int] = ..., quota_refused: _Optional[int] = ..., shed: _Optional[int] = ..., ok: _Optional[int] = ..., errors: _Optional[int] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStateResponse(_message.Message):
    __slots__ = ("replicas", "routing", "rollouts", "gateways", "outcomes")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    GATEWAYS_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[FleetMember]
    routing: _containers.RepeatedCompositeFieldContainer[ModelRouting]
    rollouts: _containers.RepeatedCompositeFieldContainer[Rollout]
    gateways: _containers.RepeatedCompositeFieldContainer[GatewayStatus]
    outcomes: _containers.RepeatedCompositeFieldContainer[VersionOutcomes]
    def __init__(self, replicas: _Optional[_Iterable[_Union[FleetMember, _Mapping]]] = ..., routing: _Optional[_Iterable[_Union[ModelRouting, _Mapping]]] = ..., rollouts: _Optional[_Iterable[_Union[Rollout, _Mapping]]] = ..., gateways: _Optional[_Iterable[_Union[GatewayStatus, _Mapping]]] = ..., outcomes: _Optional[_Iterable[_Union[VersionOutcomes, _Mapping]]] = ...) -> None: ...

class VersionOutcomes(_message.Message):
    __slots__ = ("model", "metrics")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    model: str
    metrics: ArmMetrics
    def __init__(self, model: _Optional[str] = ..., metrics: _Optional[_Union[ArmMetrics, _Mapping]] = ...) -> None: ...

class StartRolloutRequest(_message.Message):
    __slots__ = ("model", "canary_version", "step_percents", "policy", "approval", "analysis_only")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_PERCENTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_ONLY_FIELD_NUMBER: _ClassVar[int]
    model: str
    canary_version: str
    step_percents: _containers.RepeatedScalarFieldContainer[float]
    policy: RolloutPolicy
    approval: ApprovalMode
    analysis_only: bool
    def __init__(self, model: _Optional[str] = ..., canary_version: _Optional[str] = ..., step_percents: _Optional[_Iterable[float]] = ..., policy: _Optional[_Union[RolloutPolicy, _Mapping]] = ..., approval: _Optional[_Union[ApprovalMode, str]] = ..., analysis_only: _Optional[bool] = ...) -> None: ...

class StartRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ...) -> None: ...

class PromoteRolloutRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class PromoteRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ...) -> None: ...

class AbortRolloutRequest(_message.Message):
    __slots__ = ("model", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    reason: str
    def __init__(self, model: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ...) -> None: ...

class PauseRolloutRequest(_message.Message):
    __slots__ = ("model", "auto_rollback", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    AUTO_ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    auto_rollback: bool
    reason: str
    def __init__(self, model: _Optional[str] = ..., auto_rollback: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class PauseRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ...) -> None: ...

class ResumeRolloutRequest(_message.Message):
    __slots__ = ("model", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    reason: str
    def __init__(self, model: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeRolloutResponse(_message.Message):
    __slots__ = ("rollout",)
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ...) -> None: ...

class ApproveRolloutRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ApproveRolloutResponse(_message.Message):
    __slots__ = ("rollout", "decision")
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    decision: RolloutDecision
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ..., decision: _Optional[_Union[RolloutDecision, _Mapping]] = ...) -> None: ...

class ListRolloutDecisionsRequest(_message.Message):
    __slots__ = ("model", "limit")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    model: str
    limit: int
    def __init__(self, model: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListRolloutDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[RolloutDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[RolloutDecision, _Mapping]]] = ...) -> None: ...

class WatchRolloutDecisionsRequest(_message.Message):
    __slots__ = ("model", "replay")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    model: str
    replay: int
    def __init__(self, model: _Optional[str] = ..., replay: _Optional[int] = ...) -> None: ...

class WatchRolloutDecisionsResponse(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: RolloutDecision
    def __init__(self, decision: _Optional[_Union[RolloutDecision, _Mapping]] = ...) -> None: ...

class DrainReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class DrainReplicaResponse(_message.Message):
    __slots__ = ("replica", "next_steps")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEPS_FIELD_NUMBER: _ClassVar[int]
    replica: FleetMember
    next_steps: str
    def __init__(self, replica: _Optional[_Union[FleetMember, _Mapping]] = ..., next_steps: _Optional[str] = ...) -> None: ...

class UndrainReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class UndrainReplicaResponse(_message.Message):
    __slots__ = ("replica", "was_draining", "next_steps")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    WAS_DRAINING_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEPS_FIELD_NUMBER: _ClassVar[int]
    replica: FleetMember
    was_draining: bool
    next_steps: str
    def __init__(self, replica: _Optional[_Union[FleetMember, _Mapping]] = ..., was_draining: _Optional[bool] = ..., next_steps: _Optional[str] = ...) -> None: ...

class WorkerSessionRequest(_message.Message):
    __slots__ = ("register", "heartbeat")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    register: _fleet_pb2.ReplicaDescriptor
    heartbeat: _fleet_pb2.ReplicaLoad
    def __init__(self, register: _Optional[_Union[_fleet_pb2.ReplicaDescriptor, _Mapping]] = ..., heartbeat: _Optional[_Union[_fleet_pb2.ReplicaLoad, _Mapping]] = ...) -> None: ...

class WorkerSessionResponse(_message.Message):
    __slots__ = ("lease", "drain", "undrain")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    drain: DrainCommand
    undrain: UndrainCommand
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., drain: _Optional[_Union[DrainCommand, _Mapping]] = ..., undrain: _Optional[_Union[UndrainCommand, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("replica_id", "ttl", "heartbeat_interval")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    ttl: _duration_pb2.Duration
    heartbeat_interval: _duration_pb2.Duration
    def __init__(self, replica_id: _Optional[str] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DrainCommand(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class UndrainCommand(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class WatchFleetRequest(_message.Message):
    __slots__ = ("gateway_id",)
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    def __init__(self, gateway_id: _Optional[str] = ...) -> None: ...

class WatchFleetResponse(_message.Message):
    __slots__ = ("generation", "replicas", "routing", "warming_up", "quota_leases")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    WARMING_UP_FIELD_NUMBER: _ClassVar[int]
    QUOTA_LEASES_FIELD_NUMBER: _ClassVar[int]
    generation: int
    replicas: _containers.RepeatedCompositeFieldContainer[FleetMember]
    routing: _containers.RepeatedCompositeFieldContainer[ModelRouting]
    warming_up: bool
    quota_leases: _containers.RepeatedCompositeFieldContainer[QuotaLease]
    def __init__(self, generation: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[FleetMember, _Mapping]]] = ..., routing: _Optional[_Iterable[_Union[ModelRouting, _Mapping]]] = ..., warming_up: _Optional[bool] = ..., quota_leases: _Optional[_Iterable[_Union[QuotaLease, _Mapping]]] = ...) -> None: ...

class QuotaLease(_message.Message):
    __slots__ = ("tenant", "rate_per_s", "burst", "ttl", "gateways_known")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    GATEWAYS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    rate_per_s: float
    burst: float
    ttl: _duration_pb2.Duration
    gateways_known: int
    def __init__(self, tenant: _Optional[str] = ..., rate_per_s: _Optional[float] = ..., burst: _Optional[float] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., gateways_known: _Optional[int] = ...) -> None: ...

class RequestOutcome(_message.Message):
    __slots__ = ("model", "version", "replica_id", "kind", "latency")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    replica_id: str
    kind: RequestOutcomeKind
    latency: _duration_pb2.Duration
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., replica_id: _Optional[str] = ..., kind: _Optional[_Union[RequestOutcomeKind, str]] = ..., latency: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BatchOutcome(_message.Message):
    __slots__ = ("model", "version", "replica_id", "size", "tokens", "device_time", "ok")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TIME_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    replica_id: str
    size: int
    tokens: int
    device_time: _duration_pb2.Duration
    ok: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., replica_id: _Optional[str] = ..., size: _Optional[int] = ..., tokens: _Optional[int] = ..., device_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., ok: _Optional[bool] = ...) -> None: ...

class ReportOutcomesRequest(_message.Message):
    __slots__ = ("gateway_id", "requests", "batches", "concurrency_limit", "inflight", "cost_models", "breakers", "sheds", "tenants", "demands")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    COST_MODELS_FIELD_NUMBER: _ClassVar[int]
    BREAKERS_FIELD_NUMBER: _ClassVar[int]
    SHEDS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    DEMANDS_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    requests: _containers.RepeatedCompositeFieldContainer[RequestOutcome]
    batches: _containers.RepeatedCompositeFieldContainer[BatchOutcome]
    concurrency_limit: int
    inflight: int
    cost_models: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.CostModel]
    breakers: _containers.RepeatedCompositeFieldContainer[ReplicaBreaker]
    sheds: _containers.RepeatedCompositeFieldContainer[ShedCount]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantTraffic]
    demands: _containers.RepeatedCompositeFieldContainer[TenantDemand]
    def __init__(self, gateway_id: _Optional[str] = ..., requests: _Optional[_Iterable[_Union[RequestOutcome, _Mapping]]] = ..., batches: _Optional[_Iterable[_Union[BatchOutcome, _Mapping]]] = ..., concurrency_limit: _Optional[int] = ..., inflight: _Optional[int] = ..., cost_models: _Optional[_Iterable[_Union[_fleet_pb2.CostModel, _Mapping]]] = ..., breakers: _Optional[_Iterable[_Union[ReplicaBreaker, _Mapping]]] = ..., sheds: _Optional[_Iterable[_Union[ShedCount, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantTraffic, _Mapping]]] = ..., demands: _Optional[_Iterable[_Union[TenantDemand, _Mapping]]] = ...) -> None: ...

class TenantDemand(_message.Message):
    __slots__ = ("tenant", "rate_per_s", "contract_rate_per_s", "contract_burst")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    CONTRACT_BURST_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    rate_per_s: float
    contract_rate_per_s: float
    contract_burst: float
    def __init__(self, tenant: _Optional[str] = ..., rate_per_s: _Optional[float] = ..., contract_rate_per_s: _Optional[float] = ..., contract_burst: _Optional[float] = ...) -> None: ...

class ReportOutcomesResponse(_message.Message):
    __slots__ = ("reports_received",)
    REPORTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    reports_received: int
    def __init__(self, reports_received: _Optional[int] = ...) -> None: ...
