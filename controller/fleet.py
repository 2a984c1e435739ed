"""Worker sessions around the registry: joining, heartbeats, leaving, expiry and drain commands.

What it decides: the side effects of every membership change, in one place — the registry is
updated, the change is recorded as a fleet event (registered / removed / expired / drained),
replica metrics are rebuilt, WatchFleet subscribers are woken, and a model left without a
stable version is logged once. It also owns each worker's *outbox*: the responses the
controller sends on that worker's ``WorkerSession`` stream (its lease, drain commands) and the
instruction to end the stream (lease lapsed, replaced by a re-registration, shutdown).

The sweeper expires lapsed leases every ``sweep_interval_s`` (``lease_ttl / 4`` by default), so
a worker whose heartbeats stop leaves the fleet within ``ttl + ttl/4``. A controller that has
just started ends its fleet view's warm-up on time (:mod:`controller.fleet_view`), publishing
the snapshot gateways take as the whole fleet.

No gRPC here beyond the message types and :class:`common.errors.RichError`; the servicer reads
from the outbox and writes to the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc

from common.clock import Clock
from common.durations import to_duration
from common.errors import Reason, RichError
from controller.convert import WallClock
from controller.event_writer import FleetEventWriter
from controller.feed import ChangeFeed
from controller.fleet_view import FleetView
from controller.metrics import ControllerMetrics
from controller.registry import FleetRegistry, LeaseExpired, Member
from controller.store import FleetEvent, FleetEventKind
from halcyon.v1 import control_pb2, fleet_pb2

__all__ = ["FleetManager", "SessionEnd", "WorkerSessionHandle"]

_log = logging.getLogger("halcyon.controller.fleet")


@dataclass(frozen=True)
class SessionEnd:
    """End the worker's stream: with ``error`` as its status, or OK when None."""

    error: RichError | None = None


class WorkerSessionHandle:
    """One worker's session: its registry session id and its outbox."""

    def __init__(self, replica_id: str, session: int) -> None:
        self.replica_id = replica_id
        self.session = session
        self._outbox: asyncio.Queue[control_pb2.WorkerSessionResponse | SessionEnd] = (
            asyncio.Queue()
        )
        self.ended = False

    def send(self, response: control_pb2.WorkerSessionResponse) -> None:
        if not self.ended:
            self._outbox.put_nowait(response)

    def end(self, error: RichError | None = None) -> None:
        """Ask the stream to close (first call wins)."""
        if not self.ended:
            self.ended = True
            self._outbox.put_nowait(SessionEnd(error))

    async def next_outgoing(self) -> control_pb2.WorkerSessionResponse | SessionEnd:
        return await self._outbox.get()


def _lease_expired(member: Member, ttl_s: float) -> RichError:
    return RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"lease of replica {member.replica_id!r} expired: no heartbeat within {ttl_s:g}s; "
        "open a new session and register again",
        reason=Reason.LEASE_EXPIRED,
        metadata={"replica_id": member.replica_id},
    )


def _replaced(member: Member) -> RichError:
    return RichError(
        grpc.StatusCode.ABORTED,
        f"replica {member.replica_id!r} registered again on another session; this one is closed",
        reason=Reason.SESSION_REPLACED,
        metadata={"replica_id": member.replica_id},
    )


