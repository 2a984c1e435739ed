"""WorkerService over a real aio server and client: execution, backpressure, cancellation,
drain, faults, auth, health, metrics and tracing."""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from common.auth import bearer_metadata
from common.errors import PUSHBACK_KEY, Reason, parse_rpc_error
from common.serving import SERVING_PATH_ENV
from common.tracing import inject_metadata
from halcyon.v1 import worker_pb2

# Test workers: intercept 20 ms, 0.01 ms per token, no jitter (see conftest.worker_config).
LONG = 300_000  # tokens: a 3.02 s batch
RPC_TIMEOUT = 10.0


def model_s(tokens: int, intercept_ms: float = 20.0, ms_per_token: float = 0.01) -> float:
    return (intercept_ms + ms_per_token * tokens) / 1000.0


async def rpc_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


def grace(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


async def test_batch_returns_per_item_results_and_model_device_time(start_worker: Any) -> None:
    w = await start_worker()
    request = w.batch(("a", 100, 10), ("b", 200, 20))
    reply = await w.execute(request, timeout=RPC_TIMEOUT)
    assert reply.replica_id == f"worker-{w.app.host.grpc_port}"
    assert [r.id for r in reply.results] == ["a", "b"]
    assert [(r.input_tokens, r.output_tokens) for r in reply.results] == [(100, 10), (200, 20)]
    assert all(r.output for r in reply.results)
    assert reply.batch_tokens == 330
    device_s = reply.device_time.ToNanoseconds() / 1e9
    assert model_s(330) - 0.001 <= device_s <= model_s(330) + 0.1
    again = await w.execute(request, timeout=RPC_TIMEOUT)
    assert [r.output for r in again.results] == [r.output for r in reply.results]


async def test_speed_divides_device_time(start_worker: Any) -> None:
    w = await start_worker(speed=0.5, intercept_ms=40.0, ms_per_token=0.0)
    reply = await w.execute(w.batch(("a", 10, 10)), timeout=RPC_TIMEOUT)
    assert 0.079 <= reply.device_time.ToNanoseconds() / 1e9 <= 0.15


async def test_busy_is_answered_at_once_with_computed_retry_advice(
    start_worker: Any, wait_until: Any
) -> None:
    w = await start_worker(slots=1)
    running = asyncio.ensure_future(w.execute(w.batch(("long", LONG, 0)), timeout=RPC_TIMEOUT))
    await wait_until(lambda: w.app.slots.busy == 1)
    started = time.monotonic()
    err = await rpc_error(w.execute(w.batch(("short", 10, 10), batch_id="b2"), timeout=RPC_TIMEOUT))
    elapsed = time.monotonic() - started
    assert elapsed < 0.5  # refused at once, not after the running batch
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    rich = parse_rpc_error(err)
    assert rich.reason == Reason.REPLICA_BUSY
    assert rich.retry_after_s is not None
    # Predicted time until the running 3.02 s batch ends: computed, not a constant.
    assert model_s(LONG) - 1.0 < rich.retry_after_s <= model_s(LONG)
    trailers = dict(err.trailing_metadata() or ())
    assert int(trailers[PUSHBACK_KEY]) == math.ceil(rich.retry_after_s * 1000 - 1e-6)

    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://{w.app.host.metrics_address}/metrics").read()
    )
    samples = [s for f in text_string_to_metric_families(text.decode()) for s in f.samples]
    served = {"model": w.app.config.model, "version": w.app.config.version}
    handled = [
        s
        for s in samples
        if s.name == "grpc_server_handled_total"
        and s.labels
        == {
            "grpc_service": "halcyon.v1.WorkerService",
            "grpc_method": "ExecuteBatch",
            "grpc_type": "unary",
            "grpc_code": "ResourceExhausted",
        }
    ]
    assert [s.value for s in handled] == [1.0]
    busy = [
        s.value
        for s in samples
        if s.name == "halcyon_worker_batches_total" and s.labels == {**served, "outcome": "busy"}
    ]
    assert busy == [1.0]
    for name in ("halcyon_worker_busy_slots", "halcyon_worker_slots"):
        assert [(s.labels, s.value) for s in samples if s.name == name] == [(served, 1.0)]
    running.cancel()


