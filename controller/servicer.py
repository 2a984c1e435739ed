"""``ControlService`` over gRPC: a thin adapter from RPCs to the controller's parts.

What it decides: only the wire behaviour — which message is read and written when, and how
each domain exception becomes a status (:meth:`ControlService._fail`, the one place that maps
them). Membership lives in :mod:`controller.fleet`, outcome evidence in
:mod:`controller.outcomes`, history in :mod:`controller.store`.

Authorization is not checked here: :data:`AUTH_RULES` is handed to the host's
:class:`common.auth.AuthPolicy`, which rejects a call before its handler runs — workers and
gateways need the fleet credential (WorkerSession, WatchFleet, ReportOutcomes), everything
else needs the operator credential.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, NoReturn

import grpc
import grpc.aio

from common.auth import Role
from common.errors import Reason, RichError, abort, invalid_argument
from controller import rollout_requests
from controller.convert import (
    WallClock,
    decision_to_pb,
    gateway_to_pb,
    member_to_pb,
    rollout_to_pb,
    version_outcomes_to_pb,
)
from controller.fleet import FleetManager, SessionEnd, WorkerSessionHandle
from controller.metrics import ControllerMetrics
from controller.outcomes import InvalidReport, OutcomeAggregator
from controller.registry import InvalidDescriptor, UnknownMember
from controller.store import ControllerStore
from halcyon.v1 import control_pb2, control_pb2_grpc

__all__ = ["AUTH_RULES", "SERVICE_NAME", "ControlService"]

_log = logging.getLogger("halcyon.controller.servicer")

SERVICE_NAME = "halcyon.v1.ControlService"
_PREFIX = f"/{SERVICE_NAME}/"
AUTH_RULES: Mapping[str, Role | None] = {
    _PREFIX: Role.OPERATOR,
    f"{_PREFIX}WorkerSession": Role.FLEET,
    f"{_PREFIX}WatchFleet": Role.FLEET,
    f"{_PREFIX}ReportOutcomes": Role.FLEET,
}
MAX_DECISIONS = 10_000
DEFAULT_DECISIONS = 100


class ControlService(control_pb2_grpc.ControlServiceServicer):
    """The controller's RPCs."""

    def __init__(
        self,
        *,
        fleet: FleetManager,
        outcomes: OutcomeAggregator,
        store: ControllerStore,
        metrics: ControllerMetrics,
        wall: WallClock,
        coalesce_s: float = 0.01,
    ) -> None:
        self._fleet = fleet
        self._outcomes = outcomes
        self._store = store
        self._metrics = metrics
        self._wall = wall
        self._coalesce_s = coalesce_s

    # -- the one place exceptions become statuses ---------------------------------------------

    @staticmethod
    async def _fail(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
        if isinstance(exc, RichError):
            err = exc
        elif isinstance(exc, InvalidDescriptor):
            err = invalid_argument(f"register.{exc.field}", exc.description)
        elif isinstance(exc, InvalidReport):
            err = invalid_argument(exc.field, exc.description)
        elif isinstance(exc, UnknownMember):
            err = RichError(grpc.StatusCode.NOT_FOUND, str(exc), reason=Reason.UNKNOWN_REPLICA)
        else:  # pragma: no cover - a bug; do not leak internals to the caller
            _log.exception("unexpected error in ControlService", exc_info=exc)
            err = RichError(grpc.StatusCode.INTERNAL, "internal error in the controller")
        await abort(context, err)

    def _shutting_down(self) -> RichError:
        return RichError(
            grpc.StatusCode.UNAVAILABLE,
            "the controller is shutting down; reconnect later",
            reason=Reason.SHUTTING_DOWN,
        )

    # -- fleet RPCs ---------------------------------------------------------------------------

    async def WorkerSession(  # type: ignore[override]  # writes via context.write
        self,
        request_iterator: AsyncIterator[control_pb2.WorkerSessionRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("kind") != "register":
            await self._fail(
                context,
                invalid_argument(
                    "kind", "the first WorkerSession message must be `register` (a descriptor)"
                ),
            )
        try:
            handle = self._fleet.join(first.register)
        except (InvalidDescriptor, RichError) as exc:
            await self._fail(context, exc)
        reader = asyncio.create_task(self._read_heartbeats(handle, context))
        detail = "session stream ended"
        try:
            while True:
                item = await handle.next_outgoing()
                if isinstance(item, SessionEnd):
                    if item.error is not None:
                        detail = item.error.message
                        await abort(context, item.error)
                    return
                await context.write(item)
        except asyncio.CancelledError:
            detail = "session stream cancelled"
            raise
        finally:
            reader.cancel()
            self._fleet.leave(handle, detail)

    async def _read_heartbeats(
        self, handle: WorkerSessionHandle, context: grpc.aio.ServicerContext
    ) -> None:
        """Every message after `register` must be a heartbeat; the stream's end ends the session."""
        try:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    handle.end(None)
                    return
                if message.WhichOneof("kind") != "heartbeat":
                    handle.end(
                        invalid_argument(
                            "kind", "after `register`, every WorkerSession message must be "
                            "`heartbeat`; open a new session to register again",
                        )
                    )  # fmt: skip
                    return
                self._fleet.heartbeat(handle, message.heartbeat)
                if handle.ended:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream broke under us: the session is over
            _log.debug("worker session read ended", extra={"error": repr(exc)})
            handle.end(None)

    async def WatchFleet(  # type: ignore[override]  # writes via context.write
        self, request: control_pb2.WatchFleetRequest, context: grpc.aio.ServicerContext
    ) -> None:
        feed = self._fleet.feed
        if feed.closed:
            await self._fail(context, self._shutting_down())
        self._metrics.fleet_watchers.inc()
        _log.info("fleet watcher connected", extra={"gateway_id": request.gateway_id})
        sent: int | None = None
        try:
            with feed.subscribe() as subscription:
                while True:
                    snapshot = self._fleet.view.snapshot()
                    if snapshot.generation != sent:
                        await context.write(snapshot)
                        sent = snapshot.generation
                    if not await subscription.wait():
                        return
                    if self._coalesce_s > 0:
                        # Let a burst of changes (a fleet starting up) land in one snapshot.
                        await asyncio.sleep(self._coalesce_s)
                        if feed.closed:
                            # Shutting down meanwhile: the sessions ending now empty the
                            # registry, and gateways must not take that for the fleet.
                            return
        finally:
            self._metrics.fleet_watchers.dec()
            _log.info("fleet watcher gone", extra={"gateway_id": request.gateway_id})

    async def ReportOutcomes(
        self,
        request_iterator: AsyncIterator[control_pb2.ReportOutcomesRequest],
        context: grpc.aio.ServicerContext,
    ) -> control_pb2.ReportOutcomesResponse:
        received = 0
        reports = request_iterator.__aiter__()
        closed = asyncio.ensure_future(self._fleet.closed.wait())
        try:
            while True:
                nxt = asyncio.ensure_future(reports.__anext__())
                await asyncio.wait({nxt, closed}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    # Shutting down: end the stream now; the gateway resends after reconnect.
                    nxt.cancel()
                    break
                try:
                    report = nxt.result()
                except StopAsyncIteration:
                    break
                received += await self._ingest(report, received, context)
        finally:
            closed.cancel()
        return control_pb2.ReportOutcomesResponse(reports_received=received)

    async def _ingest(
        self,
        report: control_pb2.ReportOutcomesRequest,
        received: int,
        context: grpc.aio.ServicerContext,
    ) -> int:
        try:
            by_kind = self._outcomes.ingest(report)
        except InvalidReport as exc:
            await self._fail(
                context,
                InvalidReport(
                    exc.field, f"{exc.description} (report {received + 1} on this stream)"
                ),
            )
        self._metrics.count_outcomes(by_kind)
        return 1

    # -- operator RPCs ------------------------------------------------------------------------

    async def GetState(
        self, request: control_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.GetStateResponse:
        rollouts = await asyncio.to_thread(self._store.list_rollouts)
        return control_pb2.GetStateResponse(
            replicas=[member_to_pb(m, self._wall) for m in self._fleet.registry.members()],
            routing=self._fleet.view.resolution().routes,
            rollouts=[rollout_to_pb(r) for r in rollouts],
            gateways=[gateway_to_pb(g, self._wall) for g in self._outcomes.gateways()],
            outcomes=[version_outcomes_to_pb(w) for w in self._outcomes.windows()],
        )

    async def DrainReplica(
        self, request: control_pb2.DrainReplicaRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.DrainReplicaResponse:
        if not request.replica_id.strip():
            await self._fail(context, invalid_argument("replica_id", "is required"))
        try:
            member = self._fleet.drain(request.replica_id, "operator request")
        except UnknownMember as exc:
            await self._fail(context, exc)
        return control_pb2.DrainReplicaResponse(replica=member_to_pb(member, self._wall))

    async def StartRollout(
        self, request: control_pb2.StartRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.StartRolloutResponse:
        route = self._fleet.view.resolution().for_model(request.model)
        stable = route.stable_version if route is not None and route.stable_version else None
        try:
            rollout_requests.validate_start(request, stable)
        except RichError as exc:
            await self._fail(context, exc)
        await self._fail(context, rollout_requests.not_implemented("StartRollout"))

    async def PromoteRollout(
        self, request: control_pb2.PromoteRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.PromoteRolloutResponse:
        await self._model_then_unimplemented(request.model, "PromoteRollout", context)

    async def AbortRollout(
        self, request: control_pb2.AbortRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.AbortRolloutResponse:
        await self._model_then_unimplemented(request.model, "AbortRollout", context)

    async def _model_then_unimplemented(
        self, model: str, method: str, context: grpc.aio.ServicerContext
    ) -> NoReturn:
        try:
            rollout_requests.validate_model(model)
        except RichError as exc:
            await self._fail(context, exc)
        await self._fail(context, rollout_requests.not_implemented(method))

    async def ListRolloutDecisions(
        self, request: control_pb2.ListRolloutDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.ListRolloutDecisionsResponse:
        limit = min(request.limit or DEFAULT_DECISIONS, MAX_DECISIONS)
        decisions = await asyncio.to_thread(
            self._store.list_decisions, request.model or None, limit=limit
        )
        return control_pb2.ListRolloutDecisionsResponse(
            decisions=[decision_to_pb(d) for d in decisions]
        )

    async def WatchRolloutDecisions(  # type: ignore[override]  # only aborts, for now
        self, request: control_pb2.WatchRolloutDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        await self._fail(context, rollout_requests.not_implemented("WatchRolloutDecisions"))
