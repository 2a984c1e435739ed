"""ServiceHost: binding, health names, ready file, /metrics, graceful shutdown."""

from __future__ import annotations

import asyncio
import json
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
    ServiceHost,
    ServingOptions,
    add_serving_arguments,
    format_hostport,
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
    with pytest.raises(OSError, match="cannot bind"):
        await second.start()
    await second.stop(0)


async def test_serve_until_signal_runs_shutdown_in_order(make_host: Any) -> None:
    host = await make_host()
    host.set_ready(True)
    seen: list[str] = []

    async def on_shutdown() -> None:
        seen.append(f"on_shutdown ready={host.ready}")

    serving = asyncio.create_task(host.serve_until_signal(on_shutdown))
    await asyncio.sleep(0)
    assert not serving.done()
    host.request_shutdown()
    await asyncio.wait_for(serving, 10)
    assert seen == ["on_shutdown ready=False"]
    # Stopped: new calls fail.
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        with pytest.raises(grpc.aio.AioRpcError):
            await _status(ch, "liveness")


async def test_stop_waits_for_in_flight_calls_within_grace(
    make_host: Any, echo: SimpleNamespace
) -> None:
    host = await make_host()
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        call = echo.unary(ch)(b"slow")
        health = health_pb2_grpc.HealthStub(ch)
        await health.Check(health_pb2.HealthCheckRequest(service="liveness"))
        await host.stop(0.05)  # the slow call cannot finish: cancelled after the grace
        with pytest.raises(grpc.aio.AioRpcError):
            await call


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
    tls = serving_options_from_args(
        parser.parse_args(["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"])
    )
    assert tls.tls is not None and tls.tls.client_ca == Path("ca.pem")
    with pytest.raises(SystemExit):
        serving_options_from_args(parser.parse_args(["--tls-cert", "c.pem"]))


def test_host_must_be_built_inside_a_loop() -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        ServiceHost("x", ServingOptions(), None)