async def test_cancelling_a_batch_frees_the_slot_at_once(
    start_worker: Any, wait_until: Any
) -> None:
    w = await start_worker(slots=1)
    call = w.execute(w.batch(("long", LONG, 0)), timeout=RPC_TIMEOUT)
    await wait_until(lambda: w.app.slots.busy == 1)
    started = time.monotonic()
    call.cancel()
    await wait_until(lambda: w.app.slots.busy == 0, timeout_s=2.0)
    assert time.monotonic() - started < 1.0  # far sooner than the 3 s batch would end
    reply = await w.execute(w.batch(("next", 10, 10), batch_id="b2"), timeout=RPC_TIMEOUT)
    assert [r.id for r in reply.results] == ["next"]
    registry = w.app.host.registry
    served = {"model": w.app.config.model, "version": w.app.config.version}
    batches = "halcyon_worker_batches_total"
    assert registry.get_sample_value(batches, {**served, "outcome": "cancelled"}) == 1
    assert registry.get_sample_value(batches, {**served, "outcome": "ok"}) == 1


async def test_drain_refuses_new_work_and_finishes_in_flight(
    start_worker: Any, wait_until: Any
) -> None:
    w = await start_worker(slots=2)
    in_flight = asyncio.ensure_future(
        w.execute(w.batch(("inflight", 30_000, 0)), timeout=RPC_TIMEOUT)  # 0.32 s
    )
    await wait_until(lambda: w.app.slots.busy == 1)
    drain = asyncio.ensure_future(
        w.stub.Drain(
            worker_pb2.DrainRequest(grace=grace(5)), metadata=w.metadata, timeout=RPC_TIMEOUT
        )
    )
    await wait_until(lambda: w.app.replica.draining)
    err = await rpc_error(w.execute(w.batch(("new", 10, 10), batch_id="b2"), timeout=RPC_TIMEOUT))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert parse_rpc_error(err).reason == Reason.REPLICA_DRAINING
    health = health_pb2_grpc.HealthStub(w.channel)
    readiness = await health.Check(health_pb2.HealthCheckRequest(service="readiness"))
    assert readiness.status == health_pb2.HealthCheckResponse.NOT_SERVING
    liveness = await health.Check(health_pb2.HealthCheckRequest(service="liveness"))
    assert liveness.status == health_pb2.HealthCheckResponse.SERVING
    reply = await in_flight
    assert [r.id for r in reply.results] == ["inflight"]
    result = await drain
    assert (result.batches_finished, result.batches_cancelled) == (1, 0)
    load = (await w.stub.Describe(worker_pb2.DescribeRequest(), metadata=w.metadata)).load
    assert load.draining and load.busy_slots == 0 and load.batches_total == 1
    # A second drain returns the first one's result.
    again = await w.stub.Drain(worker_pb2.DrainRequest(), metadata=w.metadata)
    assert (again.batches_finished, again.batches_cancelled) == (1, 0)


async def test_undrain_takes_work_again_and_a_later_drain_is_a_new_one(
    start_worker: Any, wait_until: Any
) -> None:
    w = await start_worker()
    assert not (await w.stub.Undrain(worker_pb2.UndrainRequest(), metadata=w.metadata)).was_draining
    await w.stub.Drain(worker_pb2.DrainRequest(grace=grace(1)), metadata=w.metadata)
    err = await rpc_error(w.execute(w.batch(("refused", 10, 10)), timeout=RPC_TIMEOUT))
    assert parse_rpc_error(err).reason == Reason.REPLICA_DRAINING

    reply = await w.stub.Undrain(worker_pb2.UndrainRequest(), metadata=w.metadata)
    assert reply.was_draining
    health = health_pb2_grpc.HealthStub(w.channel)
    readiness = await health.Check(health_pb2.HealthCheckRequest(service="readiness"))
    assert readiness.status == health_pb2.HealthCheckResponse.SERVING
    assert [r.id for r in (await w.execute(w.batch(("back", 10, 10)))).results] == ["back"]
    load = (await w.stub.Describe(worker_pb2.DescribeRequest(), metadata=w.metadata)).load
    assert not load.draining
    served = {"model": w.app.config.model, "version": w.app.config.version}
    assert w.app.host.registry.get_sample_value("halcyon_worker_draining", served) == 0

    # Drain again: a new drain (it counts this one's batches), not the first one's result.
    in_flight = asyncio.ensure_future(w.execute(w.batch(("second", 20_000, 0))))
    await wait_until(lambda: w.app.slots.busy == 1)
    again = await w.stub.Drain(worker_pb2.DrainRequest(grace=grace(5)), metadata=w.metadata)
    assert (again.batches_finished, again.batches_cancelled) == (1, 0)
    assert [r.id for r in (await in_flight).results] == ["second"]


