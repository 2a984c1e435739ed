"""``halcyon.v1.WorkerService``: protobuf in, replica calls, protobuf out.

What it decides: nothing of substance — it is the thin adapter the design asks for. Requests
are validated by :mod:`worker.validation`, run by :class:`~worker.replica.Replica`, and every
failure is turned into a status by :func:`worker.rejections.to_rich_error`, all in one place.
ExecuteBatch has one adapter, :class:`ExecuteBatchAdapter`, for both transports (the
completion queue and ``grpc.aio``, behind the host's unary pipeline); Drain, Undrain and
Describe are servicer methods. ExecuteBatch continues the caller's trace: its RPC span (made
by the pipeline's tracing layer) is a child of the W3C context in the call metadata, and
:meth:`WorkerService.execute` adds what the batch was and how it ended.

A response that cannot be built or encoded (a bug: a value its field cannot hold) is answered
INTERNAL with reason ``INTERNAL`` on both serving paths, never a bare INTERNAL or UNKNOWN. A
Drain ``grace`` is checked by :func:`common.durations.checked_seconds` (at most
:data:`MAX_DRAIN_GRACE_S`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from common.call import UnaryCall
from common.durations import DurationOutOfRange, checked_seconds, to_duration
from common.errors import RichError, abort, internal, invalid_argument
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from worker.descriptor import ReplicaIdentity
from worker.metrics import BatchOutcome, WorkerMetrics
from worker.rejections import shutting_down, to_rich_error
from worker.replica import DrainResult, Replica, ReplicaShuttingDown
from worker.runtime import RuntimeResult
from worker.validation import parse_batch

__all__ = [
    "DEFAULT_DRAIN_GRACE_S",
    "EXECUTE_BATCH_METHOD",
    "MAX_DRAIN_GRACE_S",
    "SERVICE_NAME",
    "ExecuteBatchAdapter",
    "WorkerService",
]

_log = logging.getLogger("halcyon.worker.servicer")

SERVICE_NAME = "halcyon.v1.WorkerService"
EXECUTE_BATCH_METHOD = f"/{SERVICE_NAME}/ExecuteBatch"
DEFAULT_DRAIN_GRACE_S = 30.0
# The longest Drain grace a caller may ask for.
MAX_DRAIN_GRACE_S = 3600.0


def _response(replica_id: str, result: RuntimeResult) -> worker_pb2.ExecuteBatchResponse:
    return worker_pb2.ExecuteBatchResponse(
        replica_id=replica_id,
        results=[
            worker_pb2.ItemResult(
                id=o.id, output=o.output, input_tokens=o.input_tokens, output_tokens=o.output_tokens
            )
            for o in result.outputs
        ],
        device_time=to_duration(result.device_time_s),
        batch_tokens=result.batch_tokens,
    )


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    """ExecuteBatch (:meth:`execute`, served by :class:`ExecuteBatchAdapter`), Drain, Undrain
    and Describe over a :class:`Replica`."""

    def __init__(
        self,
        *,
        identity: Callable[[], ReplicaIdentity],
        replica: Replica,
        drain: Callable[[float], Awaitable[DrainResult]],
        undrain: Callable[[], Awaitable[bool]],
        metrics: WorkerMetrics,
    ) -> None:
        """``identity`` is read per call (the advertised address is known only after bind);
        ``drain`` is the process's whole drain (readiness off, replica drain) and ``undrain``
        its undoing (True if there was a drain to undo)."""
        self._identity = identity
        self._replica = replica
        self._drain = drain
        self._undrain = undrain
        self._metrics = metrics

    async def ExecuteBatch(
        self, request: worker_pb2.ExecuteBatchRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ExecuteBatchResponse:
        """Never called: the host serves ExecuteBatch through :class:`ExecuteBatchAdapter`
        (``ServiceHost.add_unary`` claims the method); the generated base declares it."""
        raise NotImplementedError("ExecuteBatch is served by ExecuteBatchAdapter")

    async def execute(
        self, request: worker_pb2.ExecuteBatchRequest, metadata: Iterable[tuple[str, Any]] | None
    ) -> worker_pb2.ExecuteBatchResponse | RichError:
        """Run one batch: its response, or the typed error to send. Cancellation propagates.

        The call's RPC span is current (or nothing records it): the batch's facts go on it.
        """
        identity = self._identity()
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(
                {
                    "halcyon.batch_id": request.batch_id,
                    "halcyon.replica_id": identity.replica_id,
                    "halcyon.model": request.model,
                    "halcyon.version": request.version,
                    "halcyon.batch_size": len(request.items),
                }
            )
        try:
            items = parse_batch(request, identity)
            result = await self._replica.execute(request.batch_id, items)
        except asyncio.CancelledError:
            self._metrics.observe_outcome(BatchOutcome.CANCELLED)
            span.set_attribute("halcyon.outcome", BatchOutcome.CANCELLED.value)
            raise
        except Exception as exc:
            err, outcome = to_rich_error(exc)
            if err.reason is None:  # not one of ours: a bug worth a traceback
                _log.error("unexpected ExecuteBatch failure", exc_info=exc)
                if err.code == grpc.StatusCode.INTERNAL:  # still a typed answer
                    err = internal(err.message)
            span.set_attribute("halcyon.outcome", outcome.value)
            span.set_status(Status(StatusCode.ERROR, str(err)))
        else:
            self._metrics.observe_outcome(BatchOutcome.OK)
            self._metrics.observe_completed(
                result.device_time_s, len(result.outputs), result.batch_tokens
            )
            if span.is_recording():
                span.set_attributes(
                    {
                        "halcyon.outcome": BatchOutcome.OK.value,
                        "halcyon.batch_tokens": result.batch_tokens,
                        "halcyon.device_time_ms": result.device_time_s * 1000.0,
                    }
                )
            try:
                return _response(identity.replica_id, result)
            except Exception as exc:  # a value its field cannot hold: our bug, answered typed
                _log.error("ExecuteBatch response could not be built", exc_info=exc)
                return internal(f"the batch ran but its response could not be built ({exc})")
        self._metrics.observe_outcome(outcome)
        return err

    async def Drain(
        self, request: worker_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DrainResponse:
        grace = DEFAULT_DRAIN_GRACE_S
        if request.HasField("grace"):
            try:
                grace = checked_seconds(request.grace, "grace", maximum_s=MAX_DRAIN_GRACE_S)
            except DurationOutOfRange as exc:
                await abort(context, invalid_argument(exc.field, exc.description))
        result = await self._drain(grace)
        return worker_pb2.DrainResponse(
            batches_finished=result.batches_finished,
            batches_cancelled=result.batches_cancelled,
        )

    async def Undrain(
        self, request: worker_pb2.UndrainRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.UndrainResponse:
        try:
            was_draining = await self._undrain()
        except ReplicaShuttingDown as exc:
            await abort(context, shutting_down(str(exc)))
        return worker_pb2.UndrainResponse(was_draining=was_draining)

    async def Describe(
        self, request: worker_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DescribeResponse:
        return worker_pb2.DescribeResponse(
            replica=self._identity().to_proto(), load=self._replica.load().to_proto()
        )


class ExecuteBatchAdapter:
    """``handler(request, call)`` for ExecuteBatch on both transports: the batch runs as a
    task (with the call's span current) and its outcome is the call's answer."""

    def __init__(self, service: WorkerService) -> None:
        self._service = service
        self._running: set[asyncio.Task[worker_pb2.ExecuteBatchResponse | RichError]] = set()

    def __call__(self, request: worker_pb2.ExecuteBatchRequest, call: UnaryCall) -> None:
        span = call.span
        if span is trace.INVALID_SPAN:
            task = asyncio.ensure_future(self._service.execute(request, call.metadata))
        else:  # the task runs with the span current (it copies the context it starts in)
            token = otel_context.attach(trace.set_span_in_context(span))
            try:
                task = asyncio.ensure_future(self._service.execute(request, call.metadata))
            finally:
                otel_context.detach(token)
        self._running.add(task)
        # A cancelled call (the gateway's hedge loser, a passed deadline) frees the device.
        call.on_cancel = task.cancel

        def answer(done: asyncio.Task[worker_pb2.ExecuteBatchResponse | RichError]) -> None:
            self._running.discard(done)
            if done.cancelled():
                return  # the call was cancelled (or the process is stopping): nothing to send
            if (exc := done.exception()) is not None:
                _log.error("unexpected ExecuteBatch failure", exc_info=exc)
                call.reject(internal(f"internal error ({type(exc).__name__})"))
            elif isinstance(outcome := done.result(), RichError):
                call.reject(outcome)
            else:
                try:
                    payload = outcome.SerializeToString()
                except Exception as exc:  # pragma: no cover - an unencodable response is a bug
                    _log.error("ExecuteBatch response could not be encoded", exc_info=exc)
                    call.reject(
                        internal(f"the response could not be encoded ({type(exc).__name__})")
                    )
                else:
                    call.reply(payload)

        task.add_done_callback(answer)
