"""One unary method served straight off gRPC's completion queue, beside a ``grpc.aio`` server.

What it decides: how a process's hot method (the gateway's ``Infer``, the worker's
``ExecuteBatch``) is received and answered, and when that is allowed at all. ``grpc.aio`` spends
about 0.2 ms of CPU per unary call on this machine before and after the handler runs (a task per
call, a future per operation batch, interceptor coroutines) — the whole per-request budget of a
gateway that must stay cheaper than the device it feeds. This endpoint registers the method with
the aio server's own core server, so it shares its port, TLS, health, reflection and shutdown,
requests the method's calls on a private completion queue, and turns completion events into
plain callbacks on the event loop: about 0.07 ms per call (ADR 0006).

When (ADR 0010): it uses grpc internals (``grpc._cython.cygrpc`` and the core server inside
``AioServer``). :func:`fast_path_refusal` allows it only on a grpcio minor release listed in
:data:`VERIFIED_GRPCIO` whose internals still have the shape this module calls (names,
signatures, event fields — checked before anything is registered); otherwise the caller's
ordinary aio handler serves the method, slower but the same on the wire.

Threads: while the loop is idle, one poller thread blocks in ``CompletionQueue.poll`` (the GIL
released) and hands the first event to the loop; from then on the loop takes events off the
queue itself, without blocking, once per loop iteration, until it finds the queue empty and
hands it back. A busy gateway pays no thread hand-off (and no GIL hand-off) per event.

Faults: an exception while handling one event fails only the call that event belongs to
(INTERNAL with ErrorInfo reason ``INTERNAL``) and the pump goes on. If the pump itself cannot go
on (the queue cannot be polled, no more calls can be requested, the poller thread died) the
endpoint records :attr:`RawUnaryEndpoint.failure` and tells its host, which turns liveness off
and stops the process rather than let calls wait for an answer that cannot come. Progress is
visible to a watchdog thread (:meth:`RawUnaryEndpoint.stalled_since`), so a loop that holds the
queue and stops taking from it is noticed too (``common.liveness``). Shutdown never starts an
operation on a queue that was shut down (gRPC core aborts the process if one does).

Policy: none. Each received call is a :class:`RawCall` (a :class:`common.call.UnaryCall`)
handed on the loop thread to the method's :class:`common.pipeline.UnaryPipeline`, which
measures, traces, gates, checks and decodes it and runs its handler; the endpoint sends the one
answer it is told to (:meth:`RawCall.reply` or :meth:`RawCall.reject`) and tells the pipeline
how the call ended. A call the client cancels (or whose deadline passes) first runs its
``on_cancel`` callback, and later answers are dropped.

Parts: the verified grpcio releases (:data:`VERIFIED_GRPCIO`) and the internals' expected shape
live in ``common.raw_unary_gate`` and are imported back here. The checks stay here, by
``cygrpc``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from opentelemetry import trace

from common.call import Metadata, cancelled_code
from common.errors import RichError, internal
from common.pipeline import UnaryPipeline, handler_failed
from common.raw_unary_gate import _ATTRIBUTES, _SIGNATURES, VERIFIED_GRPCIO

try:  # grpc internals: absent or changed -> fast_path_refusal() says why, grpc.aio serves
    from grpc._cython import cygrpc
except ImportError:  # pragma: no cover - depends on the grpcio build
    cygrpc = None

__all__ = [
    "VERIFIED_GRPCIO",
    "_ATTRIBUTES",
    "_SIGNATURES",
    "FaultHook",
    "RawCall",
    "RawUnaryEndpoint",
    "ServingPathError",
    "fast_path_refusal",
]

_log = logging.getLogger("halcyon.raw_unary")

# A core deadline this far out means the client set none.
_NO_DEADLINE = 1e15
# Calls requested from the core ahead of arrival; it queues arrivals beyond these itself.
_PREFETCH = 32
# Events the loop takes in one go before letting its other callbacks run (a worker's reply,
# the next dispatch). A call is 3-4 events, so this is ~10 calls: under a flood of arrivals
# (a retry storm: ~5,000 rejections a second) those callbacks wait ~5 ms per slice instead of
# the ~40 ms that 256 events took, and the fleet's batches turn around that much sooner.
_PUMP_BATCH = 32
# At most one traceback per this many seconds for failed events (the rest are counted).
_FAILURE_LOG_INTERVAL_S = 10.0

# A test hook: called with ("event", call) on the loop before a received call enters the
# pipeline, and with ("poll", None) on the poller thread after each event it takes. Raising (or
# blocking) there is a fault in the pump itself, outside any handler.
FaultHook = Callable[[str, "RawCall | None"], None]

_RECEIVING, _HANDLING, _ANSWERED, _CANCELLED = range(4)


class ServingPathError(OSError):
    """The completion-queue path cannot take calls after it was attached (start-up)."""


# -- may the fast path serve? ---------------------------------------------------------------------


def fast_path_refusal(version: str | None = None) -> str | None:
    """None when the completion-queue path may serve with this grpcio; otherwise why not.

    ``version`` defaults to the installed ``grpc.__version__`` (read now, not at import).
    """
    version = grpc.__version__ if version is None else version
    minor = ".".join(version.split(".")[:2])
    if minor not in VERIFIED_GRPCIO:
        verified = ", ".join(f"{m}.x" for m in sorted(VERIFIED_GRPCIO))
        return (
            f"grpcio {version} is not a release the completion-queue path was verified on "
            f"(verified: {verified}; see VERIFIED_GRPCIO in common/raw_unary_gate.py)"
        )
    return _internals_refusal()


@functools.cache
def _internals_refusal() -> str | None:
    """Why grpc's internals are not the shape this module calls, or None. Touches no server:
    signatures and attributes are read, operations are built, a private queue is polled."""
    if cygrpc is None:
        return "grpc._cython.cygrpc cannot be imported"
    try:
        for (owner, name), want in _SIGNATURES.items():
            params = tuple(inspect.signature(getattr(getattr(cygrpc, owner), name)).parameters)
            if params != want:
                return f"cygrpc.{owner}.{name}{params} is not {want}"
        for owner, names in _ATTRIBUTES.items():
            missing = [n for n in names if not hasattr(getattr(cygrpc, owner), n)]
            if missing:
                return f"cygrpc.{owner} has no {', '.join(missing)}"
        _build_ops((), 0, b"", b"")
        cygrpc.ReceiveMessageOperation(0)
        cygrpc.ReceiveCloseOnServerOperation(0)
        queue = cygrpc.CompletionQueue()
        idle = queue.poll(0).completion_type
        queue.shutdown()
        closed = queue.poll(0).completion_type
        kinds = cygrpc.CompletionType
        if (idle, closed) != (kinds.queue_timeout, kinds.queue_shutdown):
            return f"a private completion queue polled {idle!r} then {closed!r}"
    except Exception as exc:
        return f"grpc internals differ ({type(exc).__name__}: {exc})"
    return None


def _build_ops(trailers: Metadata, code: int, details: bytes, payload: bytes | None) -> Any:
    """The final send batch of an answer: initial metadata, the message if any, the status."""
    if payload is None:
        return (
            cygrpc.SendInitialMetadataOperation((), 0),
            cygrpc.SendStatusFromServerOperation(tuple(trailers), code, details, 0),
        )
    return (
        cygrpc.SendInitialMetadataOperation((), 0),
        cygrpc.SendMessageOperation(payload, 0),
        cygrpc.SendStatusFromServerOperation(tuple(trailers), code, details, 0),
    )


# -- one call ---------------------------------------------------------------------------------


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
_OK_VALUE = grpc.StatusCode.OK.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL
_OK = grpc.StatusCode.OK
_NO_REQUEST = internal("the call ended before its request arrived")


class RawCall:
    """One call of the method: its metadata, deadline and request bytes, and its one answer
    (a :class:`common.call.UnaryCall`)."""

    __slots__ = (
        "_call",
        "_endpoint",
        "_handed",
        "_state",
        "deadline",
        "metadata",
        "method",
        "on_cancel",
        "request",
        "span",
        "started",
    )

    def __init__(self, endpoint: RawUnaryEndpoint, call: Any, metadata: Metadata, deadline: float):
        self._endpoint = endpoint
        self._call = call
        self._state = _RECEIVING
        self._handed = False  # given to the pipeline, which then hears how the call ended
        self.started = time.perf_counter()
        self.method = endpoint.method
        self.span: trace.Span = trace.INVALID_SPAN
        self.metadata = metadata
        # Absolute, in time.time() seconds; None when the client set no deadline.
        self.deadline: float | None = None if deadline > _NO_DEADLINE else deadline
        self.request = b""
        self.on_cancel: Callable[[], object] | None = None

    def peer(self) -> str:
        """The client's address as gRPC reports it (``ipv4:127.0.0.1:53422``)."""
        peer = self._call.peer()
        return peer.decode("utf-8", "replace") if isinstance(peer, bytes) else str(peer)

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
        ops = _build_ops((), _OK_VALUE, b"", payload)
        self._endpoint._finish(self, ops, _OK, "")

    def reject(self, err: RichError) -> None:
        """Answer with a typed rejection and its rich details; dropped if ended."""
        self.fail(err.code, err.message, err.trailing_metadata())

    def fail(self, code: grpc.StatusCode, details: str, trailers: Metadata = ()) -> None:
        """Answer with a status (and trailers, e.g. rich error details); dropped if ended."""
        if self._state >= _ANSWERED:
            return
        self._state = _ANSWERED
        ops = _build_ops(trailers, code.value[0], details.encode("utf-8", "replace"), None)
        self._endpoint._finish(self, ops, code, details)


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

    def __init__(self, pipeline: UnaryPipeline) -> None:
        self.method = pipeline.method
        self._pipeline = pipeline
        # Set by the host: called on the loop, once, when the pump cannot go on.
        self.on_failure: Callable[[str], None] | None = None
        self.fault_hook: FaultHook | None = None
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
        # After the server stopped: no operation may start on the queue any more.
        self._closing = False
        self._thread: threading.Thread | None = None
        # Progress, read by the liveness watchdog's thread (monotonic seconds).
        self._handed_at = 0.0
        self._pumped_at = 0.0
        self.failure: str | None = None
        self.event_failures = 0
        self._failures_logged_at = -_FAILURE_LOG_INTERVAL_S
        self._failures_unlogged = 0
        self.attached = False

    # -- lifecycle -----------------------------------------------------------------------------

    def attach(self, server: grpc.aio.Server) -> str | None:
        """Register the method with ``server``'s core; before ``server.start()``.

        None when attached; otherwise why not (nothing changed, grpc.aio serves the method).
        The caller checks :func:`fast_path_refusal` first.
        """
        core = _core_server(server)
        if core is None:
            return "the core server inside grpc.aio's server was not found"
        try:
            cq = cygrpc.CompletionQueue()
            core.register_completion_queue(cq)
            core.register_method(self.method)
        except Exception as exc:  # pragma: no cover - depends on the grpcio build
            return f"cannot register {self.method} with the core server ({exc!r})"
        self._core = core
        self._cq = cq
        self.attached = True
        return None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Begin taking calls; after ``server.start()``, on the loop that will run handlers.

        Raises :class:`ServingPathError` if calls cannot be requested: the method is
        registered with the core by now, so nothing else would ever answer them.
        """
        if not self.attached:
            return
        self._loop = loop
        self._accepting = True
        try:
            for _ in range(_PREFETCH):
                self._core.request_registered_call(self._cq, self._cq, self.method, _NEW_CALL)
        except Exception as exc:
            self._accepting = False
            raise ServingPathError(
                f"the completion-queue path cannot request calls for {self.method} ({exc!r}); "
                "run with --serving-path aio"
            ) from exc
        self._thread = threading.Thread(
            target=self._poll_forever, name=f"cq:{self.method}", daemon=True
        )
        self._thread.start()

    def stop_accepting(self) -> None:
        """Request no more calls (the server's own shutdown refuses new ones)."""
        self._accepting = False

    async def close(self) -> None:
        """After the server has stopped: shut the queue down, drain it, join the poller.

        From here on no operation starts on the queue (gRPC core aborts the process if one is
        started on a queue that was shut down): late answers are dropped — the server's stop
        has already ended their calls — and cancellation callbacks still run.
        """
        self._accepting = False
        if self._cq is None or self._closing:
            return
        self._closing = True
        if self._loop_pumps is not None:
            self._loop_pumps.cancel()
            self._loop_pumps = None
        self._cq.shutdown()
        self._poller_turn.set()  # the poller drains the queue to its shutdown event
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, 5.0)
        else:
            await asyncio.to_thread(self._drain)
        self._thread = None
        self._pump_inbox()

    def _drain(self) -> None:
        """Poll a shut-down queue until it says so (when the poller is not there to)."""
        try:
            give_up = time.time() + 5.0
            shutdown = cygrpc.CompletionType.queue_shutdown
            while time.time() < give_up:
                event = self._cq.poll(time.time() + 0.1)
                if event.completion_type == shutdown:
                    return
                if event.completion_type != cygrpc.CompletionType.queue_timeout:
                    self._inbox.append(event)
        except Exception:
            _log.exception("%s: cannot drain the completion queue", self.method)

    # -- progress, for the liveness watchdog (any thread) ----------------------------------------

    def stalled_since(self) -> float | None:
        """Since when (monotonic) the loop has held the queue without taking from it; None
        while the poller holds it (idle) or the endpoint is not running."""
        if self._poller_turn.is_set() or self._closing or not self._accepting:
            return None
        return max(self._handed_at, self._pumped_at)

    # -- events ------------------------------------------------------------------------------

    def _poll_forever(self) -> None:
        cq = self._cq
        timeout = cygrpc.CompletionType.queue_timeout
        shutdown = cygrpc.CompletionType.queue_shutdown
        loop = self._loop
        assert loop is not None
        try:
            while True:
                if not self._closing:
                    self._poller_turn.wait()
                event = cq.poll()
                kind = event.completion_type
                if kind == timeout:
                    continue
                if kind == shutdown:
                    return
                self._inbox.append(event)
                if self._closing:
                    continue  # close() handles what is left once the queue is drained
                if self.fault_hook is not None:
                    self.fault_hook("poll", None)
                # Hand the queue to the loop until it finds it empty again.
                self._handed_at = time.monotonic()
                self._poller_turn.clear()
                loop.call_soon_threadsafe(self._pump)
        except Exception as exc:
            if loop.is_closed():  # the process is exiting without close()
                return
            self._fail(f"the completion-queue poller thread died ({exc!r})")

    def _pump(self) -> None:
        self._pumped_at = time.monotonic()
        if self._closing:
            return
        taken = 0
        polled = False
        try:
            self._pump_inbox()
            poll = self._cq.poll
            handle = self._handle
            batch_complete = cygrpc.CompletionType.operation_complete
            while taken < _PUMP_BATCH:
                event = poll(0)
                if event.completion_type != batch_complete:
                    break
                taken += 1
                try:
                    handle(event)
                except Exception as exc:
                    self._event_failed(event, exc)
            polled = True
        except Exception as exc:  # the queue itself failed: nothing more can come off it
            self._fail(f"polling the completion queue failed ({exc!r})")
        finally:
            loop = self._loop
            if polled and taken and loop is not None and not self._closing:
                # Still busy: look again after the loop's other ready callbacks (the batcher,
                # worker replies) have run, without a thread hand-off per event.
                self._loop_pumps = loop.call_soon(self._pump)
            else:
                # Idle (or broken): the poller thread blocks on the queue again and wakes the
                # loop when the next event arrives.
                self._loop_pumps = None
                self._poller_turn.set()

    def _pump_inbox(self) -> None:
        inbox = self._inbox
        while inbox:
            event = inbox.popleft()
            try:
                self._handle(event)
            except Exception as exc:
                self._event_failed(event, exc)

    def _handle(self, event: Any) -> None:
        tag = event.tag
        if tag is _SENT:
            return
        if tag is _NEW_CALL:
            if not event.success or self._closing:  # the server is shutting down
                return
            if self._accepting:
                self._request_call()
            raw = RawCall(self, event.call, event.invocation_metadata, event.call_details.deadline)
            call = event.call
            try:
                call.start_server_batch((cygrpc.ReceiveCloseOnServerOperation(0),), _Close(raw))
                call.start_server_batch((cygrpc.ReceiveMessageOperation(0),), raw)
            except Exception as exc:
                self._event_failed(event, exc, raw)
            return
        if type(tag) is _Close:
            self._closed(tag.raw, event.batch_operations[0].cancelled())
            return
        if type(tag) is RawCall:
            self._received(tag, event)

    def _request_call(self) -> None:
        try:
            self._core.request_registered_call(self._cq, self._cq, self.method, _NEW_CALL)
        except Exception as exc:
            if self._accepting:  # not a shutdown race: no new call can come in any more
                self._fail(f"requesting the next call failed ({exc!r})")

    def _received(self, raw: RawCall, event: Any) -> None:
        if raw._state != _RECEIVING or self._closing:
            return
        message = event.batch_operations[0].message() if event.success else None
        if message is None:
            # No request message: the client ended the call without one (or cancelled).
            raw.reject(_NO_REQUEST)
            return
        raw.request = message
        raw._state = _HANDLING
        if self.fault_hook is not None:
            self.fault_hook("event", raw)
        raw._handed = True
        self._pipeline.run(raw)

    def _closed(self, raw: RawCall, cancelled: bool) -> None:
        if raw._state >= _ANSWERED:
            return
        # The client cancelled, its deadline passed, or the server cancelled every call at the
        # end of a shutdown grace: the call is over before an answer went out.
        raw._state = _CANCELLED
        if raw._handed:
            self._pipeline.ended(raw, cancelled_code(raw, time.time()), "")
        callback = raw.on_cancel
        raw.on_cancel = None
        if callback is not None:
            try:
                callback()
            except Exception:
                _log.exception("%s cancellation callback failed", self.method)

    def _finish(
        self, raw: RawCall, ops: tuple[Any, ...], code: grpc.StatusCode, details: str
    ) -> None:
        raw.on_cancel = None
        if self._closing:  # the queue is shut down; the server's stop ended the call
            if raw._handed:
                self._pipeline.ended(raw, grpc.StatusCode.CANCELLED, "")
            return
        try:
            raw._call.start_server_batch(ops, _SENT)
        except Exception as exc:
            # Never raise into whoever answers (a batch answering many calls at once): this
            # call alone fails; cancel it so its client is not left waiting.
            self._count_failure(exc)
            self._cancel(raw._call)
            code, details = _INTERNAL, "the answer could not be sent"
        if raw._handed:
            self._pipeline.ended(raw, code, details)

    # -- faults --------------------------------------------------------------------------------

    def _event_failed(self, event: Any, exc: Exception, raw: RawCall | None = None) -> None:
        """Handling ``event`` raised: fail the one call it belongs to; the pump goes on."""
        self._count_failure(exc)
        tag = getattr(event, "tag", None)
        if raw is None:
            if type(tag) is RawCall:
                raw = tag
            elif type(tag) is _Close:
                raw = tag.raw
        try:
            if raw is not None:
                if raw.open:
                    raw.reject(handler_failed(self.method, exc))
            elif tag is _NEW_CALL and getattr(event, "call", None) is not None:
                # The call could not even be set up: answer it bare, or cancel it.
                err = handler_failed(self.method, exc)
                details = err.message.encode()
                ops = _build_ops(err.trailing_metadata(), err.code.value[0], details, None)
                event.call.start_server_batch(ops, _SENT)
        except Exception:
            self._cancel(raw._call if raw is not None else getattr(event, "call", None))

    def _cancel(self, call: Any) -> None:
        if call is None or self._closing:
            return
        try:
            call.cancel()
        except Exception:
            _log.exception("%s: cannot cancel a call that failed", self.method)

    def _count_failure(self, exc: BaseException) -> None:
        self.event_failures += 1
        now = time.monotonic()
        if now - self._failures_logged_at < _FAILURE_LOG_INTERVAL_S:
            self._failures_unlogged += 1
            return
        _log.error(
            "%s: handling an event failed; that call alone gets INTERNAL",
            self.method,
            exc_info=exc,
            extra={"failures_not_logged": self._failures_unlogged},
        )
        self._failures_logged_at = now
        self._failures_unlogged = 0

    def _fail(self, reason: str) -> None:
        """The pump cannot go on: record why and tell the host, on the loop (any thread)."""
        if self.failure is not None:
            return
        self.failure = reason
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # closed in between
            loop.call_soon_threadsafe(self._report_failure)

    def _report_failure(self) -> None:
        if self.failure is None:
            return
        if self.on_failure is not None:
            self.on_failure(self.failure)  # the host logs it, with what it does about it
        else:
            _log.error("%s: the completion-queue path cannot go on: %s", self.method, self.failure)
