"""``halcyon.v1.WorkerService``: protobuf in, replica calls, protobuf out.

What it decides: nothing of substance — it is the thin adapter the design asks for. Requests
are validated by :mod:`worker.validation`, run by :class:`~worker.replica.Replica`, and every
failure is turned into a status by :func:`worker.rejections.to_rich_error` and sent with
:func:`common.errors.abort`, all in one place. ExecuteBatch continues the caller's trace: its
span is a child of the W3C context in the call metadata (the gateway's batch span).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc.aio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from common.durations import to_duration, to_seconds
from common.errors import abort, invalid_argument
from common.tracing import extract_context
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from worker.descriptor import ReplicaIdentity
from worker.metrics import BatchOutcome, WorkerMetrics
from worker.rejections import to_rich_error
from worker.replica import DrainResult, Replica
from worker.runtime import RuntimeResult
from worker.validation import parse_batch

__all__ = ["DEFAULT_DRAIN_GRACE_S", "SERVICE_NAME", "WorkerService"]

_log = logging.getLogger("halcyon.worker.servicer")

SERVICE_NAME = "halcyon.v1.WorkerService"
DEFAULT_DRAIN_GRACE_S = 30.0


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


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):  # type: ignore[misc]
    """ExecuteBatch, Drain and Describe over a :class:`Replica`."""

    def __init__(
        self,
        *,
        identity: Callable[[], ReplicaIdentity],
        replica: Replica,
        drain: Callable[[float], Awaitable[DrainResult]],
        metrics: WorkerMetrics,
        tracer: trace.Tracer | None = None,
    ) -> None:
        """``identity`` is read per call (the advertised address is known only after bind);
        ``drain`` is the process's whole drain (readiness off, replica drain, deregister)."""
        self._identity = identity
        self._replica = replica
        self._drain = drain
        self._metrics = metrics
        self._tracer = tracer if tracer is not None else trace.get_tracer("halcyon.worker")

    async def ExecuteBatch(
        self, request: worker_pb2.ExecuteBatchRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ExecuteBatchResponse:
        identity = self._identity()
        parent = extract_context(context.invocation_metadata())
        with self._tracer.start_as_current_span(
            f"{SERVICE_NAME}/ExecuteBatch",  # the RPC span name OpenTelemetry conventions use
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "halcyon.batch_id": request.batch_id,
                "halcyon.replica_id": identity.replica_id,
                "halcyon.model": request.model,
                "halcyon.version": request.version,
                "halcyon.batch_size": len(request.items),
            },
        ) as span:
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
                span.set_attribute("halcyon.outcome", outcome.value)
                span.set_status(Status(StatusCode.ERROR, str(err)))
            else:
                self._metrics.observe_outcome(BatchOutcome.OK)
                self._metrics.observe_completed(
                    result.device_time_s, len(result.outputs), result.batch_tokens
                )
                span.set_attribute("halcyon.outcome", BatchOutcome.OK.value)
                span.set_attribute("halcyon.batch_tokens", result.batch_tokens)
                span.set_attribute("halcyon.device_time_ms", result.device_time_s * 1000.0)
                return _response(identity.replica_id, result)
        self._metrics.observe_outcome(outcome)
        await abort(context, err)

    async def Drain(
        self, request: worker_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DrainResponse:
        grace = DEFAULT_DRAIN_GRACE_S
        if request.HasField("grace"):
            grace = to_seconds(request.grace)
            if grace < 0:
                await abort(context, invalid_argument("grace", "must not be negative"))
        result = await self._drain(grace)
        return worker_pb2.DrainResponse(
            batches_finished=result.batches_finished,
            batches_cancelled=result.batches_cancelled,
        )

    async def Describe(
        self, request: worker_pb2.DescribeRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.DescribeResponse:
        return worker_pb2.DescribeResponse(
            replica=self._identity().to_proto(), load=self._replica.load().to_proto()
        )