async def test_undrain_is_refused_once_the_worker_is_stopping(start_worker: Any) -> None:
    w = await start_worker()
    await w.stub.Drain(worker_pb2.DrainRequest(grace=grace(1)), metadata=w.metadata)
    w.app._shutting_down = True  # what SIGTERM's drain sets before it deregisters
    err = await rpc_error(w.stub.Undrain(worker_pb2.UndrainRequest(), metadata=w.metadata))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    rich = parse_rpc_error(err)
    assert rich.reason == Reason.SHUTTING_DOWN and "start a new worker" in rich.message


async def test_drain_cancels_what_outlives_the_grace(start_worker: Any, wait_until: Any) -> None:
    w = await start_worker(hang_rate=1.0)
    hung = asyncio.ensure_future(w.execute(w.batch(("hang", 10, 10)), timeout=RPC_TIMEOUT))
    await wait_until(lambda: w.app.slots.busy == 1)
    result = await w.stub.Drain(
        worker_pb2.DrainRequest(grace=grace(0.05)), metadata=w.metadata, timeout=RPC_TIMEOUT
    )
    assert (result.batches_finished, result.batches_cancelled) == (0, 1)
    err = await rpc_error(hung)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert parse_rpc_error(err).reason == Reason.REPLICA_DRAINING
    assert w.app.slots.busy == 0
    assert (
        w.app.host.registry.get_sample_value(
            "halcyon_worker_batches_total",
            {"model": w.app.config.model, "version": w.app.config.version, "outcome": "drained"},
        )
        == 1
    )


