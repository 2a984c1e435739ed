import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaDescriptor(_message.Message):
    __slots__ = ("replica_id", "address", "model", "version", "hardware", "slots", "speed", "runtime", "warmup")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    WARMUP_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    model: str
    version: str
    hardware: str
    slots: int
    speed: float
    runtime: str
    warmup: _containers.RepeatedCompositeFieldContainer[CostSample]
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., hardware: _Optional[str] = ..., slots: _Optional[int] = ..., speed: _Optional[float] = ..., runtime: _Optional[str] = ..., warmup: _Optional[_Iterable[_Union[CostSample, _Mapping]]] = ...) -> None: ...

class CostSample(_message.Message):
    __slots__ = ("items", "batch_tokens", "longest_output_tokens", "device_time")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LONGEST_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TIME_FIELD_NUMBER: _ClassVar[int]
    items: int
    batch_tokens: int
    longest_output_tokens: int
    device_time: _duration_pb2.Duration
    def __init__(self, items: _Optional[int] = ..., batch_tokens: _Optional[int] = ..., longest_output_tokens: _Optional[int] = ..., device_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReplicaLoad(_message.Message):
    __slots__ = ("busy_slots", "batches_total", "batches_failed", "draining")
    BUSY_SLOTS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FAILED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    busy_slots: int
    batches_total: int
    batches_failed: int
    draining: bool
    def __init__(self, busy_slots: _Optional[int] = ..., batches_total: _Optional[int] = ..., batches_failed: _Optional[int] = ..., draining: _Optional[bool] = ...) -> None: ...

class CostModel(_message.Message):
    __slots__ = ("replica_id", "intercept", "per_token", "samples", "per_step")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    INTERCEPT_FIELD_NUMBER: _ClassVar[int]
    PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PER_STEP_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    intercept: _duration_pb2.Duration
    per_token: _duration_pb2.Duration
    samples: int
    per_step: _duration_pb2.Duration
    def __init__(self, replica_id: _Optional[str] = ..., intercept: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., per_token: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., samples: _Optional[int] = ..., per_step: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
