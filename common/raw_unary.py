"""One unary method served straight off gRPC's completion queue, beside a ``grpc.aio`` server.

What it decides: how a process's hot method (the gateway's ``Infer``) is received and answered.
``grpc.aio`` spends about 0.2 ms of CPU per unary call on this machine before and after the
handler runs (a task per call, a future per operation batch, interceptor coroutines) — the whole
per-request budget of a gateway that must stay cheaper than the device it feeds. This endpoint
registers the method with the aio server's own core server, so it shares its port, TLS, health,
reflection and shutdown, requests the method's calls on a private completion queue, and turns
completion events into plain callbacks on the event loop: about 0.07 ms per call (ADR 0006).

Threads: while the loop is idle, one poller thread blocks in ``CompletionQueue.poll`` (the GIL
released) and hands the first event to the loop; from then on the loop takes events off the
queue itself, without blocking, once per loop iteration, until it finds the queue empty and
hands it back. A busy gateway pays no thread hand-off (and no GIL hand-off) per event.

Answers: the handler gets a :class:`RawCall` on the loop thread and must answer it exactly once
with :meth:`RawCall.reply` or :meth:`RawCall.fail`; a call the client cancels (or whose deadline
passes) first runs its ``on_cancel`` callback, and later answers are dropped. Every call is
counted under the conventional ``grpc_server_*`` families, exactly as the aio interceptor counts
the process's other methods.

It relies on grpc internals (``grpc._cython.cygrpc`` and the core server inside ``AioServer``,
grpcio pinned in pyproject). :meth:`RawUnaryEndpoint.attach` returns False when they are not as
expected; the caller's ordinary aio handler for the same method then serves it, slower but the
same on the wire.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from common.buffered_metrics import BufferedCounter
from common.errors import Reason, RichError
from common.grpc_metrics import GrpcServerMetrics, code_name, split_method

try:  # grpc internals: absent or changed -> attach() declines and grpc.aio serves the method
    from grpc._cython import cygrpc
except ImportError:  # pragma: no cover - depends on the grpcio build
    cygrpc = None

__all__ = ["RawCall", "RawUnaryEndpoint"]

_log = logging.getLogger("halcyon.raw_unary")

# A core deadline this far out means the client set none.
_NO_DEADLINE = 1e15
# Calls requested from the core ahead of arrival; it queues arrivals beyond these itself.
_PREFETCH = 32
# Events the loop takes in one go before letting its other callbacks run.
_PUMP_BATCH = 256

Metadata = Sequence[tuple[str, str | bytes]]
Handler = Callable[["RawCall"], None]

_RECEIVING, _HANDLING, _ANSWERED, _CANCELLED = range(4)


class _NewCall:
    """Tag of a requested call: the core completes it when a call for the method arrives."""

    __slots__ = ()


class _Close:
    """Tag of a call's receive-close operation: completes when the call ends, cancelled or not."""

    __slots__ = ("raw",)

    def __init__(self, raw: RawCall) -> None:
        self.raw = raw


class _Sent:
    """Tag of a call's final send batch; nothing to do when it completes."""

    __slots__ = ()


_NEW_CALL = _NewCall()
_SENT = _Sent()


class RawCall:
    """One call of the method: its metadata, deadline and request bytes, and its one answer."""

    __slots__ = (
        "_call",
        "_endpoint",
        "_started",
        "_state",
        "deadline",
        "metadata",
        "on_cancel",
        "request",
    )

    def __init__(self, endpoint: RawUnaryEndpoint, call: Any, metadata: Metadata, deadline: float):
        self._endpoint = endpoint
        self._call = call
        self._state = _RECEIVING
        self._started = time.perf_counter()
        self.metadata = metadata
        # Absolute, in time.time() seconds; None when the client set no deadline.
        self.deadline: float | None = None if deadline > _NO_DEADLINE else deadline
        self.request = b""
        self.on_cancel: Callable[[], object] | None = None

    def time_remaining(self) -> float | None:
        """Seconds until the client's deadline, as ``ServicerContext.time_remaining``."""
        return None if self.deadline is None else self.deadline - time.time()

    @property
    def open(self) -> bool:
        """Neither answered nor cancelled yet."""
        return self._state < _ANSWERED

    def reply(self, payload: bytes) -> None:
        """Answer OK with a serialized response; dropped if the call already ended."""
        if self._state >= _ANSWERED:
            return
        self._state = _ANSWERED
        ops = (
            cygrpc.SendInitialMetadataOperation((), 0),
            cygrpc.SendMessageOperation(payload, 0),
            cygrpc.SendStatusFromServerOperation((), _OK_VALUE, b"", 0),
        )
        self._endpoint._finish(self, self._call, ops, grpc.StatusCode.OK, sent=True)

    def reject(self, err: RichError) -> None:
        """Answer with a typed rejection and its rich details; dropped if ended."""
        self.fail(err.code, err.message, err.trailing_metadata())

    def fail(self, code: grpc.StatusCode, details: str, trailers: Metadata = ()) -> None:
        """Answer with a status (and trailers, e.g. rich error details); dropped if ended."""
        if self._state >= _ANSWERED:
            return
        self._state = _ANSWERED
        ops = (
            cygrpc.SendInitialMetadataOperation((), 0),
            cygrpc.SendStatusFromServerOperation(
                tuple(trailers), code.value[0], details.encode("utf-8", "replace"), 0
            ),
        )
        self._endpoint._finish(self, self._call, ops, code, sent=False)


