"""The layers an application adds to its host's pipeline (``ServiceHost.add_layer``).

What it decides: the shape of a concern that is not the host's own but must run on every call
of the application's services — the controller's leader gate (``common.leader_gate``) — and how
streaming calls get it: one :class:`HostLayer` is both a unary pipeline layer
(``common.pipeline``) and a ``grpc.aio`` server interceptor, so unary and streaming calls run
the same code. :class:`AddedInterceptors` stands in the host's interceptor chain from its
construction, so layers can be added after the server exists (before any service is).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from common.pipeline import Layer

__all__ = ["AddedInterceptors", "HostLayer"]


class HostLayer(Layer, grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """What :meth:`ServiceHost.add_layer` takes: one concern as a unary pipeline layer and as
    the interceptor that gives streaming calls the same."""


class AddedInterceptors(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The streaming side of the layers added with :meth:`ServiceHost.add_layer`, in order."""

    def __init__(self) -> None:
        self.chain: list[HostLayer] = []

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        for interceptor in reversed(self.chain):
            continuation = functools.partial(interceptor.intercept_service, continuation)
        return await continuation(handler_call_details)
