"""The console's reads and actions, through the very servicer methods the gRPC API runs.

What it decides: nothing of its own — which is the point. ``GetState``,
``ListRolloutDecisions``, ``PromoteRollout``, ``AbortRollout``, the gates ``PauseRollout``,
``ResumeRollout`` and ``ApproveRollout``, ``DrainReplica`` and ``UndrainReplica`` are called
on the controller's :class:`controller.servicer.ControlService` with a stand-in for the gRPC
context (:class:`_CallContext`), so the console validates, decides and refuses exactly as the
RPCs do: the same input bounds, the same domain code, the
same mapping of exceptions to statuses (``ControlService._fail``). A refusal the servicer
aborts with comes back as a :class:`~controller.console.problems.ConsoleError` with that
status's code, message, ``ErrorInfo`` reason and metadata, unpacked from the same trailers a
gRPC client would read.

Answers are the RPCs' response messages in the proto3 JSON mapping (``lowerCamelCase`` field
names, enums by name, Durations as ``"0.012s"``, Timestamps in RFC 3339), every field present
— the same document ``grpcurl`` prints for the RPC, so a script can use either.

Authorization is not checked here: the console's :mod:`controller.console.access` gate ran
before, as the host's AuthPolicy does before a gRPC handler.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar, cast

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from common.errors import internal
from controller.console.problems import ConsoleError, from_status
from controller.servicer import ControlService
from halcyon.v1 import control_pb2

__all__ = ["Operations", "to_json"]

_log = logging.getLogger("halcyon.controller.console")

M = TypeVar("M", bound=Message)


def to_json(message: Message) -> dict[str, Any]:
    """A message in the proto3 JSON mapping, with every field (as ``grpcurl`` prints it)."""
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


class _Aborted(Exception):
    def __init__(self, error: ConsoleError) -> None:
        super().__init__(error.message)
        self.error = error


class _CallContext:
    """Stands in for ``grpc.aio.ServicerContext``: what the servicer's methods touch."""

    def __init__(self) -> None:
        self._trailers: Sequence[tuple[str, str | bytes]] = ()

    def trailing_metadata(self) -> Sequence[tuple[str, str | bytes]]:
        return self._trailers

    def set_trailing_metadata(self, trailers: Sequence[tuple[str, str | bytes]]) -> None:
        self._trailers = tuple(trailers)

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "console"

    def time_remaining(self) -> float | None:
        return None

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> NoReturn:
        raise _Aborted(from_status(code, details, trailing_metadata))


class Operations:
    """Read and act through ``servicer``; every refusal is a :class:`ConsoleError`."""

    def __init__(self, servicer: ControlService) -> None:
        self._servicer = servicer

    async def _call(
        self,
        method: Callable[[M, grpc.aio.ServicerContext], Awaitable[Message]],
        request: M,
    ) -> dict[str, Any]:
        context = cast(grpc.aio.ServicerContext, _CallContext())
        try:
            response = await method(request, context)
        except _Aborted as aborted:
            raise aborted.error from None
        except ConsoleError:
            raise
        except Exception as exc:  # a bug: do not leak internals
            _log.exception("console call failed", extra={"method": method.__name__})
            err = internal("internal error in the controller")
            raise ConsoleError(err.code, err.message, err.reason) from exc
        return to_json(response)

    async def state(self) -> dict[str, Any]:
        return await self._call(self._servicer.GetState, control_pb2.GetStateRequest())

    async def decisions(self, model: str, limit: int) -> dict[str, Any]:
        request = control_pb2.ListRolloutDecisionsRequest(model=model, limit=limit)
        return await self._call(self._servicer.ListRolloutDecisions, request)

    async def promote(self, model: str) -> dict[str, Any]:
        request = control_pb2.PromoteRolloutRequest(model=model)
        return await self._call(self._servicer.PromoteRollout, request)

    async def abort(self, model: str, reason: str) -> dict[str, Any]:
        request = control_pb2.AbortRolloutRequest(model=model, reason=reason)
        return await self._call(self._servicer.AbortRollout, request)

    async def pause(self, model: str, auto_rollback: bool, reason: str) -> dict[str, Any]:
        request = control_pb2.PauseRolloutRequest(
            model=model, auto_rollback=auto_rollback, reason=reason
        )
        return await self._call(self._servicer.PauseRollout, request)

    async def resume(self, model: str, reason: str) -> dict[str, Any]:
        request = control_pb2.ResumeRolloutRequest(model=model, reason=reason)
        return await self._call(self._servicer.ResumeRollout, request)

    async def approve(self, model: str) -> dict[str, Any]:
        request = control_pb2.ApproveRolloutRequest(model=model)
        return await self._call(self._servicer.ApproveRollout, request)

    async def drain(self, replica_id: str) -> dict[str, Any]:
        request = control_pb2.DrainReplicaRequest(replica_id=replica_id)
        return await self._call(self._servicer.DrainReplica, request)

    async def undrain(self, replica_id: str) -> dict[str, Any]:
        request = control_pb2.UndrainReplicaRequest(replica_id=replica_id)
        return await self._call(self._servicer.UndrainReplica, request)