class FleetManager:
    """Membership changes with all their side effects, and the worker sessions' outboxes."""

    def __init__(
        self,
        *,
        registry: FleetRegistry,
        view: FleetView,
        feed: ChangeFeed,
        events: FleetEventWriter,
        metrics: ControllerMetrics,
        wall: WallClock,
        clock: Clock,
        heartbeat_interval_s: float,
        sweep_interval_s: float | None = None,
    ) -> None:
        if not heartbeat_interval_s > 0.0:
            raise ValueError("heartbeat_interval_s must be positive")
        if heartbeat_interval_s >= registry.lease_ttl_s:
            raise ValueError(
                f"heartbeat interval {heartbeat_interval_s:g}s must be shorter than the lease "
                f"ttl {registry.lease_ttl_s:g}s"
            )
        self.registry = registry
        self.view = view
        self.feed = feed
        self._events = events
        self._metrics = metrics
        self._wall = wall
        self._clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self.sweep_interval_s = (
            registry.lease_ttl_s / 4 if sweep_interval_s is None else sweep_interval_s
        )
        self._sessions: dict[str, WorkerSessionHandle] = {}
        self._unresolved_warned: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._warm_up: asyncio.Task[None] | None = None
        self.closing = False
        # Set on close: client streams (outcome reports) end on it instead of holding the
        # server's stop for its whole grace period.
        self.closed = asyncio.Event()

    # -- side effects of every change ---------------------------------------------------------

    def _event(self, kind: FleetEventKind, member: Member, detail: str = "") -> None:
        d = member.descriptor
        self._events.record(
            FleetEvent(
                at=self._wall.now(),
                kind=kind,
                replica_id=d.replica_id,
                model=d.model,
                version=d.version,
                address=d.address,
                detail=detail,
            )
        )

    def notify_changed(self) -> None:
        """Publish the fleet after any change (membership, draining, routing configuration)."""
        self._metrics.set_members(self.registry.members())
        self._metrics.fleet_generation.set(self.view.generation)
        unresolved = self.view.resolution().unresolved
        for model, versions in unresolved.items():
            if model not in self._unresolved_warned:
                _log.warning(
                    "model has several versions registered and no configured stable version; "
                    "gateways will refuse it until one is configured (--stable MODEL=VERSION)",
                    extra={"model": model, "versions": list(versions)},
                )
        self._unresolved_warned = set(unresolved)
        self.feed.publish()

    # -- sessions -----------------------------------------------------------------------------

    def join(self, descriptor: fleet_pb2.ReplicaDescriptor) -> WorkerSessionHandle:
        """Register a worker and open its session (raises registry.InvalidDescriptor)."""
        if self.closing:
            raise RichError(
                grpc.StatusCode.UNAVAILABLE,
                "the controller is shutting down; register with it (or another) again later",
                reason=Reason.SHUTTING_DOWN,
            )
        member, replaced = self.registry.register(descriptor)
        if replaced is not None:
            self._event(FleetEventKind.REMOVED, replaced, "replaced by a new registration")
            old = self._sessions.get(replaced.replica_id)
            if old is not None:
                old.end(_replaced(replaced))
        handle = WorkerSessionHandle(member.replica_id, member.session)
        self._sessions[member.replica_id] = handle
        self._metrics.registrations.inc()
        self._event(FleetEventKind.REGISTERED, member)
        _log.info(
            "replica registered",
            extra={"replica_id": member.replica_id, "address": descriptor.address,
                   "model": descriptor.model, "version": descriptor.version,
                   "replaced": replaced is not None},
        )  # fmt: skip
        handle.send(
            control_pb2.WorkerSessionResponse(
                lease=control_pb2.Lease(
                    replica_id=member.replica_id,
                    ttl=to_duration(self.registry.lease_ttl_s),
                    heartbeat_interval=to_duration(self.heartbeat_interval_s),
                )
            )
        )
        self.notify_changed()
        return handle

    def heartbeat(self, handle: WorkerSessionHandle, load: fleet_pb2.ReplicaLoad) -> None:
        """Renew the lease; a lapsed lease ends the session with FAILED_PRECONDITION."""
        before = self.registry.generation
        try:
            self.registry.heartbeat(handle.replica_id, load, handle.session)
        except LeaseExpired as exc:
            self._expired(exc.member, "heartbeat arrived after the lease lapsed")
            handle.end(_lease_expired(exc.member, self.registry.lease_ttl_s))
            self.notify_changed()
            return
        if self.registry.generation != before:
            self.notify_changed()

    def leave(self, handle: WorkerSessionHandle, detail: str) -> None:
        """The session's stream ended: the replica leaves (unless already gone or replaced)."""
        handle.ended = True
        if self._sessions.get(handle.replica_id) is handle:
            del self._sessions[handle.replica_id]
        member = self.registry.remove(handle.replica_id, handle.session)
        if member is None:
            return
        if self.closing:
            detail = "controller shutting down"
        self._event(FleetEventKind.REMOVED, member, detail)
        _log.info("replica left", extra={"replica_id": member.replica_id, "detail": detail})
        self.notify_changed()

    def drain(self, replica_id: str, reason: str) -> Member:
        """Send a DrainCommand on the replica's stream and stop routing to it at once.

        Raises registry.UnknownMember if the replica is not a member.
        """
        before = self.registry.generation
        member = self.registry.request_drain(replica_id)
        handle = self._sessions.get(replica_id)
        if handle is not None:
            handle.send(
                control_pb2.WorkerSessionResponse(drain=control_pb2.DrainCommand(reason=reason))
            )
        self._event(FleetEventKind.DRAINED, member, reason)
        _log.info("drain requested", extra={"replica_id": replica_id, "reason": reason})
        if self.registry.generation != before:
            self.notify_changed()
        return member

    # -- expiry -------------------------------------------------------------------------------

    def _expired(self, member: Member, detail: str) -> None:
        self._metrics.lease_expirations.inc()
        self._event(FleetEventKind.EXPIRED, member, detail)
        _log.warning(
            "replica lease expired", extra={"replica_id": member.replica_id, "detail": detail}
        )

    def sweep(self) -> list[Member]:
        """Expire lapsed leases now; their sessions are ended."""
        expired = self.registry.expire()
        for member in expired:
            self._expired(member, f"no heartbeat within {self.registry.lease_ttl_s:g}s")
            handle = self._sessions.get(member.replica_id)
            if handle is not None and handle.session == member.session:
                del self._sessions[member.replica_id]
                handle.end(_lease_expired(member, self.registry.lease_ttl_s))
        if expired:
            self.notify_changed()
        return expired

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                self.sweep()
            except Exception:  # never let one bad sweep stop expiry for good
                _log.exception("lease sweep failed")

    def end_warm_up(self) -> bool:
        """End the warm-up if it is due; publish the established fleet when it ends."""
        if not self.view.end_warm_up(self._clock.now()):
            return False
        _log.info(
            "fleet established: snapshots are now the whole fleet",
            extra={"replicas": len(self.registry.members())},
        )
        self.notify_changed()
        return True

    async def _end_warm_up_on_time(self) -> None:
        while self.view.warming_up:
            await asyncio.sleep(self.view.warm_up_remaining(self._clock.now()))
            self.end_warm_up()

    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="lease-sweeper")
        if self._warm_up is None and self.view.warming_up:
            _log.info(
                "warming up: gateways keep the replicas they know until the fleet re-registers",
                extra={"for_s": round(self.view.warm_up_remaining(self._clock.now()), 3)},
            )
            self._warm_up = asyncio.create_task(self._end_warm_up_on_time(), name="warm-up")

    async def close(self) -> None:
        """Shutting down: end every session and WatchFleet stream with OK; stop the sweeper."""
        self.closing = True
        for task in (self._sweeper, self._warm_up):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._sweeper = self._warm_up = None
        for handle in list(self._sessions.values()):
            handle.end(None)
        self.feed.close()
        self.closed.set()

    def session_count(self) -> int:
        return len(self._sessions)
