"""Prometheus metrics for gRPC servers and clients, under the conventional names.

What it decides: how every call is counted, so dashboards built for go-grpc-prometheus work
unchanged (design section 6): ``grpc_server_started_total``, ``grpc_server_handled_total``
``{grpc_service, grpc_method, grpc_type, grpc_code}`` with Go-style code names
(``ResourceExhausted``), ``grpc_server_handling_seconds`` (histogram), and
``grpc_server_msg_received_total`` / ``grpc_server_msg_sent_total``; ``grpc_client_*`` the same
from the calling side.

How the code is observed: a handler ends by returning, by ``context.abort`` (which raises
``grpc.aio.AbortError`` after setting the code), by ``context.set_code`` then returning, by the
client cancelling (``asyncio.CancelledError``; ``Canceled``, or ``DeadlineExceeded`` when the
deadline ran out), or by any other exception (``Unknown`` unless a code was set first). The
interceptor reads ``context.code()`` after the handler in every case.

Unary calls are counted by the unary pipeline's metrics layer (:mod:`common.call_metrics`) on
either transport; :class:`ServerMetricsInterceptor` counts the streaming calls ``grpc.aio``
serves. Messages are counted for unary calls, request iterators and async-generator responses; a
handler that uses ``context.read()`` / ``context.write()`` directly is not counted.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry, Counter

from common.buffered_metrics import LoopHistogram

__all__ = [
    "LATENCY_BUCKETS",
    "ClientMetricsInterceptors",
    "GrpcClientMetrics",
    "GrpcServerMetrics",
    "MethodCounts",
    "ServerMetricsInterceptor",
    "UnaryClientRecorder",
    "code_name",
    "ended_code",
    "split_method",
    "status_code",
]

# Seconds; from sub-millisecond health checks to multi-second batches and long streams.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip

_GO_NAMES: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}
_BY_VALUE: dict[int, grpc.StatusCode] = {c.value[0]: c for c in grpc.StatusCode}

_UNARY, _CLIENT_STREAM, _SERVER_STREAM, _BIDI_STREAM = (
    "unary",
    "client_stream",
    "server_stream",
    "bidi_stream",
)


def code_name(code: grpc.StatusCode | int | None) -> str:
    """Go-style name of a status code (``None`` -> ``OK``, as gRPC treats an unset code)."""
    if code is None:
        return "OK"
    if isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return _GO_NAMES.get(code, "Unknown")


def status_code(code: grpc.StatusCode | int | None) -> grpc.StatusCode:
    """A status as ``grpc.aio`` reports it (a code, its number, or None for OK) as a code."""
    if code is None:
        return grpc.StatusCode.OK
    if isinstance(code, int):
        return _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    return code


def split_method(full_method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` -> ``("pkg.Service", "Method")``."""
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    return service or "unknown", method or "unknown"


def _grpc_type(request_streaming: bool, response_streaming: bool) -> str:
    if request_streaming and response_streaming:
        return _BIDI_STREAM
    if request_streaming:
        return _CLIENT_STREAM
    if response_streaming:
        return _SERVER_STREAM
    return _UNARY


class _CallMetrics:
    """The five metric families, for one side (``server`` or ``client``)."""

    def __init__(self, side: str, registry: CollectorRegistry) -> None:
        labels = ("grpc_service", "grpc_method", "grpc_type")
        self.started = Counter(
            f"grpc_{side}_started", f"RPCs started on the {side}.", labels, registry=registry
        )
        self.handled = Counter(
            f"grpc_{side}_handled",
            f"RPCs completed on the {side}, by status code.",
            (*labels, "grpc_code"),
            registry=registry,
        )
        # Written only on the event loop (interceptors and hot-path recorders alike).
        self.seconds = LoopHistogram(
            f"grpc_{side}_handling_seconds",
            f"RPC duration on the {side} until completion.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.received = Counter(
            f"grpc_{side}_msg_received",
            f"Stream messages received on the {side}.",
            labels,
            registry=registry,
        )
        self.sent = Counter(
            f"grpc_{side}_msg_sent",
            f"Stream messages sent on the {side}.",
            labels,
            registry=registry,
        )