async def test_negative_drain_grace_is_invalid(start_worker: Any) -> None:
    w = await start_worker()
    err = await rpc_error(
        w.stub.Drain(worker_pb2.DrainRequest(grace=grace(-1)), metadata=w.metadata)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not w.app.replica.draining


async def test_injected_fault_fails_fast_with_device_fault(start_worker: Any) -> None:
    w = await start_worker(fail_rate=1.0, fail_fast_ms=2.0)
    started = time.monotonic()
    err = await rpc_error(w.execute(w.batch(("a", LONG, 0)), timeout=RPC_TIMEOUT))
    assert time.monotonic() - started < 0.5  # not the 3 s the batch would take
    assert err.code() == grpc.StatusCode.INTERNAL
    assert parse_rpc_error(err).reason == "DEVICE_FAULT"
    load = (await w.stub.Describe(worker_pb2.DescribeRequest(), metadata=w.metadata)).load
    assert (load.batches_total, load.batches_failed, load.busy_slots) == (1, 1, 0)


async def test_slowdown_multiplies_device_time(start_worker: Any) -> None:
    w = await start_worker(slowdown=3.0, intercept_ms=20.0, ms_per_token=0.0)
    reply = await w.execute(w.batch(("a", 10, 10)), timeout=RPC_TIMEOUT)
    assert 0.059 <= reply.device_time.ToNanoseconds() / 1e9 <= 0.13


async def test_credentials_are_required_and_roles_checked(start_worker: Any, tokens: Any) -> None:
    w = await start_worker()
    _fleet, operator = tokens
    missing = await rpc_error(w.stub.Describe(worker_pb2.DescribeRequest()))
    assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
    assert parse_rpc_error(missing).reason == Reason.MISSING_CREDENTIALS
    wrong_role = await rpc_error(
        w.stub.ExecuteBatch(w.batch(("a", 1, 1)), metadata=bearer_metadata(operator))
    )
    assert wrong_role.code() == grpc.StatusCode.PERMISSION_DENIED
    rich = parse_rpc_error(wrong_role)
    assert rich.reason == Reason.WRONG_ROLE and rich.domain == "halcyon.dev"
    unknown = await rpc_error(
        w.stub.Drain(worker_pb2.DrainRequest(), metadata=bearer_metadata("guess"))
    )
    assert unknown.code() == grpc.StatusCode.UNAUTHENTICATED
    assert parse_rpc_error(unknown).reason == Reason.INVALID_CREDENTIALS
    assert not w.app.replica.draining


@pytest.mark.parametrize(
    ("items", "kw", "code", "field"),
    [
        ((), {}, grpc.StatusCode.INVALID_ARGUMENT, "items"),
        ((("a", 1, 1), ("a", 1, 1)), {}, grpc.StatusCode.INVALID_ARGUMENT, "items[1].id"),
        ((("a", 1, 1), ("", 1, 1)), {}, grpc.StatusCode.INVALID_ARGUMENT, "items[1].id"),
        ((("a", 0, 0),), {}, grpc.StatusCode.INVALID_ARGUMENT, "items[0].input_tokens"),
        ((("a", 1, 1),), {"model": "other"}, grpc.StatusCode.FAILED_PRECONDITION, None),
        ((("a", 1, 1),), {"version": "v9"}, grpc.StatusCode.FAILED_PRECONDITION, None),
    ],
)
async def test_malformed_batches_are_refused_naming_the_field(
    start_worker: Any, items: Any, kw: Any, code: grpc.StatusCode, field: str | None
) -> None:
    w = await start_worker()
    err = await rpc_error(w.execute(w.batch(*items, **kw), timeout=RPC_TIMEOUT))
    assert err.code() == code
    rich = parse_rpc_error(err)
    if field is None:
        assert rich.reason == "WRONG_MODEL"
        assert rich.metadata["version"] == "v1"
    else:
        assert [v.field for v in rich.field_violations] == [field]
    assert w.app.slots.busy == 0
    assert (
        w.app.host.registry.get_sample_value(
            "halcyon_worker_batches_total",
            {"model": w.app.config.model, "version": w.app.config.version, "outcome": "invalid"},
        )
        == 1
    )


async def test_health_names_and_describe(start_worker: Any) -> None:
    w = await start_worker(replica_id="r-7", hardware="h100", slots=3, speed=0.6, version="v2")
    health = health_pb2_grpc.HealthStub(w.channel)
    for name in ("liveness", "readiness", "", "halcyon.v1.WorkerService"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
    described = await w.stub.Describe(worker_pb2.DescribeRequest(), metadata=w.metadata)
    r = described.replica
    assert (r.replica_id, r.address, r.model, r.version, r.hardware, r.slots) == (
        "r-7",
        w.app.host.grpc_address,
        "llama-3-8b",
        "v2",
        "h100",
        3,
    )
    assert r.speed == pytest.approx(0.6)
    assert described.load.busy_slots == 0 and not described.load.draining


async def test_execute_batch_span_continues_the_callers_trace(
    start_worker: Any,
    tracer_provider: TracerProvider,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The tracing layer's span, made with the tracer the host is given (the contract suite,
    # tests/serving/contract, checks that both transports make the same one).
    monkeypatch.setenv(SERVING_PATH_ENV, "fast")
    w = await start_worker(tracer=tracer_provider.get_tracer("worker"))
    gateway = tracer_provider.get_tracer("gateway")
    with gateway.start_as_current_span("batch") as parent:
        metadata = (*w.metadata, *inject_metadata())
        await w.execute(w.batch(("a", 10, 10), batch_id="traced"), metadata=metadata)
    finished = {s.name: s for s in spans.get_finished_spans()}
    # Named and attributed as OpenTelemetry's gRPC instrumentation names RPC spans.
    span = finished["/halcyon.v1.WorkerService/ExecuteBatch"]
    assert span.kind == SpanKind.SERVER
    assert span.attributes is not None
    assert span.attributes["rpc.system"] == "grpc"
    assert span.attributes["rpc.service"] == "halcyon.v1.WorkerService"
    assert span.attributes["rpc.method"] == "ExecuteBatch"
    assert span.attributes["rpc.grpc.status_code"] == 0
    assert span.attributes["net.peer.name"] == "localhost"
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.context.trace_id == parent.get_span_context().trace_id
    assert span.attributes is not None
    assert span.attributes["halcyon.batch_id"] == "traced"
    assert span.attributes["halcyon.outcome"] == "ok"