_OK_VALUE = grpc.StatusCode.OK.value[0]


class _MethodMetrics:
    """The method's ``grpc_server_*`` children: counters buffered (flushed at scrape), the
    duration histogram observed directly."""

    def __init__(self, metrics: GrpcServerMetrics, method: str) -> None:
        service, name = split_method(method)
        labels = (service, name, "unary")
        self._metrics = metrics
        self._labels = labels
        self.started = BufferedCounter(metrics.started.labels(*labels))
        self.received = BufferedCounter(metrics.received.labels(*labels))
        self.sent = BufferedCounter(metrics.sent.labels(*labels))
        self.seconds = metrics.seconds.labels(*labels)
        self._handled: dict[str, BufferedCounter] = {}

    def handled(self, code: str) -> BufferedCounter:
        counter = self._handled.get(code)
        if counter is None:
            counter = BufferedCounter(self._metrics.handled.labels(*self._labels, code))
            self._handled[code] = counter
        return counter

    def flush(self) -> None:
        for counter in (self.started, self.received, self.sent, *list(self._handled.values())):
            counter.flush()


def _core_server(server: grpc.aio.Server) -> Any | None:
    """The C-core ``cygrpc.Server`` inside a ``grpc.aio`` server, if it can be found."""
    if cygrpc is None:
        return None
    inner = getattr(server, "_server", None)
    if inner is None:
        return None
    for ref in gc.get_referents(inner):
        if type(ref) is cygrpc.Server:
            return ref
    return None


