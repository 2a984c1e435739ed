"""Request bytes that do not parse: INVALID_ARGUMENT, on every path a request is decoded.

What it decides: how a server answers a request message it cannot decode — ``INVALID_ARGUMENT``
(``ErrorInfo`` reason ``INVALID_FIELD``, a ``BadRequest`` naming ``request`` and the message
type, :func:`common.errors.undecodable`) instead of the ``UNKNOWN`` with a Python repr that
``grpc.aio`` gives when a ``request_deserializer`` raises — and which message type that names
(:func:`message_type_of`).

Unary methods are decoded once, by the unary pipeline's decode step (``common.pipeline``), on
both transports. What is left for this module is what the pipeline does not carry:

* streaming methods ``grpc.aio`` serves: :class:`DecodeGuard`, a server interceptor, gives each
  handler a deserializer that never raises (bytes that do not parse become
  :data:`UNDECODABLE`) and a behaviour that answers :data:`UNDECODABLE` wherever the servicer
  meets it — from the request iterator, or from ``context.read()`` (the servicer gets a
  context whose ``read()`` does the same). Innermost, inside the auth gate: a caller without
  credentials still gets ``UNAUTHENTICATED``;
* the synchronous probe server (``common.health.ProbeServer``): :func:`guard_sync_handler`.

A guarded handler is built once per method and reused; methods without a deserializer (raw
bytes) are left alone.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
import grpc.aio
from google.protobuf import descriptor_pool

from common.errors import RichError, abort, abort_sync, undecodable
from common.handlers import behaviour_of, same_kind_handler

__all__ = ["UNDECODABLE", "DecodeGuard", "guard_handler", "guard_sync_handler", "message_type_of"]


class _Undecodable:
    """The type of :data:`UNDECODABLE` (never a message)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDECODABLE"


# What a guarded deserializer returns for bytes that do not parse.
UNDECODABLE: Final = _Undecodable()


def message_type_of(method: str, deserializer: Callable[[bytes], Any]) -> str:
    """The full name of the message ``deserializer`` parses, for the error a client reads: the
    class a generated deserializer (its bound ``FromString``) belongs to, else the method's
    input type in the descriptor pool."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    full_name = getattr(descriptor, "full_name", None)
    if isinstance(full_name, str) and full_name:
        return full_name
    service, _, name = method.lstrip("/").partition("/")
    try:
        found = descriptor_pool.Default().FindMethodByName(f"{service}.{name}")
    except KeyError:
        return f"request message of {method}"
    return str(found.input_type.full_name)


def _guarded(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # its only input is the client's bytes: whatever fails, they are bad
            return UNDECODABLE

    return deserialize


async def _checked(
    requests: AsyncIterable[Any], context: grpc.aio.ServicerContext, err: RichError
) -> AsyncIterator[Any]:
    async for message in requests:
        if message is UNDECODABLE:
            await abort(context, err)
        yield message


class _CheckedReads:
    """The servicer's view of its context: ``read()`` aborts on :data:`UNDECODABLE`; the rest
    is the call's own context."""

    __slots__ = ("_context", "_err")

    def __init__(self, context: grpc.aio.ServicerContext, err: RichError) -> None:
        self._context = context
        self._err = err

    async def read(self) -> Any:
        message = await self._context.read()
        if message is UNDECODABLE:
            await abort(self._context, self._err)
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


async def _invoke(
    inner: Callable[..., Any],
    request: Any,
    context: grpc.aio.ServicerContext,
    request_streaming: bool,
    err: RichError,
) -> Any:
    """``inner``'s result for this call: the request checked (or its stream and reads set to
    be checked), aborting with ``err`` on :data:`UNDECODABLE`."""
    if request_streaming:
        return inner(_checked(request, context, err), _CheckedReads(context, err))
    if request is UNDECODABLE:
        await abort(context, err)
    return inner(request, context)


def _guard_behaviour(
    inner: Callable[..., Any], request_streaming: bool, err: RichError
) -> Callable[..., Any]:
    """A behaviour of the same shape as ``inner`` (async generator, or coroutine) that meets
    :data:`UNDECODABLE` with ``err`` before ``inner`` can see it."""
    if inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in await _invoke(inner, request, context, request_streaming, err):
                yield response

        return stream

    if inspect.iscoroutinefunction(inner) and not request_streaming:

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # A unary request: checked here, without a helper call.
            if request is UNDECODABLE:
                await abort(context, err)
            return await inner(request, context)

        return unary

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        result = await _invoke(inner, request, context, request_streaming, err)
        return await result if inspect.isawaitable(result) else result

    return call


def guard_handler(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` with a deserializer that never raises and a behaviour that answers what it
    could not decode with INVALID_ARGUMENT; ``handler`` itself when it has no deserializer."""
    deserializer = handler.request_deserializer
    if deserializer is None:
        return handler
    err = undecodable(message_type_of(method, deserializer))
    behaviour = _guard_behaviour(behaviour_of(handler), handler.request_streaming, err)
    return same_kind_handler(handler, behaviour, request_deserializer=_guarded(deserializer))


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every method handler guarded by :func:`guard_handler`; put it last (innermost)."""

    def __init__(self) -> None:
        # method -> (the handler the server gave, its guarded form): built once per method.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
            return handler
        method = handler_call_details.method
        cached = self._guarded.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = guard_handler(method, handler)
        self._guarded[method] = (handler, guarded)
        return guarded


def guard_sync_handler(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` of a synchronous ``grpc.server`` (unary request) answering bytes that do
    not parse with :func:`common.errors.undecodable`; ``handler`` itself when it has no
    deserializer or takes a request stream."""
    deserializer = handler.request_deserializer
    if deserializer is None or handler.request_streaming:
        return handler
    err = undecodable(message_type_of(method, deserializer))
    inner = behaviour_of(handler)

    def behaviour(request: Any, context: grpc.ServicerContext) -> Any:
        if request is UNDECODABLE:
            abort_sync(context, err)
        return inner(request, context)

    return same_kind_handler(handler, behaviour, request_deserializer=_guarded(deserializer))
