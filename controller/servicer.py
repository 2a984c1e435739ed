"""``ControlService`` over gRPC: a thin adapter from RPCs to the controller's parts.

What it decides: only the wire behaviour — which message is read and written when, and how
each domain exception becomes a status (:meth:`ControlService._fail`, the one place that maps
them). Membership lives in :mod:`controller.fleet`, outcome evidence in
:mod:`controller.outcomes`, rollouts in :mod:`controller.rollouts`, history in
:mod:`controller.store`.

Authorization is not checked here: the host's :class:`common.auth.AuthPolicy` rejects a call
before its handler runs, per :data:`common.auth.METHOD_ACCESS` — workers and gateways need the
fleet credential (WorkerSession, WatchFleet, ReportOutcomes), everything else needs the
operator credential.

Input bounds are checked before anything is looked up or echoed: identifiers by
:func:`controller.registry.identifier_problem` (a replica id in DrainReplica / UndrainReplica,
a gateway id in WatchFleet; registrations in :func:`controller.registry.validate_descriptor`,
rollout names in :mod:`controller.rollout_requests`), Durations by
:func:`common.durations.checked_seconds` (a :class:`~common.durations.DurationOutOfRange`
anywhere becomes INVALID_ARGUMENT naming its field, here). Report streams never refuse: an
out-of-range item is dropped and counted (:mod:`controller.outcomes`). Every value a status
repeats goes through :func:`common.errors.echo`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import NoReturn

import grpc
import grpc.aio

from common.durations import DurationOutOfRange
from common.errors import (
    Reason,
    RichError,
    abort,
    echo,
    internal,
    invalid_argument,
    not_found_model,
)
from controller import drain_advice, rollout_requests
from controller.convert import (
    WallClock,
    decision_to_pb,
    gateway_to_pb,
    member_to_pb,
    rollout_to_pb,
    version_outcomes_to_pb,
)
from controller.drop_log import DropLog
from controller.fleet import FleetManager, SessionEnd, WorkerSessionHandle
from controller.metrics import ControllerMetrics
from controller.outcomes import OutcomeAggregator
from controller.quotas.grants import QuotaGrants
from controller.registry import (
    MAX_ID_CHARS,
    InvalidDescriptor,
    UnknownMember,
    identifier_problem,
)
from controller.rollouts import (
    AnalysisOnlyRollout,
    DecisionNotStored,
    NoActiveRollout,
    NoCanaryReplica,
    NoStableVersion,
    NotAwaitingApproval,
    RolloutAlreadyPaused,
    RolloutBusy,
    RolloutManager,
    RolloutNotPaused,
    UnknownModel,
)
from controller.store import ControllerStore, DecisionRecord, StoreUnavailable
from halcyon.v1 import control_pb2, control_pb2_grpc

__all__ = ["SERVICE_NAME", "ControlService"]

_log = logging.getLogger("halcyon.controller.servicer")

SERVICE_NAME = "halcyon.v1.ControlService"
MAX_DECISIONS = 10_000
DEFAULT_DECISIONS = 100


class ControlService(control_pb2_grpc.ControlServiceServicer):
    """The controller's RPCs."""

    def __init__(
        self,
        *,
        fleet: FleetManager,
        outcomes: OutcomeAggregator,
        quotas: QuotaGrants,
        store: ControllerStore,
        rollouts: RolloutManager,
        metrics: ControllerMetrics,
        wall: WallClock,
        drop_log: DropLog,
        coalesce_s: float = 0.01,
    ) -> None:
        self._fleet = fleet
        self._outcomes = outcomes
        self._quotas = quotas
        self._store = store
        self._rollouts = rollouts
        self._metrics = metrics
        self._wall = wall
        self._drop_log = drop_log
        self._coalesce_s = coalesce_s

    # -- the one place exceptions become statuses ---------------------------------------------

    @staticmethod
    async def _fail(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
        if isinstance(exc, RichError):
            err = exc
        elif isinstance(exc, InvalidDescriptor):
            err = invalid_argument(f"register.{exc.field}", exc.description)
        elif isinstance(exc, DurationOutOfRange):
            err = invalid_argument(exc.field, exc.description)
        elif isinstance(exc, UnknownMember):
            err = RichError(grpc.StatusCode.NOT_FOUND, str(exc), reason=Reason.UNKNOWN_REPLICA)
        elif isinstance(exc, UnknownModel):
            err = not_found_model(exc.model)
            if exc.precondition:
                err.code = grpc.StatusCode.FAILED_PRECONDITION
            err.message = str(exc)
        elif isinstance(exc, NoStableVersion):
            err = _precondition(exc, Reason.NO_STABLE_VERSION, model=exc.model)
        elif isinstance(exc, NoCanaryReplica):
            err = _precondition(exc, Reason.NO_CANARY_REPLICA, model=exc.model, version=exc.version)
        elif isinstance(exc, RolloutBusy):
            err = _precondition(
                exc,
                Reason.ROLLOUT_CONFLICT,
                model=exc.rollout.model,
                rollout_id=str(exc.rollout.id),
                canary_version=exc.rollout.canary_version,
            )
        elif isinstance(exc, NoActiveRollout):
            err = _precondition(exc, Reason.NO_ACTIVE_ROLLOUT, model=exc.model)
        elif isinstance(exc, RolloutAlreadyPaused | RolloutNotPaused | NotAwaitingApproval):
            reason = {
                RolloutAlreadyPaused: Reason.ROLLOUT_ALREADY_PAUSED,
                RolloutNotPaused: Reason.ROLLOUT_NOT_PAUSED,
                NotAwaitingApproval: Reason.ROLLOUT_NOT_AWAITING_APPROVAL,
            }[type(exc)]
            err = _precondition(
                exc, reason, model=exc.rollout.model, rollout_id=str(exc.rollout.id)
            )
        elif isinstance(exc, AnalysisOnlyRollout):
            err = _precondition(
                exc,
                Reason.ROLLOUT_ANALYSIS_ONLY,
                model=exc.rollout.model,
                rollout_id=str(exc.rollout.id),
            )
        elif isinstance(exc, DecisionNotStored | StoreUnavailable):
            err = RichError(
                grpc.StatusCode.UNAVAILABLE,
                str(exc),
                reason=Reason.STORE_UNAVAILABLE,
                retry_after_s=1.0,
            )
        else:  # pragma: no cover - a bug; do not leak internals to the caller
            _log.exception("unexpected error in ControlService", exc_info=exc)
            err = internal("internal error in the controller")
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
        problem = identifier_problem(request.gateway_id, MAX_ID_CHARS, required=False)
        if problem is not None:
            await self._fail(context, invalid_argument("gateway_id", problem))
        self._metrics.fleet_watchers.inc()
        _log.info("fleet watcher connected", extra={"gateway_id": request.gateway_id})
        sent: tuple[int, int] | None = None
        try:
            with feed.subscribe() as subscription:
                while True:
                    snapshot = self._fleet.view.snapshot()
                    # A new fleet generation, or a quota grant renewing this gateway's leases.
                    version = (snapshot.generation, self._quotas.round)
                    if version != sent:
                        await context.write(self._with_leases(snapshot, request.gateway_id))
                        sent = version
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
            self._quotas.forget(request.gateway_id)
            self._metrics.fleet_watchers.dec()
            _log.info("fleet watcher gone", extra={"gateway_id": request.gateway_id})

    def _with_leases(
        self, snapshot: control_pb2.WatchFleetResponse, gateway_id: str
    ) -> control_pb2.WatchFleetResponse:
        """The shared snapshot as is, or a copy carrying the gateway's quota leases."""
        leases = self._quotas.leases_for(gateway_id)
        if not leases:
            return snapshot
        own = control_pb2.WatchFleetResponse()
        own.CopyFrom(snapshot)
        own.quota_leases.extend(leases)
        return own

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
        # Never rejects: malformed items are dropped and counted, the rest is evidence.
        result = self._outcomes.ingest(report)
        if report.gateway_id:
            self._quotas.report(report.gateway_id, report.demands)
        self._metrics.count_outcomes(result.counted, result.dropped)
        if result.dropped:
            self._drop_log.record(echo(report.gateway_id), result.dropped, result.problem)
        return 1

    # -- operator RPCs ------------------------------------------------------------------------

    async def GetState(
        self, request: control_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.GetStateResponse:
        try:
            rollouts = await asyncio.to_thread(self._store.list_rollouts)
            latest = await asyncio.to_thread(self._store.latest_decisions)
        except StoreUnavailable as exc:
            await self._fail(context, exc)
        gateways = [gateway_to_pb(report, self._wall) for report in self._outcomes.gateways()]
        return control_pb2.GetStateResponse(
            replicas=[member_to_pb(m, self._wall) for m in self._fleet.registry.members()],
            routing=self._fleet.view.resolution().routes,
            rollouts=[rollout_to_pb(r, latest.get(r.id)) for r in rollouts],
            gateways=gateways,
            outcomes=[version_outcomes_to_pb(w) for w in self._outcomes.windows()],
        )

    async def DrainReplica(
        self, request: control_pb2.DrainReplicaRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.DrainReplicaResponse:
        await self._check_replica_id(request.replica_id, context)
        try:
            member = self._fleet.drain(request.replica_id, "operator request")
        except UnknownMember as exc:
            await self._fail(context, exc)
        return control_pb2.DrainReplicaResponse(
            replica=member_to_pb(member, self._wall), next_steps=drain_advice.after_drain(member)
        )

    async def UndrainReplica(
        self, request: control_pb2.UndrainReplicaRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.UndrainReplicaResponse:
        await self._check_replica_id(request.replica_id, context)
        try:
            member, was_draining = self._fleet.undrain(request.replica_id, "operator request")
        except UnknownMember as exc:
            await self._fail(context, exc)
        return control_pb2.UndrainReplicaResponse(
            replica=member_to_pb(member, self._wall),
            was_draining=was_draining,
            next_steps=drain_advice.after_undrain(member, was_draining),
        )

    async def _check_replica_id(self, replica_id: str, context: grpc.aio.ServicerContext) -> None:
        problem = identifier_problem(replica_id, MAX_ID_CHARS)
        if problem is not None:
            description = "is required" if not replica_id.strip() else problem
            await self._fail(context, invalid_argument("replica_id", description))

    async def StartRollout(
        self, request: control_pb2.StartRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.StartRolloutResponse:
        route = self._fleet.view.resolution().for_model(request.model)
        stable = route.stable_version if route is not None and route.stable_version else None
        try:
            start = rollout_requests.parse_start(request, stable)
            record = await self._rollouts.start_rollout(start)
            latest = await self._latest(record.id)
        except Exception as exc:
            await self._fail(context, exc)
        return control_pb2.StartRolloutResponse(rollout=rollout_to_pb(record, latest))

    async def PromoteRollout(
        self, request: control_pb2.PromoteRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.PromoteRolloutResponse:
        try:
            rollout_requests.validate_model(request.model)
            record = await self._rollouts.promote(request.model)
            latest = await self._latest(record.id)
        except Exception as exc:
            await self._fail(context, exc)
        return control_pb2.PromoteRolloutResponse(rollout=rollout_to_pb(record, latest))

    async def AbortRollout(
        self, request: control_pb2.AbortRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.AbortRolloutResponse:
        try:
            rollout_requests.validate_model(request.model)
            rollout_requests.validate_reason(request.reason)
            record = await self._rollouts.abort(request.model, request.reason.strip())
            latest = await self._latest(record.id)
        except Exception as exc:
            await self._fail(context, exc)
        return control_pb2.AbortRolloutResponse(rollout=rollout_to_pb(record, latest))

    async def PauseRollout(
        self, request: control_pb2.PauseRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.PauseRolloutResponse:
        try:
            rollout_requests.validate_model(request.model)
            rollout_requests.validate_reason(request.reason)
            auto_rollback = request.auto_rollback if request.HasField("auto_rollback") else True
            record = await self._rollouts.pause(
                request.model, auto_rollback=auto_rollback, why=request.reason.strip()
            )
            latest = await self._latest(record.id)
        except Exception as exc:
            await self._fail(context, exc)
        return control_pb2.PauseRolloutResponse(rollout=rollout_to_pb(record, latest))

    async def ResumeRollout(
        self, request: control_pb2.ResumeRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.ResumeRolloutResponse:
        try:
            rollout_requests.validate_model(request.model)
            rollout_requests.validate_reason(request.reason)
            record = await self._rollouts.resume_rollout(request.model, why=request.reason.strip())
            latest = await self._latest(record.id)
        except Exception as exc:
            await self._fail(context, exc)
        return control_pb2.ResumeRolloutResponse(rollout=rollout_to_pb(record, latest))

    async def ApproveRollout(
        self, request: control_pb2.ApproveRolloutRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.ApproveRolloutResponse:
        try:
            rollout_requests.validate_model(request.model)
            record, decision = await self._rollouts.approve(request.model)
        except Exception as exc:
            await self._fail(context, exc)
        return control_pb2.ApproveRolloutResponse(
            rollout=rollout_to_pb(record, decision), decision=decision_to_pb(decision)
        )

    async def _latest(self, rollout_id: int) -> DecisionRecord | None:
        found = await asyncio.to_thread(self._store.list_decisions, rollout_id=rollout_id, limit=1)
        return found[0] if found else None

    async def _check_known(self, model: str) -> None:
        """NOT_FOUND for a model named in a request that the controller has never heard of
        (INVALID_ARGUMENT for a name longer than any model's)."""
        if model:
            rollout_requests.validate_model(model)
        if model and not await self._rollouts.knows_model(model):
            raise UnknownModel(model)

    async def ListRolloutDecisions(
        self, request: control_pb2.ListRolloutDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> control_pb2.ListRolloutDecisionsResponse:
        limit = min(request.limit or DEFAULT_DECISIONS, MAX_DECISIONS)
        try:
            await self._check_known(request.model)
            decisions = await asyncio.to_thread(
                self._store.list_decisions, request.model or None, limit=limit
            )
        except (UnknownModel, RichError, StoreUnavailable) as exc:
            await self._fail(context, exc)
        return control_pb2.ListRolloutDecisionsResponse(
            decisions=[decision_to_pb(d) for d in decisions]
        )

    async def WatchRolloutDecisions(  # type: ignore[override]  # writes via context.write
        self, request: control_pb2.WatchRolloutDecisionsRequest, context: grpc.aio.ServicerContext
    ) -> None:
        try:
            await self._check_known(request.model)
        except (UnknownModel, RichError) as exc:
            await self._fail(context, exc)
        feed = self._rollouts.feed
        if feed.closed:
            await self._fail(context, self._shutting_down())
        # Subscribe before reading the replay, then skip what the replay already sent: no
        # decision can fall between the two, and none is sent twice.
        with feed.subscribe(request.model or None) as subscription:
            sent = 0
            if request.replay:
                replay = await asyncio.to_thread(
                    self._store.list_decisions,
                    request.model or None,
                    limit=min(request.replay, MAX_DECISIONS),
                )
                for decision in replay:
                    await context.write(_watch_item(decision))
                    sent = decision.id
            while True:
                live = await subscription.next()
                if live is None:
                    break
                if live.id > sent:
                    await context.write(_watch_item(live))
                    sent = live.id
            if subscription.overflowed:
                await self._fail(
                    context,
                    RichError(
                        grpc.StatusCode.UNAVAILABLE,
                        "this watcher fell too far behind the decision stream; watch again "
                        "(with replay to catch up)",
                        reason=Reason.OVERLOADED,
                        retry_after_s=0.1,
                    ),
                )


def _watch_item(decision: DecisionRecord) -> control_pb2.WatchRolloutDecisionsResponse:
    return control_pb2.WatchRolloutDecisionsResponse(decision=decision_to_pb(decision))


def _precondition(exc: Exception, reason: Reason, **metadata: str) -> RichError:
    return RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        echo(str(exc), 1024),
        reason=reason,
        metadata={k: echo(v) for k, v in metadata.items()},
    )
