import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from halcyon.v1 import fleet_pb2 as _fleet_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchItem(_message.Message):
    __slots__ = ("id", "input", "input_tokens", "max_output_tokens")
    ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: str
    input: str
    input_tokens: int
    max_output_tokens: int
    def __init__(self, id: _Optional[str] = ..., input: _Optional[str] = ..., input_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ...) -> None: ...

class ExecuteBatchRequest(_message.Message):
    __slots__ = ("batch_id", "model", "version", "items")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    model: str
    version: str
    items: _containers.RepeatedCompositeFieldContainer[BatchItem]
    def __init__(self, batch_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., items: _Optional[_Iterable[_Union[BatchItem, _Mapping]]] = ...) -> None: ...

class ItemResult(_message.Message):
    __slots__ = ("id", "output", "input_tokens", "output_tokens")
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    id: str
    output: str
    input_tokens: int
    output_tokens: int
    def __init__(self, id: _Optional[str] = ..., output: _Optional[str] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class ExecuteBatchResponse(_message.Message):
    __slots__ = ("replica_id", "results", "device_time", "batch_tokens")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TIME_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    results: _containers.RepeatedCompositeFieldContainer[ItemResult]
    device_time: _duration_pb2.Duration
    batch_tokens: int
    def __init__(self, replica_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ItemResult, _Mapping]]] = ..., device_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., batch_tokens: _Optional[int] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("grace",)
    GRACE_FIELD_NUMBER: _ClassVar[int]
    grace: _duration_pb2.Duration
    def __init__(self, grace: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("batches_finished", "batches_cancelled")
    BATCHES_FINISHED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    batches_finished: int
    batches_cancelled: int
    def __init__(self, batches_finished: _Optional[int] = ..., batches_cancelled: _Optional[int] = ...) -> None: ...

class UndrainRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UndrainResponse(_message.Message):
    __slots__ = ("was_draining",)
    WAS_DRAINING_FIELD_NUMBER: _ClassVar[int]
    was_draining: bool
    def __init__(self, was_draining: _Optional[bool] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("replica", "load")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    replica: _fleet_pb2.ReplicaDescriptor
    load: _fleet_pb2.ReplicaLoad
    def __init__(self, replica: _Optional[_Union[_fleet_pb2.ReplicaDescriptor, _Mapping]] = ..., load: _Optional[_Union[_fleet_pb2.ReplicaLoad, _Mapping]] = ...) -> None: ...
