"""The worker's membership in the fleet: one ``ControlService.WorkerSession`` stream, kept open.

What it decides: how a worker joins and stays in the fleet. It opens the bidi stream with the
fleet credential, sends ``register`` (its descriptor, with the advertised address) first, waits
for the ``Lease``, then sends a ``heartbeat`` with its current load every
``lease.heartbeat_interval``.

Reconnecting (ADR 0011): a session that held a lease and ended — the controller went away,
restarted, or shut down — is reopened after a short, fully jittered delay (uniform in
``[0, backoff.initial_s]``), not after the backoff: the fleet must re-register at once on a new
controller, which otherwise does not know it, and the jitter spreads a whole fleet's
reconnections. An unreachable controller is waited for by the channel itself
(``wait_for_ready`` on a channel that retries the connection at most every second,
:func:`common.backoff.controller_channel_options`), so the worker re-registers within about a
second of the controller listening again, however long it was gone. The capped exponential
backoff is for refusals (a wrong credential, a controller shutting down, a protocol error):
repeated failures of a controller that *is* there.

Several controllers (``target`` ``a,b``, issue #22): a session refused or ended ``UNAVAILABLE``
— a standby's ``NOT_LEADER``, a controller gone — reopens on the leader the refusal names or the
next address (:mod:`common.controller_targets`), with the same delays. With several addresses
a session does not wait for an unreachable controller to come back (that would wait on a dead
leader forever): the connection failure moves it on. A ``drain`` message from
the controller triggers the worker's drain in its own task (the session stays open, heartbeats
report ``draining``); an ``undrain`` message undoes it, and a later ``drain`` drains again.
:meth:`ControllerSession.close` half-closes the stream so the controller removes the
replica at once rather than when the lease lapses.

Why a stream and not periodic unary calls: membership is the stream being open (design
section 1) — a worker that dies takes its stream with it and leaves the fleet immediately.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc
import grpc.aio

from common.auth import bearer_metadata
from common.backoff import Backoff, controller_channel_options
from common.controller_targets import ControllerTargets
from common.errors import parse_rpc_error
from common.rng import Rng, SeededRng
from common.tracing import client_interceptors
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2
from worker.metrics import WorkerMetrics

__all__ = ["DEFAULT_HEARTBEAT_S", "MIN_HEARTBEAT_S", "ControllerSession"]

DEFAULT_HEARTBEAT_S = 1.0  # when a lease names no interval (and no TTL to derive one from)
MIN_HEARTBEAT_S = 0.01  # a floor, so a zero interval cannot become a busy loop
_CLOSE_TIMEOUT_S = 2.0

_log = logging.getLogger("halcyon.worker.registration")


class _ProtocolError(Exception):
    """The controller answered something the contract does not allow."""


def _seconds(duration: Any) -> float:
    return float(duration.ToNanoseconds()) / 1e9


class ControllerSession:
    """Keeps this worker registered with the controller while it runs."""

    def __init__(
        self,
        *,
        target: str,
        fleet_token: str,
        descriptor: Callable[[], fleet_pb2.ReplicaDescriptor],
        load: Callable[[], fleet_pb2.ReplicaLoad],
        on_drain: Callable[[str], Coroutine[Any, Any, object]],
        on_undrain: Callable[[str], Coroutine[Any, Any, object]] | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
        backoff: Backoff | None = None,
        rng: Rng | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,  # reconnect backoff waits
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.targets = ControllerTargets(target)
        self._metadata = bearer_metadata(fleet_token)
        self._descriptor = descriptor
        self._load = load
        self._on_drain = on_drain
        self._on_undrain = on_undrain
        self._credentials = channel_credentials
        self._backoff = backoff if backoff is not None else Backoff()
        self._rng: Rng = rng if rng is not None else SeededRng(0)
        self._sleep = sleep
        self._metrics = metrics
        self._channels: dict[str, grpc.aio.Channel] = {}  # by address, opened on first use
        self._task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[object] | None = None
        self._undrain_task: asyncio.Task[object] | None = None
        self._closing = False
        self._registered = asyncio.Event()
        self._nudge = asyncio.Event()
        self.lease: control_pb2.Lease | None = None
        self.heartbeat_interval_s = DEFAULT_HEARTBEAT_S
        self.sessions = 0  # leases granted so far
        self.heartbeats_sent = 0
        self.last_error: str | None = None
        self.reconnect_delays: deque[float] = deque(maxlen=64)  # most recent backoff delays

    @property
    def connected(self) -> bool:
        return self._registered.is_set()

    @property
    def target(self) -> str:
        """The controller address in use."""
        return self.targets.current

    def _channel(self) -> grpc.aio.Channel:
        channel = self._channels.get(self.target)
        if channel is None:
            options = controller_channel_options()
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(
                    self.target, self._credentials, options, interceptors=client_interceptors()
                )
            else:
                channel = grpc.aio.insecure_channel(
                    self.target, options, interceptors=client_interceptors()
                )
            self._channels[self.target] = channel
        return channel

    def start(self) -> None:
        """Open the channel and start the keep-registered loop in the background."""
        if self._task is not None:
            raise RuntimeError("session already started")
        self._channel()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="worker-session")

    async def wait_registered(self, timeout_s: float) -> None:
        """Until a lease is held (raises ``TimeoutError`` after ``timeout_s``)."""
        await asyncio.wait_for(self._registered.wait(), timeout_s)

    async def close(self) -> None:
        """Deregister: half-close the stream, let the controller end it, stop reconnecting."""
        if self._closing:
            return
        self._closing = True
        await self._stop_heartbeats(graceful=True)
        call = self._call
        task = self._task
        if call is not None and task is not None and self.connected:
            # A live stream: half-close it and let the controller end it (clean deregistration).
            # (A call still waiting for an unreachable controller is simply cancelled below.)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(call.done_writing(), _CLOSE_TIMEOUT_S)
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT_S)
        if task is not None and not task.done():
            task.cancel()  # between streams (backing off) or the controller did not end it
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for channel in self._channels.values():
            await channel.close()
        self._set_connected(False)

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while not self._closing:
            sessions = self.sessions
            try:
                await self._session_once()
                if not self._closing:
                    self.last_error = "stream closed by the controller"
                    _log.warning("controller closed the session", extra={"target": self.target})
            except grpc.aio.AioRpcError as err:
                self.last_error = f"{err.code().name}: {err.details()}"
                level = (
                    logging.ERROR
                    if err.code()
                    in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
                    else logging.WARNING
                )
                if not self._closing:
                    _log.log(
                        level,
                        "controller session failed",
                        extra={
                            "target": self.target,
                            "code": err.code().name,
                            "details": err.details(),
                        },
                    )
                    if self.targets.move_on(parse_rpc_error(err)):
                        _log.info("trying another controller", extra={"target": self.target})
            except _ProtocolError as err:
                self.last_error = str(err)
                _log.error("controller protocol error", extra={"error": str(err)})
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self._closing or task is None or task.cancelling():
                    raise  # close(): this loop itself is being stopped
                # The heartbeat task cancelled the call after a failed write, and gRPC reports
                # a locally cancelled call to its reader as CancelledError: the stream broke.
                self.last_error = "the session stream broke (a heartbeat could not be sent)"
                _log.warning("controller session broke", extra={"target": self.target})
            except Exception as err:
                self.last_error = repr(err)
                _log.exception("controller session error", extra={"target": self.target})
            finally:
                self._set_connected(False)
            if self._closing:
                return
            delay = self.reconnect_delay(attempt, granted=self.sessions > sessions)
            attempt = 0 if self.sessions > sessions else attempt + 1
            self.reconnect_delays.append(delay)
            if self._metrics is not None:
                self._metrics.controller_reconnects.inc()
            _log.info("reconnecting to controller", extra={"delay_s": round(delay, 3)})
            await self._sleep(delay)

    def reconnect_delay(self, failures: int, *, granted: bool) -> float:
        """How long to wait before the next session: after one that held a lease, a short
        fully jittered delay; after ``failures`` refusals in a row, the backoff."""
        u = self._rng.random()
        if granted:
            return self._backoff.initial_s * u
        return self._backoff.delay(failures, u)

    async def _session_once(self) -> bool:
        """One stream from open to end; True when a lease was granted on it."""
        stub = control_pb2_grpc.ControlServiceStub(self._channel())
        # An unreachable controller is waited for (the channel retries the connection at most
        # every second); only a controller that answers can refuse, and only that backs off.
        # With other controllers to try, an unreachable one is a failure that moves on.
        call = stub.WorkerSession(metadata=self._metadata, wait_for_ready=not self.targets.several)
        self._call = call
        try:
            await call.write(control_pb2.WorkerSessionRequest(register=self._descriptor()))
            first = await call.read()
            if first is grpc.aio.EOF:
                return False
            if first.WhichOneof("kind") != "lease":
                raise _ProtocolError(f"expected a lease first, got {first.WhichOneof('kind')}")
            self._apply_lease(first.lease)
            self.sessions += 1
            self._set_connected(True)
            _log.info(
                "registered with controller",
                extra={
                    "target": self.target,
                    "replica_id": first.lease.replica_id,
                    "heartbeat_s": self.heartbeat_interval_s,
                },
            )
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeats(call), name="worker-heartbeats"
            )
            while True:
                message = await call.read()
                if message is grpc.aio.EOF:
                    return True
                self._handle(message)
        finally:
            await self._stop_heartbeats()
            self._call = None
            if not call.done():
                call.cancel()

    def _apply_lease(self, lease: control_pb2.Lease) -> None:
        self.lease = lease
        interval = _seconds(lease.heartbeat_interval) if lease.HasField("heartbeat_interval") else 0
        if interval <= 0 and lease.HasField("ttl"):
            interval = _seconds(lease.ttl) / 3.0
        self.heartbeat_interval_s = max(MIN_HEARTBEAT_S, interval or DEFAULT_HEARTBEAT_S)

    def _handle(self, message: control_pb2.WorkerSessionResponse) -> None:
        kind = message.WhichOneof("kind")
        if kind == "lease":
            self._apply_lease(message.lease)
        elif kind == "drain":
            reason = message.drain.reason or "controller request"
            _log.info("controller asked to drain", extra={"reason": reason})
            if self._drain_task is None or self._drain_task.done():
                # Its own task: a drain waits for in-flight batches, and reading goes on.
                self._drain_task = asyncio.get_running_loop().create_task(
                    self._on_drain(reason), name="worker-drain"
                )
        elif kind == "undrain":
            reason = message.undrain.reason or "controller request"
            _log.info("controller asked to undrain", extra={"reason": reason})
            self._drain_task = None  # the next drain command is a new drain
            if self._on_undrain is not None:
                self._undrain_task = asyncio.get_running_loop().create_task(
                    self._on_undrain(reason), name="worker-undrain"
                )
        else:
            _log.warning("ignoring unknown session message", extra={"kind": kind})

    def send_heartbeat_now(self) -> None:
        """Send the next heartbeat at once (e.g. to announce ``draining`` without delay)."""
        self._nudge.set()

    async def _heartbeats(self, call: Any) -> None:
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._nudge.wait(), self.heartbeat_interval_s)
                self._nudge.clear()
                await call.write(control_pb2.WorkerSessionRequest(heartbeat=self._load()))
                self.heartbeats_sent += 1
                if self._closing:
                    return  # that was the last one, with the final load (e.g. draining)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the stream broke: make the reader see it too
            _log.debug("heartbeat write failed", extra={"error": repr(err)})
            call.cancel()

    async def _stop_heartbeats(self, graceful: bool = False) -> None:
        """Stop the heartbeat task; ``graceful`` lets it send a last heartbeat first.

        Never cancels a write half-way when graceful: that would cancel the whole call, and
        the controller would see an aborted stream instead of a clean deregistration.
        """
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is None or task.done():
            return
        if graceful:
            self._nudge.set()
            with contextlib.suppress(TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT_S)
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    def _set_connected(self, connected: bool) -> None:
        if connected:
            self._registered.set()
        else:
            self._registered.clear()
        if self._metrics is not None:
            self._metrics.controller_connected.set(1 if connected else 0)
