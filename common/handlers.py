"""gRPC method handlers rebuilt around another behaviour: the one place their kinds are told apart.

What it decides: how a server-side layer (the auth gate, the decode guard, the stop gate)
replaces what a method handler does while keeping what kind of method it is — unary or
streaming in each direction — and its serializers, so gRPC drives the new behaviour exactly
as it would have driven the old one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["behaviour_of", "same_kind_handler"]


def behaviour_of(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    """The function gRPC calls for ``handler`` (``unary_unary``, ``stream_unary``, ...)."""
    if handler.request_streaming and handler.response_streaming:
        behaviour = handler.stream_stream
    elif handler.request_streaming:
        behaviour = handler.stream_unary
    elif handler.response_streaming:
        behaviour = handler.unary_stream
    else:
        behaviour = handler.unary_unary
    assert behaviour is not None, "a method handler without a behaviour for its kind"
    return behaviour  # type: ignore[no-any-return]


def same_kind_handler(
    handler: grpc.RpcMethodHandler, behaviour: Callable[..., Any], **serializers: Any
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that runs ``behaviour``; its serializers are
    ``handler``'s unless ``request_deserializer`` / ``response_serializer`` are given."""
    kw: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
        **serializers,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behaviour, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behaviour, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behaviour, **kw)
    return grpc.unary_unary_rpc_method_handler(behaviour, **kw)
