"""Keepalive holds for a call that sends no data for many ping intervals (common.keepalive):
the project's server options accept the pings its channel options send; a server with gRPC's
default policy cuts the same call with GOAWAY too_many_pings."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio
import pytest

from common import keepalive
from common.keepalive import KeepalivePolicy, policy_from_env
from common.serving import ServingOptions, server_options

# The client pings this often (gRPC core spaces keepalive pings at least ~1 s apart anyway).
INTERVAL_S = 1.0
# Seven ping intervals without a byte of data; a strict server cuts the call after ~4-5 s
# (the first ping is free, two more are strikes, the fourth is answered with GOAWAY).
CALL_S = 7.0


async def _slow(request: bytes, context: Any) -> bytes:
    await asyncio.sleep(CALL_S)
    return b"done"


async def _call_through(server_policy: KeepalivePolicy) -> tuple[str, float]:
    """One CALL_S call from a channel with the fast policy to a server with ``server_policy``;
    its outcome ("OK" or the status and details) and how long it took."""
    server = grpc.aio.server(
        options=server_options(ServingOptions(metrics_listen=None, keepalive=server_policy))
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Slow", {"Call": grpc.unary_unary_rpc_method_handler(_slow)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        options = KeepalivePolicy(interval_s=INTERVAL_S, timeout_s=5.0).client_options()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            started = time.monotonic()
            try:
                reply = await channel.unary_unary("/test.Slow/Call")(b"x", timeout=10)
            except grpc.aio.AioRpcError as err:
                return f"{err.code().name}: {err.details()}", time.monotonic() - started
            assert reply == b"done"
            return "OK", time.monotonic() - started
    finally:
        await server.stop(0)


async def test_a_call_longer_than_many_ping_intervals_completes() -> None:
    outcome, took = await _call_through(KeepalivePolicy(interval_s=INTERVAL_S))
    assert outcome == "OK"
    assert took >= CALL_S


async def test_without_the_permissive_server_policy_the_same_call_is_cut() -> None:
    """The control: a server at gRPC's default (one ping per 5 min without data, 2 strikes)
    sends GOAWAY too_many_pings — what every long batch met before the policy."""
    strict = KeepalivePolicy(interval_s=600.0)  # accepts a ping per 300 s: gRPC's default
    outcome, took = await _call_through(strict)
    assert outcome.startswith("UNAVAILABLE"), outcome
    assert "ping" in outcome.lower(), outcome
    assert took < CALL_S


def test_both_sides_come_from_one_interval() -> None:
    policy = KeepalivePolicy(interval_s=20.0)
    client = dict(policy.client_options())
    server = dict(policy.server_options())
    assert client["grpc.keepalive_time_ms"] == 20_000
    assert client["grpc.http2.max_pings_without_data"] == 0  # pings however long a call runs
    assert (
        server["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"]
    )
    assert server["grpc.keepalive_permit_without_calls"] == 1
    # A third-party backend keeps gRPC's strict defaults: never more than two pings per spell.
    backend = dict(policy.backend_client_options())
    assert backend["grpc.http2.max_pings_without_data"] == 2
    assert backend["grpc.keepalive_permit_without_calls"] == 0


def test_the_interval_comes_from_the_environment_or_a_flag(monkeypatch: Any) -> None:
    assert policy_from_env({}).interval_s == keepalive.DEFAULT_INTERVAL_S
    assert policy_from_env({keepalive.KEEPALIVE_ENV: "1.5"}).interval_s == 1.5
    with pytest.raises(ValueError, match=keepalive.KEEPALIVE_ENV):
        policy_from_env({keepalive.KEEPALIVE_ENV: "soon"})
    with pytest.raises(ValueError):
        policy_from_env({keepalive.KEEPALIVE_ENV: "0"})
    monkeypatch.setattr(keepalive, "_configured", None)
    monkeypatch.setenv(keepalive.KEEPALIVE_ENV, "3")
    assert dict(keepalive.client_options())["grpc.keepalive_time_ms"] == 3000
    keepalive.configure(2.0)  # --keepalive-interval wins over the environment
    assert dict(keepalive.client_options())["grpc.keepalive_time_ms"] == 2000
    assert dict(keepalive.server_options())["grpc.http2.min_ping_interval_without_data_ms"] == 1000
