"""A bounded connection age: the server sends GOAWAY to old connections and clients reconnect.

Without it an HTTP/2 client keeps its first connection for ever, so gateway replicas added
later get none of the existing clients' load (issue 13).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import grpc
import grpc.aio

from common.serving import (
    ServiceHost,
    ServingOptions,
    add_serving_arguments,
    server_options,
    serving_options_from_args,
)

PEER_SERVICE = "halcyon.test.Peer"


def _identity(x: bytes) -> bytes:
    return x


async def _peer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return context.peer().encode()


def _register(_servicer: Any, server: grpc.aio.Server) -> None:
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                PEER_SERVICE,
                {
                    "Who": grpc.unary_unary_rpc_method_handler(
                        _peer, request_deserializer=_identity, response_serializer=_identity
                    )
                },
            ),
        )
    )


async def _peers_seen(options: ServingOptions, seconds: float) -> set[bytes]:
    """The client addresses one channel showed the server while calling for ``seconds``."""
    host = ServiceHost("age", options, None)
    host.add_service(_register, None, PEER_SERVICE)
    await host.start()
    peers: set[bytes] = set()
    try:
        async with grpc.aio.insecure_channel(host.grpc_address) as channel:
            who = channel.unary_unary(
                f"/{PEER_SERVICE}/Who",
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            loop = asyncio.get_running_loop()
            until = loop.time() + seconds
            while loop.time() < until and len(peers) < 3:
                peers.add(await who(b"", timeout=5, wait_for_ready=True))
                await asyncio.sleep(0.05)
    finally:
        await host.stop(0)
    return peers


async def test_connections_older_than_the_age_are_replaced() -> None:
    options = ServingOptions(
        listen="127.0.0.1:0",
        metrics_listen=None,
        max_connection_age_s=0.4,
        max_connection_age_grace_s=0.2,
    )
    # Each new connection comes from a new client port: three means two GOAWAYs followed.
    assert len(await _peers_seen(options, seconds=6.0)) >= 3


async def test_without_an_age_the_client_keeps_its_connection() -> None:
    options = ServingOptions(listen="127.0.0.1:0", metrics_listen=None)
    assert len(await _peers_seen(options, seconds=1.5)) == 1


def test_the_flags_set_the_core_options() -> None:
    parser = argparse.ArgumentParser()
    add_serving_arguments(
        parser,
        default_listen="127.0.0.1:1",
        default_metrics_listen="off",
        default_max_connection_age=300.0,
    )
    defaults = dict(server_options(serving_options_from_args(parser.parse_args([]))))
    assert defaults["grpc.max_connection_age_ms"] == 300_000
    assert defaults["grpc.max_connection_age_grace_ms"] == 30_000
    never = dict(
        server_options(serving_options_from_args(parser.parse_args(["--max-connection-age", "0"])))
    )
    assert "grpc.max_connection_age_ms" not in never
    tuned = serving_options_from_args(
        parser.parse_args(["--max-connection-age", "60", "--max-connection-age-grace", "5"])
    )
    assert dict(server_options(tuned))["grpc.max_connection_age_grace_ms"] == 5_000
