"""Infer's one adapter, for both transports: protobuf in, gateway decisions, an answer out.

What it decides: nothing of substance — how a decoded ``InferRequest`` on a unary call
(:class:`common.call.UnaryCall`, from the completion queue or ``grpc.aio``) reaches the
gateway's :meth:`~gateway.infer_path.InferPath.admit` and how its settled answer goes back.
The host's unary pipeline (``common.serving``) has measured, traced, gated, size-checked,
authenticated and decoded the call before; a bug here still gets a typed INTERNAL answer.

:func:`tenant_check` is Infer's credential layer (``common.auth``): the tenant key is checked
before the request is decoded, as the README's error table says.
"""

from __future__ import annotations

from common.call import UnaryCall
from common.errors import RichError, internal
from gateway.dispatcher import PendingRequest
from gateway.infer_path import InferPath, internal_error
from halcyon.v1 import infer_pb2

__all__ = ["InferAdapter", "tenant_check"]

# What admit() is given for a call refused before its request was read: it names no model.
_UNREAD = infer_pb2.InferRequest()


class InferAdapter:
    """``handler(request, call)`` for Infer: admit, then answer once the request is settled."""

    def __init__(self, app: InferPath) -> None:
        self._app = app

    def __call__(self, request: infer_pb2.InferRequest, call: UnaryCall) -> None:
        app = self._app
        try:
            admitted = app.admit(request, call.metadata, call.time_remaining(), call.span)
        except RichError as err:
            call.reject(err)
            return
        except Exception as exc:  # never UNKNOWN: a bug still gets a typed answer
            call.reject(internal_error("Infer failed before admission", exc))
            return
        pending = admitted.pending
        # The client went away (or its deadline passed): the batch skips the request, and it
        # is settled below without a sample.
        call.on_cancel = pending.cancel

        def answer(_: PendingRequest) -> None:
            if pending.cancelled:
                app.settle_cancelled(admitted)
                return
            try:
                outcome = app.settle(admitted)
            except Exception as exc:  # a bug building the answer: still a typed one
                call.reject(internal_error("Infer failed settling its answer", exc))
                return
            if isinstance(outcome, RichError):
                call.reject(outcome)
                return
            call.reply(outcome.SerializeToString())

        pending.when_answered(answer)


def tenant_check(app: InferPath, call: UnaryCall) -> RichError | None:
    """None when the call carries a tenant key; else the rejection, recorded as admit()
    records every refusal — admit() refuses the same credential the same way, and is given
    the request if its bytes parse, so the refusal is counted under the model it asked for."""
    try:
        app._authenticate(call.metadata)
    except RichError:
        pass
    else:
        return None
    try:
        request = infer_pb2.InferRequest.FromString(call.request)
    except Exception:  # undecodable bytes: the credential is refused first, naming no model
        request = _UNREAD
    try:
        app.admit(request, call.metadata, None)
    except RichError as err:
        return err
    return internal("Infer: a credential refused once was accepted on a second look")
