"""The ``grpc.health.v1.Health`` servicer every Halcyon server exposes, and its probe port.

What it decides: the serving status per health name, answered to ``Check`` and streamed to
``Watch``, on the server's own port and optionally on a probe port (:class:`ProbeServer`).

Why not ``grpc_health.v1.health.aio.HealthServicer`` as is: its ``set`` is a
coroutine, so a status change would land some loop iterations later; readiness must flip the
moment the host says so (a probe right after ``set_ready(False)`` must see NOT_SERVING). Here
``set`` is synchronous and wakes watchers through a per-name ``asyncio.Event`` that is replaced
on every change.

:class:`ProbeServer` answers the same names on a separate port from gRPC's own threads (a sync
``grpc.server`` with the library's thread-safe ``grpc_health`` servicer), not from the event
loop: a saturated loop cannot delay a Kubernetes probe past its timeout, and a wedged loop
still gets its liveness answered NOT_SERVING (``common.liveness`` judges it). Plaintext only:
the kubelet's gRPC probes speak no TLS, so bind it where only the kubelet reaches. Bytes that do
not parse as a ``HealthCheckRequest`` are answered as on the main port: ``INVALID_ARGUMENT``
with the decode guard's typed reason (:func:`common.decode_guard.guard_sync_handler`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.decode_guard import guard_sync_handler

__all__ = ["NOT_SERVING", "SERVING", "HealthService", "ProbeServer"]

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
_SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthService(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Health statuses settable synchronously; ``Check`` answers NOT_FOUND for unknown names."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._frozen = False

    def set(self, service: str, status: int) -> None:
        """Set ``service``'s status now; ignored after :meth:`shutdown`."""
        if self._frozen or self._status.get(service) == status:
            return
        self._status[service] = status
        event = self._changed.pop(service, None)
        if event is not None:
            event.set()

    def get(self, service: str) -> int | None:
        return self._status.get(service)

    def shutdown(self) -> None:
        """Every name NOT_SERVING, permanently (the server is going away)."""
        for service in list(self._status):
            self.set(service, NOT_SERVING)
        self._frozen = True

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = None
        while True:
            # Take the event before reading the status, so a change in between is not lost.
            event = self._changed.setdefault(request.service, asyncio.Event())
            status = self._status.get(request.service, _SERVICE_UNKNOWN)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await event.wait()


class _Guarded(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose method handlers are guarded by ``guard_sync_handler``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._built: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        built = self._built.get(method)
        if built is None or built[0] is not handler:
            built = self._built[method] = (handler, guard_sync_handler(method, handler))
        return built[1]


class _GuardedRegistration:
    """What ``add_HealthServicer_to_server`` sees: its generic handlers are guarded (and its
    registered-method form dropped, which would bypass them)."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(tuple(_Guarded(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass  # the guarded generic handlers serve the same methods


class ProbeServer:
    """``grpc.health.v1`` on its own port, answered by gRPC's thread pool (thread-safe ``set``)."""

    def __init__(self, listen: str) -> None:
        self._servicer = health.HealthServicer(
            experimental_non_blocking=True,
            experimental_thread_pool=futures.ThreadPoolExecutor(1, thread_name_prefix="probe-w"),
        )
        self._server = grpc.server(
            futures.ThreadPoolExecutor(2, thread_name_prefix="probe"),
            options=[("grpc.so_reuseport", 0)],
        )
        health_pb2_grpc.add_HealthServicer_to_server(
            self._servicer, _GuardedRegistration(self._server)
        )
        try:
            self.port: int = self._server.add_insecure_port(listen)
        except RuntimeError as exc:
            raise OSError(f"cannot bind the health probe port {listen}: {exc}") from exc
        if self.port == 0:
            raise OSError(f"cannot bind the health probe port {listen}")
        self._server.start()

    def set(self, service: str, status: int) -> None:
        """Any thread; ignored after :meth:`shutdown`."""
        self._servicer.set(service, status)

    def shutdown(self) -> None:
        """Every name NOT_SERVING, permanently (the server is going away)."""
        self._servicer.enter_graceful_shutdown()

    def stop(self) -> None:
        """Close the port (blocks until gRPC has; call it off the loop)."""
        self._server.stop(None).wait(5.0)
