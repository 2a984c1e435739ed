"""The last moment before a server stops: new calls are held, and answered once the stop began.

What it decides: how a server avoids having calls *pending* in gRPC's transport when it stops.
gRPC core ends a call that reached the transport but was never matched to a requested call
with a bare ``CANCELLED`` when the server stops (grpc/grpc#41785): its client gets no answer at
all. ``grpc.aio`` requests one call at a time, so under load most in-flight calls are pending:
a gateway stopping under 32 closed-loop clients lost 30 of their requests that way.

Without gRPC internals the only cure is that arrivals stop before the stop. Clients that
balance with health checks on ``readiness`` leave during the drain delay (README: Deploy on
Kubernetes). The others — ``pick_first`` clients, which move only on the GOAWAY the stop sends
— keep sending to the end. For them :class:`StopGate`, once closed (after the application
stopped taking new work), holds every new call instead of answering it: a held call is matched,
so it is not pending, and costs nothing. A closed-loop client whose call is held sends no
other, so arrivals stop and the pending queue empties into held calls; the host waits for that
(:meth:`StopGate.quiet`: no new call for a moment, bounded), starts the server's stop — GOAWAY,
so the clients' next calls go elsewhere — and then :meth:`StopGate.release` answers every held
call ``UNAVAILABLE / SHUTTING_DOWN``; a held call whose deadline comes first is answered just
before it. :meth:`StopGate.admit` decides and holds, for unary calls on either transport as a
layer of the unary pipeline (``common.pipeline``), and for streaming calls ``grpc.aio`` serves
through the gate's server interceptor. Health checks are never held (the host leaves the gate
out of their pipelines, the interceptor passes them): they are answered (NOT_SERVING by then)
and do not count as arrivals.

Cost while open: one attribute test per unary call, one interceptor step per streaming call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
import grpc.aio

from common.call import HELD, Verdict
from common.errors import Reason, RichError, abort, unavailable
from common.handlers import same_kind_handler
from common.pipeline import Layer

__all__ = ["StopGate"]

_NEVER_HELD = "/grpc.health.v1.Health/"
# A held call is answered this long before its deadline at the latest, so the answer reaches
# the client before the client's own deadline fires.
ANSWER_BEFORE_DEADLINE_S = 0.02


class Holdable(Protocol):
    """What the gate needs of a call it holds (a :class:`common.call.UnaryCall` has it)."""

    def time_remaining(self) -> float | None: ...

    def reject(self, err: RichError) -> None: ...


class StopGate(Layer, grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Open: calls pass. Closed: new calls are held until :meth:`release`, then refused."""

    def __init__(self, server_name: str) -> None:
        self._refusal: RichError = unavailable(
            Reason.SHUTTING_DOWN,
            f"the {server_name} is shutting down; send the call to another {server_name}",
            None,
        )
        self._closed = False
        self._released = asyncio.Event()
        self.held = 0  # calls held since the gate closed
        self._last_arrival = 0.0  # loop time of the last held call (or of the closing)
        # Unary calls held, each with the timer that answers it before its deadline.
        self._held: dict[Holdable, asyncio.TimerHandle | None] = {}

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Hold every new call from now on (on the loop)."""
        if not self._closed:
            self._closed = True
            self._last_arrival = asyncio.get_running_loop().time()

    async def quiet(self, quiet_s: float, limit_s: float) -> None:
        """Close the gate, then return once no new call has arrived for ``quiet_s`` (the
        pending queue has emptied into held calls), or ``limit_s`` after closing at most."""
        self.close()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + limit_s
        while True:
            now = loop.time()
            wake = min(self._last_arrival + quiet_s, give_up)
            if now >= wake:
                return
            await asyncio.sleep(wake - now)

    def release(self) -> None:
        """Answer every held call, and any later one at once (call after the stop began)."""
        self._closed = True
        self._released.set()
        held, self._held = self._held, {}
        for call, timer in held.items():
            if timer is not None:
                timer.cancel()
            call.reject(self._refusal)

    def admit(self, call: Holdable) -> Verdict:
        """The pipeline's stop gate: open, the call goes on; closed, it is held (and answered
        at the release, or just before its deadline); released, it is refused at once."""
        if not self._closed:
            return None
        if self._released.is_set():
            return self._refusal
        loop = asyncio.get_running_loop()
        self.held += 1
        self._last_arrival = loop.time()
        left = call.time_remaining()
        self._held[call] = (
            None
            if left is None
            else loop.call_later(max(0.0, left - ANSWER_BEFORE_DEADLINE_S), self._answer, call)
        )
        return HELD

    def _answer(self, call: Holdable) -> None:
        """A held call's deadline is near: answer it now."""
        if self._held.pop(call, False) is not False:
            call.reject(self._refusal)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if not self._closed:
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_NEVER_HELD):
            return handler
        return same_kind_handler(handler, self._hold)

    async def _hold(self, _request: Any, context: grpc.aio.ServicerContext) -> None:
        """A streaming call, held by :meth:`admit` like a unary one."""
        call = _HeldStream(context)
        verdict = self.admit(call)
        await abort(context, verdict if isinstance(verdict, RichError) else await call.answer)


class _HeldStream:
    """A streaming call as :meth:`StopGate.admit` holds it: its deadline, and its one answer."""

    __slots__ = ("_context", "answer")

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.answer: asyncio.Future[RichError] = asyncio.get_running_loop().create_future()

    def time_remaining(self) -> float | None:
        left: float | None = self._context.time_remaining()
        return left

    def reject(self, err: RichError) -> None:
        if not self.answer.done():
            self.answer.set_result(err)
