"""ServiceHost: binding, health names, ready file, /metrics, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from common.serving import (
    DEFAULT_DRAIN_DELAY_S,
    ServiceHost,
    ServingOptions,
    add_serving_arguments,
    format_hostport,
    outgoing_tls_from_args,
    parse_hostport,
    serving_options_from_args,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(ch: grpc.aio.Channel, service: str) -> int:
    reply = await health_pb2_grpc.HealthStub(ch).Check(
        health_pb2.HealthCheckRequest(service=service)
    )
    return int(reply.status)


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def test_liveness_serving_readiness_follows_set_ready(
    make_host: Any, echo: SimpleNamespace
) -> None:
    host = await make_host()
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        assert await _status(ch, "liveness") == SERVING
        for name in ("readiness", "", echo.service):
            assert await _status(ch, name) == NOT_SERVING
        host.set_ready(True)
        for name in ("readiness", "", echo.service):
            assert await _status(ch, name) == SERVING
        host.set_ready(False)
        assert await _status(ch, "readiness") == NOT_SERVING
        assert await _status(ch, "liveness") == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _status(ch, "no.such.Service")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_streams_readiness_changes(make_host: Any) -> None:
    host = await make_host()
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        call = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(service="readiness")
        )
        first = await asyncio.wait_for(call.read(), 5)
        assert first.status == NOT_SERVING
        host.set_ready(True)
        second = await asyncio.wait_for(call.read(), 5)
        assert second.status == SERVING
        call.cancel()


async def test_ready_file_and_metrics_endpoint(make_host: Any, tmp_path: Path) -> None:
    ready = tmp_path / "sub" / "ready.json"
    host = await make_host(options=ServingOptions(ready_file=ready))
    payload = json.loads(ready.read_text())
    assert payload["grpc"] == host.grpc_address
    assert payload["metrics"] == host.metrics_address
    assert isinstance(payload["pid"], int)
    assert host.grpc_port > 0 and host.metrics_port
    assert not list(ready.parent.glob(".*tmp"))  # written via a temp file, renamed
    text = await asyncio.to_thread(_scrape, host.metrics_address)
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "grpc_server_started", "grpc_server_handled"} <= names


async def test_metrics_can_be_turned_off(make_host: Any) -> None:
    host = await make_host(options=ServingOptions(metrics_listen=None))
    assert host.metrics_port is None and host.metrics_address is None


async def test_a_taken_port_fails_loudly(make_host: Any) -> None:
    first = await make_host()
    second = ServiceHost("dup", ServingOptions(listen=first.grpc_address), None)
    # The error says which process holds the port (here: this one).
    with pytest.raises(OSError, match=rf"cannot bind.*held by pid {os.getpid()} \("):
        await second.start()
    await second.stop(0)
    third = ServiceHost(
        "dup", ServingOptions(listen="127.0.0.1:0", metrics_listen=first.metrics_address), None
    )
    with pytest.raises(OSError, match=rf"cannot bind /metrics.*held by pid {os.getpid()} \("):
        await third.start()
    await third.stop(0)


async def test_drain_delay_keeps_serving_with_readiness_off(
    make_host: Any, echo: SimpleNamespace
) -> None:
    host = await make_host(options=ServingOptions(drain_delay_s=0.5, metrics_listen=None))
    host.set_ready(True)
    stopped: list[float] = []

    async def on_shutdown() -> None:
        stopped.append(asyncio.get_running_loop().time())

    serving = asyncio.create_task(host.serve_until_signal(on_shutdown))
    await asyncio.sleep(0)
    asked = asyncio.get_running_loop().time()
    host.request_shutdown()
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        await asyncio.sleep(0.05)
        assert await _status(ch, "readiness") == NOT_SERVING
        assert await _status(ch, "liveness") == SERVING
        host.set_ready(True)  # e.g. a fleet update arriving while draining: ignored
        assert await _status(ch, "readiness") == NOT_SERVING
        assert await echo.unary(ch)(b"ok") == b"ok"  # still serving calls
        assert not stopped
    await asyncio.wait_for(serving, 10)
    assert stopped and stopped[0] - asked >= 0.45


async def test_a_second_request_cuts_the_drain_delay_and_the_grace(
    make_host: Any, echo: SimpleNamespace
) -> None:
    host = await make_host(
        options=ServingOptions(drain_delay_s=60.0, grace_s=60.0, metrics_listen=None)
    )
    hook: list[str] = []

    async def on_shutdown() -> None:
        hook.append("started")
        await asyncio.Event().wait()  # a drain hook that would take the whole grace

    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        slow = asyncio.ensure_future(echo.unary(ch)(b"slow"))
        serving = asyncio.create_task(host.serve_until_signal(on_shutdown))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        host.request_shutdown()
        await asyncio.sleep(0.2)
        assert not serving.done()  # in the 60 s drain delay
        started = loop.time()
        host.request_shutdown()  # skips the rest of the delay, the hook and the grace
        await asyncio.wait_for(serving, 5)
        assert loop.time() - started < 2.0
        with pytest.raises(grpc.aio.AioRpcError):
            await slow


def test_hostport_parsing() -> None:
    assert parse_hostport("127.0.0.1:50060") == ("127.0.0.1", 50060)
    assert parse_hostport("[::1]:0") == ("::1", 0)
    assert format_hostport("::1", 5) == "[::1]:5"
    assert format_hostport("localhost", 5) == "localhost:5"
    for bad in ("nohost", ":80", "h:x", "h:70000"):
        with pytest.raises(ValueError):
            parse_hostport(bad)


def test_serving_flags_build_options(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_serving_arguments(
        parser, default_listen="127.0.0.1:1", default_metrics_listen="127.0.0.1:2"
    )
    defaults = serving_options_from_args(parser.parse_args([]))
    assert defaults.listen == "127.0.0.1:1" and defaults.metrics_listen == "127.0.0.1:2"
    assert defaults.tls is None
    off = serving_options_from_args(
        parser.parse_args(["--metrics-listen", "off", "--shutdown-grace", "3"])
    )
    assert off.metrics_listen is None and off.grace_s == 3.0
    assert defaults.drain_delay_s == DEFAULT_DRAIN_DELAY_S == 5.0
    assert outgoing_tls_from_args(parser.parse_args([])) is None
    # Server-only TLS that verifies its peers against a private CA: no client certificates.
    server_only = parser.parse_args(
        ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem", "--drain-delay", "0"]
    )
    tls = serving_options_from_args(server_only)
    assert tls.tls is not None and tls.tls.client_ca is None and tls.drain_delay_s == 0.0
    outgoing = outgoing_tls_from_args(server_only)
    assert outgoing is not None and outgoing.ca == Path("ca.pem") and outgoing.cert == Path("c.pem")
    # Mutual TLS on incoming calls.
    mutual = serving_options_from_args(
        parser.parse_args(
            ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "clients.pem"]
        )
    )
    assert mutual.tls is not None and mutual.tls.client_ca == Path("clients.pem")
    # A plaintext server may still verify the TLS servers it calls.
    calling = outgoing_tls_from_args(parser.parse_args(["--tls-ca", "ca.pem"]))
    assert calling is not None and calling.cert is None and calling.ca == Path("ca.pem")
    with pytest.raises(SystemExit):
        serving_options_from_args(parser.parse_args(["--tls-cert", "c.pem"]))
    with pytest.raises(SystemExit, match="--tls-client-ca"):
        serving_options_from_args(parser.parse_args(["--tls-client-ca", "clients.pem"]))


def test_host_must_be_built_inside_a_loop() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        ServiceHost("x", ServingOptions(), None)