class GrpcServerMetrics(_CallMetrics):
    """``grpc_server_*`` families registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__("server", registry)


class GrpcClientMetrics(_CallMetrics):
    """``grpc_client_*`` families registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__("client", registry)


def ended_code(context: grpc.aio.ServicerContext, exc: BaseException | None) -> grpc.StatusCode:
    """The status the call ended with, as observed after the handler."""
    code = status_code(context.code())
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        try:
            expired = context.time_remaining() is not None and context.time_remaining() <= 0
        except Exception:  # best effort: the call may already be torn down
            expired = False
        return grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
    if exc is not None and code is grpc.StatusCode.OK:
        return grpc.StatusCode.UNKNOWN
    return code


class _Increments(Protocol):
    def inc(self) -> None: ...


class MethodCounts(Protocol):
    """One method's children, as :mod:`common.call_metrics` keeps them for the unary pipeline
    (``MethodMetrics``): the streaming interceptor counts through the same objects."""

    @property
    def started(self) -> _Increments: ...

    @property
    def received(self) -> _Increments: ...

    @property
    def sent(self) -> _Increments: ...

    def finished(self, started: float, code: grpc.StatusCode) -> None: ...


class _ServerCall:
    """Bookkeeping for one streaming server call: its method's counts and start time."""

    __slots__ = ("counts", "start")

    def __init__(self, counts: MethodCounts) -> None:
        self.counts = counts
        self.start = time.perf_counter()
        counts.started.inc()

    def received(self) -> None:
        self.counts.received.inc()

    def sent(self) -> None:
        self.counts.sent.inc()

    def finish(self, context: grpc.aio.ServicerContext, exc: BaseException | None) -> None:
        self.counts.finished(self.start, ended_code(context, exc))


