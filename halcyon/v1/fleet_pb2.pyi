import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaDescriptor(_message.Message):
    __slots__ = ("replica_id", "address", "model", "version", "hardware", "slots", "speed")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HARDWARE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    model: str
    version: str
    hardware: str
    slots: int
    speed: float
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., hardware: _Optional[str] = ..., slots: _Optional[int] = ..., speed: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("replica_id", "intercept", "per_token", "samples")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    INTERCEPT_FIELD_NUMBER: _ClassVar[int]
    PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    intercept: _duration_pb2.Duration
    per_token: _duration_pb2.Duration
    samples: int
    def __init__(self, replica_id: _Optional[str] = ..., intercept: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., per_token: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., samples: _Optional[int] = ...) -> None: ...