class RawUnaryEndpoint:
    """Serves one unary method (``/pkg.Service/Method``) off a private completion queue."""

    def __init__(
        self,
        method: str,
        handler: Handler,
        metrics: GrpcServerMetrics | None = None,
    ) -> None:
        self.method = method
        self._handler = handler
        self._metrics = _MethodMetrics(metrics, method) if metrics is not None else None
        # Set by the host when its other methods are guarded by an auth interceptor, which
        # this endpoint bypasses: (method, metadata) -> the rejection, or None to proceed.
        self.authorize: Callable[[str, Metadata], RichError | None] | None = None
        # Requests above this many bytes are refused before any parsing, with a typed error
        # (the gRPC core's own, larger limit answers without one).
        self.max_request_bytes: int | None = None
        self._core: Any = None
        self._cq: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: collections.deque[Any] = collections.deque()
        # Whose turn it is to take events off the queue: the poller thread (set) while the
        # loop is idle, the loop itself (clear) while events keep coming.
        self._poller_turn = threading.Event()
        self._poller_turn.set()
        self._loop_pumps: asyncio.Handle | None = None
        self._accepting = False
        self._thread: threading.Thread | None = None
        self.attached = False

    # -- lifecycle -----------------------------------------------------------------------------

    def attach(self, server: grpc.aio.Server) -> bool:
        """Register the method with ``server``'s core; before ``server.start()``.

        False (and nothing changed) when grpc's internals are not as this module expects.
        """
        core = _core_server(server)
        if core is None:
            _log.warning(
                "grpc internals not as expected: %s is served through grpc.aio", self.method
            )
            return False
        try:
            cq = cygrpc.CompletionQueue()
            core.register_completion_queue(cq)
            core.register_method(self.method)
        except Exception:  # pragma: no cover - depends on the grpcio build
            _log.warning("cannot register %s with the core server", self.method, exc_info=True)
            return False
        self._core = core
        self._cq = cq
        self.attached = True
        return True

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin taking calls; after ``server.start()``, on the loop that will run handlers."""
        if not self.attached:
            return
        self._loop = loop
        self._accepting = True
        for _ in range(_PREFETCH):
            self._core.request_registered_call(self._cq, self._cq, self.method, _NEW_CALL)
        self._thread = threading.Thread(
            target=self._poll_forever, name=f"cq:{self.method}", daemon=True
        )
        self._thread.start()

    def flush_metrics(self) -> None:
        """Hand buffered counts to Prometheus (a scrape hook; any thread)."""
        if self._metrics is not None:
            self._metrics.flush()

    def stop_accepting(self) -> None:
        """Request no more calls (the server's own shutdown refuses new ones)."""
        self._accepting = False

    async def close(self) -> None:
        """After the server has stopped: shut the queue down and join the poller thread."""
        self._accepting = False
        if self._cq is None:
            return
        self._cq.shutdown()
        if self._loop_pumps is not None:
            self._loop_pumps.cancel()
            self._loop_pumps = None
        self._poller_turn.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)
            self._thread = None
        while self._inbox:  # whatever the poller handed over last
            self._handle(self._inbox.popleft())

    # -- events ------------------------------------------------------------------------------

    def _poll_forever(self) -> None:
        cq = self._cq
        timeout = cygrpc.CompletionType.queue_timeout
        shutdown = cygrpc.CompletionType.queue_shutdown
        loop = self._loop
        assert loop is not None
        while True:
            self._poller_turn.wait()
            event = cq.poll()
            kind = event.completion_type
            if kind == timeout:
                continue
            if kind == shutdown:
                return
            # Hand the queue to the loop until it finds it empty again.
            self._poller_turn.clear()
            self._inbox.append(event)
            try:
                loop.call_soon_threadsafe(self._pump)
            except RuntimeError:  # the loop is closed: the process is exiting
                return

    def _pump(self) -> None:
        inbox = self._inbox
        while inbox:
            self._handle(inbox.popleft())
        cq = self._cq
        batch_complete = cygrpc.CompletionType.operation_complete
        taken = 0
        while taken < _PUMP_BATCH:
            event = cq.poll(0)
            if event.completion_type != batch_complete:
                break
            self._handle(event)
            taken += 1
        if taken:
            # Still busy: look again after the loop's other ready callbacks (the batcher,
            # worker replies) have run, without a thread hand-off per event.
            self._loop_pumps = self._loop.call_soon(self._pump) if self._loop else None
        else:
            # Idle: the poller thread blocks on the queue again and wakes the loop when the
            # next event arrives.
            self._loop_pumps = None
            self._poller_turn.set()

    def _handle(self, event: Any) -> None:
        tag = event.tag
        if tag is _SENT:
            return
        if tag is _NEW_CALL:
            if not event.success:  # the server is shutting down
                return
            if self._accepting:
                self._core.request_registered_call(self._cq, self._cq, self.method, _NEW_CALL)
            raw = RawCall(self, event.call, event.invocation_metadata, event.call_details.deadline)
            if self._metrics is not None:
                self._metrics.started.inc()
            call = event.call
            call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),), _Close(raw))
            call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), raw)
            return
        if type(tag) is _Close:
            self._closed(tag.raw, event.batch_operations[0].cancelled())
            return
        if type(tag) is RawCall:
            self._received(tag, event)

    def _received(self, raw: RawCall, event: Any) -> None:
        if raw._state != _RECEIVING:
            return
        message = event.batch_operations[0].message() if event.success else None
        if message is None:
            # No request message: the client ended the call without one (or cancelled).
            raw.fail(grpc.StatusCode.INTERNAL, "the call ended before its request arrived")
            return
        if self._metrics is not None:
            self._metrics.received.inc()
        raw.request = message
        raw._state = _HANDLING
        if self.max_request_bytes is not None and len(message) > self.max_request_bytes:
            raw.reject(
                RichError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request is {len(message)} bytes; {self.method} takes at most "
                    f"{self.max_request_bytes}",
                    reason=Reason.MESSAGE_TOO_LARGE,
                    metadata={
                        "size_bytes": str(len(message)),
                        "limit_bytes": str(self.max_request_bytes),
                    },
                )
            )
            return
        if self.authorize is not None:
            refused = self.authorize(self.method, raw.metadata)
            if refused is not None:
                raw.reject(refused)
                return
        try:
            self._handler(raw)
        except Exception as exc:
            _log.exception("%s handler failed", self.method)
            raw.fail(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})")

    def _closed(self, raw: RawCall, cancelled: bool) -> None:
        if raw._state >= _ANSWERED:
            return
        # The client cancelled, its deadline passed, or the server cancelled every call at the
        # end of a shutdown grace: the call is over before an answer went out.
        raw._state = _CANCELLED
        expired = raw.deadline is not None and time.time() >= raw.deadline
        self._observe(raw, "DeadlineExceeded" if expired else "Canceled", sent=False)
        callback = raw.on_cancel
        raw.on_cancel = None
        if callback is not None:
            try:
                callback()
            except Exception:
                _log.exception("%s cancellation callback failed", self.method)

    def _finish(
        self, raw: RawCall, call: Any, ops: tuple[Any, ...], code: grpc.StatusCode, sent: bool
    ) -> None:
        raw.on_cancel = None
        call.start_server_batch(ops, _SENT)
        self._observe(raw, code_name(code), sent=sent)

    def _observe(self, raw: RawCall, code: str, sent: bool) -> None:
        metrics = self._metrics
        if metrics is None:
            return
        if sent:
            metrics.sent.inc()
        metrics.handled(code).inc()
        metrics.seconds.observe(time.perf_counter() - raw._started)