async def _counted(iterator: AsyncIterable[Any], call: _ServerCall) -> AsyncIterator[Any]:
    async for message in iterator:
        call.received()
        yield message


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class ServerMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every handler kind to count starts, codes, durations and messages, through
    ``counts(method, grpc_type)`` (``common.call_metrics.CallMetrics.for_method``)."""

    def __init__(self, counts: Callable[[str, str], MethodCounts]) -> None:
        self._counts = counts

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        kind = _grpc_type(handler.request_streaming, handler.response_streaming)
        kwargs: dict[str, Any] = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if kind == _UNARY:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary_response(handler.unary_unary, method, kind, False), **kwargs
            )
        if kind == _CLIENT_STREAM:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary_response(handler.stream_unary, method, kind, True), **kwargs
            )
        if kind == _SERVER_STREAM:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream_response(handler.unary_stream, method, kind, False), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream_response(handler.stream_stream, method, kind, True), **kwargs
        )

    def _wrap_unary_response(
        self, inner: Callable[..., Any], method: str, kind: str, request_streaming: bool
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        counts = self._counts

        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _ServerCall(counts(method, kind))
            if request_streaming:
                request = _counted(request, call)
            else:
                call.received()
            try:
                response = await _maybe_await(inner(request, context))
            except BaseException as exc:
                call.finish(context, exc)
                raise
            if response is not None and code_name(context.code()) == "OK":
                call.sent()
            call.finish(context, None)
            return response

        return handle

    def _wrap_stream_response(
        self, inner: Callable[..., Any], method: str, kind: str, request_streaming: bool
    ) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
        counts = self._counts

        if inspect.isasyncgenfunction(inner):

            async def handle_gen(request: Any, context: grpc.aio.ServicerContext) -> Any:
                call = _ServerCall(counts(method, kind))
                if request_streaming:
                    request = _counted(request, call)
                else:
                    call.received()
                try:
                    async for response in inner(request, context):
                        yield response
                        call.sent()
                except BaseException as exc:
                    call.finish(context, exc)
                    raise
                call.finish(context, None)

            return handle_gen

        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # A coroutine handler that streams with context.write(): messages are not counted.
            call = _ServerCall(counts(method, kind))
            if request_streaming:
                request = _counted(request, call)
            else:
                call.received()
            try:
                result = await _maybe_await(inner(request, context))
            except BaseException as exc:
                call.finish(context, exc)
                raise
            call.finish(context, None)
            return result

        return handle


# -- client side ------------------------------------------------------------------------------


class _ClientInterceptorBase:
    def __init__(self, metrics: GrpcClientMetrics) -> None:
        self._metrics = metrics
        self._pending: set[asyncio.Task[None]] = set()

    def _observe(self, call: Any, method: str, kind: str, start: float) -> None:
        service, name = split_method(method)
        labels = (service, name, kind)
        metrics = self._metrics

        async def record() -> None:
            try:
                code = await call.code()
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
            _record_client_end(metrics, labels, code, start)

        def done(_: Any) -> None:
            task = asyncio.get_running_loop().create_task(record())
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

        metrics.started.labels(*labels).inc()
        call.add_done_callback(done)

    async def _timed(
        self,
        continuation: Any,
        details: grpc.aio.ClientCallDetails,
        request: Any,
        kind: str,
    ) -> Any:
        """Start the call, and observe it when it ends (the four kinds differ only in ``kind``;
        grpc.aio needs one interceptor class per kind)."""
        start = time.perf_counter()
        call = await continuation(details, request)
        self._observe(call, _method_name(details), kind, start)
        return call


def _method_name(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class _UnaryUnary(_ClientInterceptorBase, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._timed(continuation, client_call_details, request, _UNARY)


class _UnaryStream(_ClientInterceptorBase, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await self._timed(continuation, client_call_details, request, _SERVER_STREAM)


class _StreamUnary(_ClientInterceptorBase, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await self._timed(continuation, client_call_details, requests, _CLIENT_STREAM)


class _StreamStream(_ClientInterceptorBase, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await self._timed(continuation, client_call_details, requests, _BIDI_STREAM)


def _record_client_end(
    metrics: GrpcClientMetrics, labels: tuple[str, str, str], code: grpc.StatusCode, start: float
) -> None:
    """A client call ended with ``code``: its status, duration and (unary sides) messages."""
    kind = labels[2]
    metrics.handled.labels(*labels, code_name(code)).inc()
    metrics.seconds.labels(*labels).observe(time.perf_counter() - start)
    if kind in (_UNARY, _SERVER_STREAM):
        metrics.sent.labels(*labels).inc()
    if kind in (_UNARY, _CLIENT_STREAM) and code == grpc.StatusCode.OK:
        metrics.received.labels(*labels).inc()


class UnaryClientRecorder:
    """``grpc_client_*`` for one unary method, recorded by the caller itself.

    For a hot call whose caller already sees its end (the gateway's ExecuteBatch): an aio
    client interceptor costs three extra tasks per call. Same families, labels and rules as
    the interceptors.
    """

    def __init__(self, metrics: GrpcClientMetrics, method: str) -> None:
        service, name = split_method(method)
        self._labels = (service, name, _UNARY)
        self._metrics = metrics

    def start(self) -> float:
        """Count a call started now; returns its start time for :meth:`finish`."""
        self._metrics.started.labels(*self._labels).inc()
        return time.perf_counter()

    def finish(self, start: float, code: grpc.StatusCode) -> None:
        _record_client_end(self._metrics, self._labels, code, start)


class ClientMetricsInterceptors:
    """The four aio client interceptors sharing one :class:`GrpcClientMetrics`.

    ``grpc.aio.insecure_channel(target, interceptors=ClientMetricsInterceptors(m).all())``.
    Counts starts, codes and durations for every kind; stream messages are not counted one by
    one (unary sides count as one message each).
    """

    def __init__(self, metrics: GrpcClientMetrics) -> None:
        self.metrics = metrics

    def all(self) -> list[Any]:
        return [
            _UnaryUnary(self.metrics),
            _UnaryStream(self.metrics),
            _StreamUnary(self.metrics),
            _StreamStream(self.metrics),
        ]
