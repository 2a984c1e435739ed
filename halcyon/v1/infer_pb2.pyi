import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]
    PRIORITY_STANDARD: _ClassVar[Priority]
    PRIORITY_SHEDDABLE: _ClassVar[Priority]

class Lane(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LANE_UNSPECIFIED: _ClassVar[Lane]
    LANE_INTERACTIVE: _ClassVar[Lane]
    LANE_BULK: _ClassVar[Lane]

class FlushReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLUSH_REASON_UNSPECIFIED: _ClassVar[FlushReason]
    FLUSH_REASON_DEADLINE: _ClassVar[FlushReason]
    FLUSH_REASON_FULL: _ClassVar[FlushReason]
    FLUSH_REASON_LINGER: _ClassVar[FlushReason]
    FLUSH_REASON_CAPACITY: _ClassVar[FlushReason]
    FLUSH_REASON_DRAIN: _ClassVar[FlushReason]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_CRITICAL: Priority
PRIORITY_STANDARD: Priority
PRIORITY_SHEDDABLE: Priority
LANE_UNSPECIFIED: Lane
LANE_INTERACTIVE: Lane
LANE_BULK: Lane
FLUSH_REASON_UNSPECIFIED: FlushReason
FLUSH_REASON_DEADLINE: FlushReason
FLUSH_REASON_FULL: FlushReason
FLUSH_REASON_LINGER: FlushReason
FLUSH_REASON_CAPACITY: FlushReason
FLUSH_REASON_DRAIN: FlushReason

class InferRequest(_message.Message):
    __slots__ = ("model", "input", "max_output_tokens", "session_key", "priority", "lane", "timeout")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    model: str
    input: str
    max_output_tokens: int
    session_key: str
    priority: Priority
    lane: Lane
    timeout: _duration_pb2.Duration
    def __init__(self, model: _Optional[str] = ..., input: _Optional[str] = ..., max_output_tokens: _Optional[int] = ..., session_key: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., lane: _Optional[_Union[Lane, str]] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class InferResponse(_message.Message):
    __slots__ = ("output", "model", "version", "replica_id", "hedged", "timings", "batch", "usage", "request_id")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    HEDGED_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    output: str
    model: str
    version: str
    replica_id: str
    hedged: bool
    timings: Timings
    batch: BatchInfo
    usage: Usage
    request_id: str
    def __init__(self, output: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., replica_id: _Optional[str] = ..., hedged: _Optional[bool] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., batch: _Optional[_Union[BatchInfo, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queued", "execution", "total")
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    queued: _duration_pb2.Duration
    execution: _duration_pb2.Duration
    total: _duration_pb2.Duration
    def __init__(self, queued: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., execution: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., total: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BatchInfo(_message.Message):
    __slots__ = ("size", "flush_reason", "tokens")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    size: int
    flush_reason: FlushReason
    tokens: int
    def __init__(self, size: _Optional[int] = ..., flush_reason: _Optional[_Union[FlushReason, str]] = ..., tokens: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens", "total_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    total_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...
