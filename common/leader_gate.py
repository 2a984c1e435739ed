"""Only the leader acts: a standby's calls are refused NOT_LEADER, pointing at the leader.

What it decides: which calls a standby controller (issue #22, ``controller.leadership``)
answers, in one place for every method and both transports — a layer of the unary pipeline
(``common.pipeline``) and a server interceptor for streaming calls, added to the host with
``ServiceHost.add_layer``. While standing by only the methods ``passes`` names go on (health,
reflection and the read-only ``GetState``); every other call — operator writes, worker
sessions, fleet watches, outcome reports — is refused ``UNAVAILABLE`` with reason
``NOT_LEADER``, ErrorInfo metadata ``leader`` = the leader's advertised address when known,
and RetryInfo 1 s, so clients move to the leader. :meth:`LeaderGate.lead` opens the gate for
good: leadership is never handed back inside a process (a lost lock ends the process).

Cost while leading: one attribute test per call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any

import grpc
import grpc.aio

from common.call import UnaryCall, Verdict
from common.errors import Reason, RichError, abort, unavailable
from common.handlers import same_kind_handler
from common.host_layers import HostLayer

__all__ = ["LEADER_KEY", "RETRY_AFTER_S", "LeaderGate"]

LEADER_KEY = "leader"  # the ErrorInfo metadata key naming the leader's address
RETRY_AFTER_S = 1.0
_ALWAYS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class LeaderGate(HostLayer):
    """Standing by: calls other than ``passes`` are refused NOT_LEADER. Leading: all pass."""

    def __init__(self, passes: Collection[str], leader: Callable[[], str | None]) -> None:
        """``passes``: full method names a standby serves; ``leader``: the leader's address as
        last known (must not block: it is read on the event loop)."""
        self._passes = frozenset(passes)
        self._leader = leader
        self.leading = False

    def lead(self) -> None:
        self.leading = True

    def _passes_method(self, method: str) -> bool:
        return method in self._passes or method.startswith(_ALWAYS)

    def refusal(self) -> RichError:
        leader = self._leader()
        where = f"the leader is {leader}" if leader else "no leader is known yet"
        err = unavailable(
            Reason.NOT_LEADER, f"this controller is a standby; {where}", RETRY_AFTER_S
        )
        if leader:
            err.metadata[LEADER_KEY] = leader
        return err

    def admit(self, call: UnaryCall) -> Verdict:
        if self.leading or self._passes_method(call.method):
            return None
        return self.refusal()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or self.leading or self._passes_method(handler_call_details.method):
            return handler
        return same_kind_handler(handler, self._refuse)

    async def _refuse(self, _request: Any, context: grpc.aio.ServicerContext) -> None:
        await abort(context, self.refusal())
