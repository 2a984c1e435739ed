"""Calls that arrive while a server's loop is busy are held for it, not dropped by gRPC core.

gRPC core keeps calls the application has not yet taken in a queue, and by default drops new
ones at random with a bare ``CANCELLED`` once that queue passes 1,000 — before any handler,
admission or metric sees them. A retry storm lost thousands of requests that way (ADR 0017).
Here the server's loop is blocked while 2,500 calls arrive: every one must get its answer.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

import grpc
import grpc.aio

from common.serving import ServiceHost, ServingOptions

SERVICE = "halcyon.test.Pending"
CALLS = 2500


def _identity(x: bytes) -> bytes:
    return x


async def _block(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    # Deliberately blocks the event loop, as a loop saturated by work would: no call is taken
    # from gRPC core until it returns.
    time.sleep(1.5)  # noqa: ASYNC251
    return b"blocked"


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


def _register(_servicer: Any, server: grpc.aio.Server) -> None:
    handler = grpc.unary_unary_rpc_method_handler
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "Block": handler(
                        _block, request_deserializer=_identity, response_serializer=_identity
                    ),
                    "Echo": handler(
                        _echo, request_deserializer=_identity, response_serializer=_identity
                    ),
                },
            ),
        )
    )


def _burst(address: str) -> collections.Counter[str]:
    """Blocks the server's loop with one call, then sends CALLS while it is blocked."""
    outcomes: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    done = threading.Event()
    with grpc.insecure_channel(address) as channel:
        block = channel.unary_unary(f"/{SERVICE}/Block")
        echo = channel.unary_unary(f"/{SERVICE}/Echo")
        block.future(b"", timeout=30).add_done_callback(lambda f: None)
        time.sleep(0.3)  # the Block call is in its handler, holding the loop

        def record(future: grpc.Future) -> None:
            err = future.exception()
            with lock:
                outcomes["OK" if err is None else err.code().name] += 1
                if sum(outcomes.values()) == CALLS:
                    done.set()

        for _ in range(CALLS):
            echo.future(b"x", timeout=30).add_done_callback(record)
        done.wait(60)
    return outcomes


async def test_calls_arriving_while_the_loop_is_blocked_are_all_answered() -> None:
    host = ServiceHost("pending", ServingOptions(listen="127.0.0.1:0", metrics_listen=None), None)
    host.add_service(_register, None, SERVICE)
    await host.start()
    try:
        outcomes = await asyncio.to_thread(_burst, host.grpc_address)
    finally:
        await host.stop(0)
    assert outcomes == {"OK": CALLS}, outcomes
