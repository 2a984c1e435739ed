"""grpc_server_* / grpc_client_* metrics: names, labels, Go-style codes, every handler kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
import pytest
from prometheus_client import CollectorRegistry

from common.grpc_metrics import ClientMetricsInterceptors, GrpcClientMetrics, code_name


def _value(host: Any, name: str, **labels: str) -> float:
    v = host.registry.get_sample_value(name, labels)
    return 0.0 if v is None else float(v)


def _handled(host: Any, service: str, method: str, kind: str, code: str) -> float:
    return _value(
        host,
        "grpc_server_handled_total",
        grpc_service=service,
        grpc_method=method,
        grpc_type=kind,
        grpc_code=code,
    )


def test_code_names_are_go_style() -> None:
    assert code_name(grpc.StatusCode.OK) == "OK"
    assert code_name(None) == "OK"
    assert code_name(grpc.StatusCode.RESOURCE_EXHAUSTED) == "ResourceExhausted"
    assert code_name(grpc.StatusCode.CANCELLED) == "Canceled"
    assert code_name(grpc.StatusCode.DEADLINE_EXCEEDED) == "DeadlineExceeded"
    assert code_name(14) == "Unavailable"
    names = {code_name(c) for c in grpc.StatusCode}
    assert len(names) == len(grpc.StatusCode)  # one distinct name per code
    assert all(n[0].isupper() and "_" not in n for n in names)


async def test_unary_codes_from_return_abort_set_code_and_exception(
    make_host: Any, echo: SimpleNamespace
) -> None:
    host = await make_host()
    svc = echo.service
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        assert await echo.unary(ch)(b"ok") == b"ok"
        for request, code in (
            (b"abort", "RESOURCE_EXHAUSTED"),
            (b"setcode", "NOT_FOUND"),
            (b"boom", "INTERNAL"),  # the pipeline's error mapping: a bug is typed INTERNAL
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await echo.unary(ch)(request)
            assert info.value.code().name == code
    assert _handled(host, svc, "Unary", "unary", "OK") == 1
    assert _handled(host, svc, "Unary", "unary", "ResourceExhausted") == 1
    assert _handled(host, svc, "Unary", "unary", "NotFound") == 1
    assert _handled(host, svc, "Unary", "unary", "Internal") == 1
    assert (
        _value(
            host,
            "grpc_server_started_total",
            grpc_service=svc,
            grpc_method="Unary",
            grpc_type="unary",
        )
        == 4
    )
    assert (
        _value(
            host,
            "grpc_server_msg_received_total",
            grpc_service=svc,
            grpc_method="Unary",
            grpc_type="unary",
        )
        == 4
    )
    assert (
        _value(
            host,
            "grpc_server_msg_sent_total",
            grpc_service=svc,
            grpc_method="Unary",
            grpc_type="unary",
        )
        == 1
    )
    assert (
        _value(
            host,
            "grpc_server_handling_seconds_count",
            grpc_service=svc,
            grpc_method="Unary",
            grpc_type="unary",
        )
        == 4
    )


async def test_stream_kinds_count_messages_and_codes(make_host: Any, echo: SimpleNamespace) -> None:
    host = await make_host()
    svc = echo.service

    async def three() -> Any:
        for part in (b"a", b"b", b"c"):
            yield part

    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        assert [m async for m in echo.server_stream(ch)(b"x")] == [b"x0", b"x1", b"x2"]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in echo.server_stream(ch)(b"abort"):
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await echo.client_stream(ch)(three()) == b"abc"
        assert [m async for m in echo.bidi(ch)(three())] == [b"A", b"B", b"C"]

    assert _handled(host, svc, "ServerStream", "server_stream", "OK") == 1
    assert _handled(host, svc, "ServerStream", "server_stream", "Unavailable") == 1
    assert (
        _value(
            host,
            "grpc_server_msg_sent_total",
            grpc_service=svc,
            grpc_method="ServerStream",
            grpc_type="server_stream",
        )
        == 6
    )
    assert _handled(host, svc, "ClientStream", "client_stream", "OK") == 1
    assert (
        _value(
            host,
            "grpc_server_msg_received_total",
            grpc_service=svc,
            grpc_method="ClientStream",
            grpc_type="client_stream",
        )
        == 3
    )
    assert _handled(host, svc, "Bidi", "bidi_stream", "OK") == 1
    assert (
        _value(
            host,
            "grpc_server_msg_received_total",
            grpc_service=svc,
            grpc_method="Bidi",
            grpc_type="bidi_stream",
        )
        == 3
    )
    assert (
        _value(
            host,
            "grpc_server_msg_sent_total",
            grpc_service=svc,
            grpc_method="Bidi",
            grpc_type="bidi_stream",
        )
        == 3
    )


async def test_cancelled_and_deadline_exceeded_calls(
    make_host: Any, echo: SimpleNamespace, wait_until: Any
) -> None:
    host = await make_host()
    svc = echo.service
    async with grpc.aio.insecure_channel(host.grpc_address) as ch:
        call = echo.unary(ch)(b"slow")
        await wait_until(
            lambda: (
                _value(
                    host,
                    "grpc_server_started_total",
                    grpc_service=svc,
                    grpc_method="Unary",
                    grpc_type="unary",
                )
                == 1
            )
        )
        call.cancel()
        await wait_until(lambda: _handled(host, svc, "Unary", "unary", "Canceled") == 1)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await echo.unary(ch)(b"slow", timeout=0.05)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_until(lambda: _handled(host, svc, "Unary", "unary", "DeadlineExceeded") == 1)


async def test_client_interceptor_counts_codes(
    make_host: Any, echo: SimpleNamespace, wait_until: Any
) -> None:
    host = await make_host()
    registry = CollectorRegistry()
    interceptors = ClientMetricsInterceptors(GrpcClientMetrics(registry)).all()

    def value(name: str, **labels: str) -> float:
        v = registry.get_sample_value(name, {"grpc_service": echo.service, **labels})
        return 0.0 if v is None else float(v)

    async def one() -> Any:
        yield b"a"

    async with grpc.aio.insecure_channel(host.grpc_address, interceptors=interceptors) as ch:
        assert await echo.unary(ch)(b"ok") == b"ok"
        with pytest.raises(grpc.aio.AioRpcError):
            await echo.unary(ch)(b"abort")
        assert [m async for m in echo.server_stream(ch)(b"x")] == [b"x0", b"x1", b"x2"]
        assert await echo.client_stream(ch)(one()) == b"a"
        assert [m async for m in echo.bidi(ch)(one())] == [b"A"]
        await wait_until(
            lambda: (
                value(
                    "grpc_client_handled_total",
                    grpc_method="Bidi",
                    grpc_type="bidi_stream",
                    grpc_code="OK",
                )
                == 1
            )
        )
    labels = {"grpc_method": "Unary", "grpc_type": "unary"}
    assert value("grpc_client_started_total", **labels) == 2
    assert value("grpc_client_handled_total", grpc_code="OK", **labels) == 1
    assert value("grpc_client_handled_total", grpc_code="ResourceExhausted", **labels) == 1
    assert value("grpc_client_handling_seconds_count", **labels) == 2
    assert (
        value(
            "grpc_client_handled_total",
            grpc_method="ServerStream",
            grpc_type="server_stream",
            grpc_code="OK",
        )
        == 1
    )
    assert (
        value(
            "grpc_client_handled_total",
            grpc_method="ClientStream",
            grpc_type="client_stream",
            grpc_code="OK",
        )
        == 1
    )
