"""The unary call pipeline: every server-side concern of a unary call, run in one order.

What it decides: how a received unary call (:class:`common.call.UnaryCall`) goes from its bytes
to its handler, whichever transport carries it. A :class:`UnaryPipeline` is built once per
method (by ``common.serving.ServiceHost``, which owns the order) from:

* layers (:class:`Layer`), outermost first: each may refuse or hold the call before the
  handler (:meth:`Layer.admit`) and sees how it ended (:meth:`Layer.ended`, innermost first,
  as a stack unwinds). A layer that does not apply to a method is simply not in its list;
* the decode step: the request bytes become the method's message with its deserializer;
  bytes that do not parse are refused ``INVALID_ARGUMENT`` (:func:`common.errors.undecodable`);
* the handler, ``handler(message, call)``, which answers through the call — and error
  mapping: a handler that raises gets the call answered ``INTERNAL`` (reason ``INTERNAL``).

Why hooks and not nested wrappers: the completion-queue path serves a call for ~70 µs of CPU
(ADR 0006); a coroutine or closure per layer per call would be most of the budget. Here a
call costs one bound-method call per layer that applies, and no allocation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

import grpc

from common.call import HELD, UnaryCall, Verdict
from common.errors import RichError, internal, undecodable

__all__ = ["REFUSED", "Layer", "UnaryHandler", "UnaryPipeline", "handler_failed"]

_log = logging.getLogger("halcyon.pipeline")

# handler(decoded request, call): answers through the call, now or later.
UnaryHandler = Callable[[Any, UnaryCall], None]


class _Refused:
    __slots__ = ()

    def __repr__(self) -> str:
        return "REFUSED"


# What UnaryPipeline.admit returns for a call that does not reach its handler.
REFUSED: Final = _Refused()


class Layer:
    """One concern of every call. Subclasses override the hooks they need; a hook left as
    this base class's is not called at all."""

    def admit(self, call: UnaryCall) -> Verdict:
        """Before the handler: None to go on, a rejection to send, or HELD."""
        return None

    def ended(self, call: UnaryCall, code: grpc.StatusCode, details: str) -> None:
        """The call ended with ``code`` (answered, or cancelled: CANCELLED/DEADLINE_EXCEEDED)."""


def handler_failed(method: str, exc: BaseException) -> RichError:
    """What a call gets when its handler (or the transport, serving it) raised: a bug."""
    return internal(f"internal error serving {method} ({type(exc).__name__})")


class UnaryPipeline:
    """The composed layers, decode step and handler of one method."""

    __slots__ = ("_admits", "_decode", "_ends", "_handler", "_undecodable", "method")

    def __init__(
        self,
        method: str,
        layers: Sequence[Layer],
        *,
        deserializer: Callable[[bytes], Any] | None,
        message_type: str,
        handler: UnaryHandler | None,
    ) -> None:
        """``deserializer`` None hands the handler the request bytes; ``handler`` None is for a
        transport that runs the method's own handler itself (``common.aio_unary``)."""
        self.method = method
        self._admits = tuple(
            layer.admit for layer in layers if type(layer).admit is not Layer.admit
        )
        self._ends = tuple(
            layer.ended for layer in reversed(layers) if type(layer).ended is not Layer.ended
        )
        self._decode = deserializer
        self._undecodable = undecodable(message_type)
        self._handler = handler

    def admit(self, call: UnaryCall) -> Any:
        """Run the layers and the decode step: the request message, or :data:`REFUSED` (the
        call was rejected, or a layer holds it and answers it later)."""
        for admit in self._admits:
            verdict = admit(call)
            if verdict is not None:
                if verdict is not HELD:
                    call.reject(verdict)  # type: ignore[arg-type]
                return REFUSED
        decode = self._decode
        if decode is None:
            return call.request
        try:
            return decode(call.request)
        except Exception:  # its only input is the client's bytes: whatever fails, they are bad
            call.reject(self._undecodable)
            return REFUSED

    def run(self, call: UnaryCall) -> None:
        """The whole pipeline for a call whose request arrived (the transport's entry)."""
        message = self.admit(call)
        if message is REFUSED:
            return
        try:
            self._handler(message, call)  # type: ignore[misc]
        except Exception as exc:
            _log.exception("%s handler failed", self.method)
            if call.open:
                call.reject(handler_failed(self.method, exc))

    def ended(self, call: UnaryCall, code: grpc.StatusCode, details: str) -> None:
        """The transport: ``call`` (run through :meth:`run`/:meth:`admit`) has ended."""
        for ended in self._ends:
            ended(call, code, details)
