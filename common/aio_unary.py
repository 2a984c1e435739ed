"""The ``grpc.aio`` transport of the unary pipeline: unary methods served through it on aio.

What it decides: how a unary call ``grpc.aio`` receives reaches the method's
:class:`common.pipeline.UnaryPipeline`, and how the pipeline's answer goes back. Every unary
method handler is registered with no request deserializer, so the pipeline gets the request
bytes and its decode step decodes them once; an :class:`AioCall` (a
:class:`common.call.UnaryCall` over the ``ServicerContext``) carries the call through it.

Two kinds of method:

* call-style (:func:`call_style_handler`: the gateway's Infer, the worker's ExecuteBatch): the
  pipeline's handler answers through the call, as on the completion queue; the behaviour waits
  for that answer (or for the client to cancel) and sends it;
* servicer methods (:class:`PipelinedHandlers`: ``async def M(request, context)`` of the
  generated servicers): the pipeline admits and decodes, then the servicer runs on the real
  context with the call's span current; how it ended (a response, ``context.abort``, a code it
  set) is what the layers hear. A servicer that raises anything else is answered ``INTERNAL``
  (reason ``INTERNAL``) — a :class:`~common.errors.RichError` raised is answered as itself.

Streaming methods pass through untouched: the host's interceptors serve them, through
:class:`StreamingOnly`, which hands every unary handler back as found.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context
from opentelemetry import trace

from common.call import Metadata, cancelled_code
from common.errors import RichError, abort
from common.grpc_metrics import status_code
from common.pipeline import REFUSED, UnaryPipeline, handler_failed

__all__ = [
    "AioCall",
    "PipelinedHandlers",
    "StreamingOnly",
    "call_style_handler",
    "servicer_handler",
]

_log = logging.getLogger("halcyon.pipeline")

_OPEN, _ANSWERED, _CANCELLED = range(3)
_OK = grpc.StatusCode.OK


class AioCall:
    """One ``grpc.aio`` unary call as the pipeline sees it."""

    __slots__ = (
        "_context",
        "_outcome",
        "_pipeline",
        "_state",
        "_waiter",
        "deadline",
        "metadata",
        "method",
        "on_cancel",
        "request",
        "span",
        "started",
    )

    def __init__(
        self, pipeline: UnaryPipeline, context: grpc.aio.ServicerContext, request: bytes
    ) -> None:
        self.started = time.perf_counter()
        self._pipeline = pipeline
        self._context = context
        self._state = _OPEN
        self._outcome: bytes | RichError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.method = pipeline.method
        self.metadata: Metadata = context.invocation_metadata() or ()
        left = context.time_remaining()
        self.deadline: float | None = None if left is None else time.time() + left
        self.request = request
        self.span: trace.Span = trace.INVALID_SPAN
        self.on_cancel: Callable[[], object] | None = None

    @property
    def open(self) -> bool:
        return self._state == _OPEN

    def peer(self) -> str:
        return str(self._context.peer())

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()

    def reply(self, payload: bytes) -> None:
        if self._state != _OPEN:
            return
        self._settle(payload, _OK, "")

    def reject(self, err: RichError) -> None:
        if self._state != _OPEN:
            return
        self._settle(err, err.code, err.message)

    def settled(self, code: grpc.StatusCode, details: str) -> None:
        """A servicer method ended on its own context with ``code``."""
        if self._state == _OPEN:
            self._settle(None, code, details)

    def cancelled(self) -> None:
        """The client went away (or its deadline passed) before the answer."""
        if self._state != _OPEN:
            return
        self._state = _CANCELLED
        self._pipeline.ended(self, cancelled_code(self, time.time()), "")
        callback, self.on_cancel = self.on_cancel, None
        if callback is not None:
            try:
                callback()
            except Exception:
                _log.exception("%s cancellation callback failed", self.method)

    def _settle(self, outcome: bytes | RichError | None, code: grpc.StatusCode, why: str) -> None:
        self._state = _ANSWERED
        self._outcome = outcome
        self.on_cancel = None
        self._pipeline.ended(self, code, why)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def answer(self) -> Any:
        """Wait for the call's answer and send it: the payload returned, a rejection aborted."""
        if self._state == _OPEN:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                self.cancelled()
                raise
        outcome = self._outcome
        if isinstance(outcome, RichError):
            await abort(self._context, outcome)
        return outcome


def call_style_handler(pipeline: UnaryPipeline) -> grpc.RpcMethodHandler:
    """The aio handler of a method whose pipeline handler answers through the call."""

    async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> Any:
        call = AioCall(pipeline, context, request)
        pipeline.run(call)
        return await call.answer()

    return grpc.unary_unary_rpc_method_handler(behaviour)


def servicer_handler(
    pipeline: UnaryPipeline, handler: grpc.RpcMethodHandler
) -> grpc.RpcMethodHandler:
    """``handler`` (a unary servicer method) run behind ``pipeline``, which decodes for it."""
    inner = handler.unary_unary
    method = pipeline.method

    async def behaviour(request: bytes, context: grpc.aio.ServicerContext) -> Any:
        call = AioCall(pipeline, context, request)
        message = pipeline.admit(call)
        if message is REFUSED:
            return await call.answer()
        span = call.span
        token = (
            None
            if span is trace.INVALID_SPAN
            else otel_context.attach(trace.set_span_in_context(span))
        )
        try:
            response = inner(message, context)
            if inspect.isawaitable(response):
                response = await response
        except grpc.aio.AbortError:
            call.settled(status_code(context.code()), context.details() or "")
            raise
        except asyncio.CancelledError:
            call.cancelled()
            raise
        except RichError as err:
            call.reject(err)
            return await call.answer()
        except Exception as exc:
            _log.exception("%s handler failed", method)
            call.reject(handler_failed(method, exc))
            return await call.answer()
        finally:
            if token is not None:
                otel_context.detach(token)
        code = status_code(context.code())
        call.settled(code, "" if code is _OK else context.details() or "")
        return response

    return grpc.unary_unary_rpc_method_handler(
        behaviour, response_serializer=handler.response_serializer
    )


# The host's composition of a servicer method's pipeline: (method, its handler) -> pipeline.
Compose = Callable[[str, grpc.RpcMethodHandler], UnaryPipeline]


class PipelinedHandlers(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A service's generic handlers with each unary method behind its pipeline.

    ``claimed`` names methods another handler of the host serves (``ServiceHost.add_unary``):
    this one answers None for them, so that handler does.
    """

    def __init__(self, inner: Any, compose: Compose, claimed: set[str]) -> None:
        self._inner = inner
        self._compose = compose
        self._claimed = claimed
        # method -> (the handler the service gave, its pipelined form): built once per method.
        self._built: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        if method in self._claimed:
            return None
        handler = self._inner.service(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        built = self._built.get(method)
        if built is not None and built[0] is handler:
            return built[1]
        pipelined = servicer_handler(self._compose(method, handler), handler)
        self._built[method] = (handler, pipelined)
        return pipelined


class StreamingOnly(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The host's interceptors, for streaming calls only: a unary method's handler is
    returned as found (its pipeline does what they would), a streaming one goes through
    ``chain`` (outermost first) as if each were the server's own interceptor."""

    def __init__(self, chain: list[grpc.aio.ServerInterceptor]) -> None:
        self._chain = tuple(chain)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        return await self._through(0, handler, handler_call_details)

    async def _through(
        self, index: int, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> Any:
        if index == len(self._chain):
            return handler

        async def inner(next_details: grpc.HandlerCallDetails) -> Any:
            return await self._through(index + 1, handler, next_details)

        return await self._chain[index].intercept_service(inner, details)
