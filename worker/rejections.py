"""How the worker says no: its rejections as rich gRPC errors, mapped in one place.

What it decides: the status, reason and retry advice for each way a batch can fail to run —

* all slots busy      -> RESOURCE_EXHAUSTED / REPLICA_BUSY + RetryInfo (predicted free time):
                         backpressure, not a fault — the gateway retries elsewhere;
* backend overloaded  -> the same REPLICA_BUSY, with the backend's message and retry delay;
* draining            -> UNAVAILABLE / REPLICA_DRAINING (no retry advice: not this replica);
* device failure      -> INTERNAL / DEVICE_FAULT;
* other model/version -> FAILED_PRECONDITION / WRONG_MODEL (stale fleet view; route elsewhere);
* undrain while stopping -> FAILED_PRECONDITION / SHUTTING_DOWN (that drain is final).

:func:`to_rich_error` turns any exception from validation or execution into the error to send
and the ``outcome`` label to count, so the servicer has one ``except``.
"""

from __future__ import annotations

import grpc

from common.errors import Reason, RichError, internal, unavailable
from worker.descriptor import ReplicaIdentity
from worker.metrics import BatchOutcome
from worker.replica import ReplicaDraining
from worker.runtime import DeviceFault, RuntimeBusy
from worker.slots import SlotsBusy

__all__ = [
    "DEVICE_FAULT",
    "WRONG_MODEL",
    "backend_busy",
    "device_fault",
    "replica_busy",
    "replica_draining",
    "shutting_down",
    "to_rich_error",
    "wrong_model",
]

DEVICE_FAULT = "DEVICE_FAULT"
WRONG_MODEL = "WRONG_MODEL"


def replica_busy(busy: SlotsBusy) -> RichError:
    return RichError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        str(busy),
        reason=Reason.REPLICA_BUSY,
        metadata={"busy_slots": str(busy.busy), "slots": str(busy.capacity)},
        retry_after_s=busy.retry_after_s,
    )


def backend_busy(busy: RuntimeBusy) -> RichError:
    return RichError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        str(busy),
        reason=Reason.REPLICA_BUSY,
        metadata={"source": "backend"},
        retry_after_s=busy.retry_after_s,
    )


def replica_draining(message: str) -> RichError:
    return unavailable(Reason.REPLICA_DRAINING, message, None)


def shutting_down(message: str) -> RichError:
    return RichError(grpc.StatusCode.FAILED_PRECONDITION, message, reason=Reason.SHUTTING_DOWN)


def device_fault(message: str) -> RichError:
    return RichError(grpc.StatusCode.INTERNAL, message, reason=DEVICE_FAULT)


def wrong_model(identity: ReplicaIdentity, model: str, version: str) -> RichError:
    return RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"replica {identity.replica_id} serves {identity.model}/{identity.version}, "
        f"not {model or '<empty>'}/{version or '<empty>'}",
        reason=WRONG_MODEL,
        metadata={
            "replica_id": identity.replica_id,
            "model": identity.model,
            "version": identity.version,
        },
    )


def to_rich_error(exc: Exception) -> tuple[RichError, BatchOutcome]:
    """The error to send and the outcome to count for an ExecuteBatch failure."""
    if isinstance(exc, SlotsBusy):
        return replica_busy(exc), BatchOutcome.BUSY
    if isinstance(exc, RuntimeBusy):
        return backend_busy(exc), BatchOutcome.BUSY
    if isinstance(exc, ReplicaDraining):
        outcome = BatchOutcome.DRAINED if exc.cut_off else BatchOutcome.DRAINING
        return replica_draining(str(exc)), outcome
    if isinstance(exc, DeviceFault):
        return device_fault(str(exc) or "device fault"), BatchOutcome.DEVICE_FAULT
    if isinstance(exc, RichError):
        return exc, BatchOutcome.INVALID
    return (
        internal(f"unexpected worker error: {exc!r}"),
        BatchOutcome.DEVICE_FAULT,
    )
