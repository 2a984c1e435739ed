"""Tracing across gateway -> worker (W3C traceparent) and the gateway's Prometheus metrics."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import grpc
import grpc.aio
from google.protobuf import duration_pb2
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from common.serving import SERVING_PATH_ENV, ServiceHost, ServingOptions
from common.tracing import client_interceptors
from gateway.admission import GradientLimiterConfig
from halcyon.v1 import worker_pb2, worker_pb2_grpc

FLEET = "gateway-test-fleet-token"  # as in conftest (its fixtures start the workers)

INFER_SPAN = "/halcyon.v1.InferService/Infer"
EXECUTE_SPAN = "/halcyon.v1.WorkerService/ExecuteBatch"
RPC_KEYS = {"rpc.system", "rpc.service", "rpc.method", "rpc.grpc.status_code"}


def _named(exporter: InMemorySpanExporter, name: str, kind: SpanKind) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == name and s.kind == kind]


async def test_infer_batch_and_worker_spans_form_one_story(
    start_worker: Any, start_gateway: Any, span_exporter: InMemorySpanExporter, wait_until: Any
) -> None:
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway()
    gw.apply([worker])

    reply = await gw.infer()
    assert reply.output

    def spans() -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        return (
            _named(span_exporter, INFER_SPAN, SpanKind.SERVER),
            _named(span_exporter, "batch", SpanKind.INTERNAL),
            _named(span_exporter, EXECUTE_SPAN, SpanKind.CLIENT),
            _named(span_exporter, EXECUTE_SPAN, SpanKind.SERVER),
        )

    await wait_until(lambda: all(spans()))
    [infer], [batch], [call], [executed] = spans()

    # The request's server span carries the RPC conventions, as the interceptor's would.
    assert infer.attributes is not None
    assert set(infer.attributes) >= RPC_KEYS
    assert infer.attributes["rpc.service"] == "halcyon.v1.InferService"
    assert infer.attributes["rpc.method"] == "Infer"
    assert infer.attributes["rpc.grpc.status_code"] == 0
    assert infer.attributes["halcyon.tenant"] == "standard"

    # The batch span links to the request span it served.
    assert batch.links, "the batch span has no links"
    linked = {(link.context.trace_id, link.context.span_id) for link in batch.links}
    assert (infer.context.trace_id, infer.context.span_id) in linked
    assert batch.attributes is not None
    assert batch.attributes["halcyon.batch.size"] == 1
    assert batch.attributes["halcyon.version"] == "v1"

    # The call to the worker is a CLIENT span under the batch ...
    assert call.parent is not None and call.parent.span_id == batch.context.span_id
    assert call.attributes is not None
    assert call.attributes["rpc.method"] == "ExecuteBatch"
    assert call.attributes["rpc.grpc.status_code"] == 0

    # ... and the worker continues it: traceparent crossed the wire.
    assert executed.parent is not None
    assert executed.parent.is_remote
    assert executed.parent.span_id == call.context.span_id
    assert executed.context.trace_id == batch.context.trace_id
    assert executed.attributes is not None
    assert executed.attributes["halcyon.replica_id"] == "w-1"
    assert executed.attributes["halcyon.outcome"] == "ok"
    assert executed.attributes["rpc.service"] == "halcyon.v1.WorkerService"


async def test_fast_path_spans_carry_what_the_instrumentation_puts_on_grpc_aio_spans(
    start_worker: Any, start_gateway: Any, span_exporter: InMemorySpanExporter, wait_until: Any
) -> None:
    """The completion-queue path (Infer, ExecuteBatch) and the gateway's own ExecuteBatch
    calls make their spans by hand; every attribute key the OpenTelemetry interceptors put on
    a grpc.aio call of the same kind must be there too."""
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway()
    gw.apply([worker])
    await gw.infer()
    # A grpc.aio-served method through the instrumentation's client and server interceptors.
    async with grpc.aio.insecure_channel(
        worker.host.grpc_address, interceptors=client_interceptors()
    ) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        await stub.Describe(
            worker_pb2.DescribeRequest(), metadata=(("authorization", f"Bearer {FLEET}"),)
        )
    describe = "/halcyon.v1.WorkerService/Describe"
    await wait_until(
        lambda: bool(
            _named(span_exporter, describe, SpanKind.SERVER)
            and _named(span_exporter, describe, SpanKind.CLIENT)
            and _named(span_exporter, EXECUTE_SPAN, SpanKind.SERVER)
        )
    )

    def keys(name: str, kind: SpanKind) -> set[str]:
        [span] = _named(span_exporter, name, kind)
        return {k for k in span.attributes if not k.startswith("halcyon.")}

    aio_server, aio_client = keys(describe, SpanKind.SERVER), keys(describe, SpanKind.CLIENT)
    assert aio_server >= RPC_KEYS and aio_client >= RPC_KEYS
    assert keys(INFER_SPAN, SpanKind.SERVER) == aio_server
    assert keys(EXECUTE_SPAN, SpanKind.SERVER) == aio_server
    assert keys(EXECUTE_SPAN, SpanKind.CLIENT) == aio_client


async def test_batch_span_links_every_request_it_carries(
    start_worker: Any, start_gateway: Any, span_exporter: InMemorySpanExporter, wait_until: Any
) -> None:
    worker = await start_worker(intercept_ms=40.0)
    gw = await start_gateway()
    gw.apply([worker])

    replies = await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(12)))

    await wait_until(lambda: len(_named(span_exporter, INFER_SPAN, SpanKind.SERVER)) == 12)
    spans = span_exporter.get_finished_spans()
    infer_ids = {s.context.span_id for s in spans if s.name == INFER_SPAN}
    assert len(infer_ids) == 12
    batches = [s for s in spans if s.name == "batch"]
    linked: list[int] = []
    for b in batches:
        assert b.attributes is not None
        assert len(b.links) == b.attributes["halcyon.batch.size"]
        linked += [link.context.span_id for link in b.links]
    # Every request span is linked by exactly one (successful) batch.
    assert sorted(linked) == sorted(infer_ids)
    assert max(r.batch.size for r in replies) == max(len(b.links) for b in batches) > 1
    calls = {
        s.context.span_id: s for s in spans if s.name == EXECUTE_SPAN and s.kind == SpanKind.CLIENT
    }
    assert {c.parent.span_id for c in calls.values()} == {b.context.span_id for b in batches}
    workers = [s for s in spans if s.name == EXECUTE_SPAN and s.kind == SpanKind.SERVER]
    assert {w.parent.span_id for w in workers if w.parent} == set(calls)


async def test_hot_path_makes_no_span_when_nothing_records(
    start_worker: Any, start_gateway: Any, span_exporter: InMemorySpanExporter, monkeypatch: Any
) -> None:
    import common.tracing as tracing
    import gateway.dispatcher as dispatcher_module

    monkeypatch.setattr(tracing, "_spans_recorded", False)
    # Server spans come from the pipeline's tracing layer on both transports; the fast path is
    # the one that serves Infer and ExecuteBatch by default.
    monkeypatch.setenv(SERVING_PATH_ENV, "fast")

    def forbidden(*_: Any, **__: Any) -> Any:
        raise AssertionError("a span was made on the hot path with nothing to record it")

    monkeypatch.setattr(tracing, "start_server_span", forbidden)
    monkeypatch.setattr(dispatcher_module, "start_client_span", forbidden)
    worker = await start_worker(replica_id="w-1")
    gw = await start_gateway()
    gw.apply([worker])
    for _ in range(3):
        assert (await gw.infer()).output
    hot = {INFER_SPAN, EXECUTE_SPAN, "batch"}
    assert not [s for s in span_exporter.get_finished_spans() if s.name in hot]


async def test_failed_request_span_is_marked_as_error(
    start_worker: Any, start_gateway: Any, span_exporter: InMemorySpanExporter
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker(intercept_ms=150.0)])
    err = await gw.infer_error(timeout=duration_pb2.Duration(nanos=1_000_000))
    assert err.reason == "DEADLINE_UNREACHABLE"
    [infer] = _named(span_exporter, INFER_SPAN, SpanKind.SERVER)
    assert infer.status.status_code == StatusCode.ERROR
    assert infer.attributes is not None
    assert infer.attributes["rpc.grpc.status_code"] == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]


async def test_metrics_after_traffic(start_worker: Any, start_gateway: Any) -> None:
    a = await start_worker(replica_id="w-a")
    b = await start_worker(replica_id="w-b", version="v1", speed=0.5)
    gw = await start_gateway(metrics=True)
    gw.apply([a, b])
    for _ in range(3):
        await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(16)))
    await gw.infer_error(model="no-such-model")

    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "ok"}) == 48
    assert gw.sample("halcyon_gateway_requests_total", {"outcome": "unknown_model"}) == 1
    assert gw.sample("halcyon_gateway_request_seconds_count") == 48

    batches = gw.sample("halcyon_gateway_batch_size_count")
    assert 1 <= batches < 48  # batched
    assert gw.sample("halcyon_gateway_batch_size_sum") == 48
    assert gw.sample("halcyon_gateway_batch_size_bucket", {"le": "+Inf"}) == batches
    assert gw.sample("halcyon_gateway_batch_size_bucket", {"le": "1.0"}) < batches
    flushes = {
        reason: gw.sample("halcyon_gateway_batch_flushes_total", {"reason": reason})
        for reason in ("deadline", "full", "linger", "capacity", "drain")
    }
    assert sum(flushes.values()) == batches, flushes

    registry = gw.app.host.registry
    for rid in ("w-a", "w-b"):
        labels = {"replica": rid, "version": "v1"}
        assert gw.sample("halcyon_gateway_replica_latency_estimate_seconds", labels) > 0
        assert gw.sample("halcyon_gateway_replica_inflight", labels) == 0
        for gauge in ("intercept_seconds", "per_token_seconds"):
            value = registry.get_sample_value(f"halcyon_gateway_cost_model_{gauge}", labels)
            assert value is not None and value >= 0.0, (rid, gauge, value)
    assert gw.sample("halcyon_gateway_fleet_replicas") == 2

    # The same over HTTP, in the Prometheus text format, on the gateway's metrics port.
    url = f"http://127.0.0.1:{gw.app.host.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    families = {f.name: f for f in text_string_to_metric_families(body)}
    ok = {
        (s.labels["tenant"], s.labels["model"], s.labels["version"]): s.value
        for s in families["halcyon_gateway_requests"].samples
        if s.name == "halcyon_gateway_requests_total" and s.labels.get("outcome") == "ok"
    }
    # The unknown model's name never becomes a label value.
    assert ok == {("standard", "llama-3-8b", "v1"): 48.0, ("standard", "unknown", "none"): 0.0}
    assert any(s.name.endswith("_bucket") for s in families["halcyon_gateway_batch_size"].samples)
    estimates = families["halcyon_gateway_replica_latency_estimate_seconds"].samples
    assert {s.labels["replica"] for s in estimates} == {"w-a", "w-b"}
    handled = families["grpc_server_handled"].samples
    assert any(
        s.labels.get("grpc_method") == "Infer" and s.labels.get("grpc_code") == "OK"
        for s in handled
    )


async def test_limiter_latencies_are_exported(start_worker: Any, start_gateway: Any) -> None:
    # What an operator needs to read a low limit: the latencies it was judged on.
    worker = await start_worker(replica_id="w-a")
    every_answer = GradientLimiterConfig(
        initial_limit=128.0, min_limit=32.0, window_s=1e-6, min_window_samples=1
    )
    gw = await start_gateway(metrics=True, limiter=every_answer)
    gw.apply([worker])
    for _ in range(3):
        await asyncio.gather(*(gw.infer(text=f"p{i}") for i in range(8)))
    limiter = gw.app.admission.limiter
    assert limiter.updates > 0
    url = f"http://127.0.0.1:{gw.app.host.metrics_port}/metrics"

    def scrape() -> str:
        return str(urllib.request.urlopen(url, timeout=5).read().decode())

    # The scalar gauges are refreshed each status report and each scrape (after they are
    # read): the second scrape shows the state as of the first.
    await asyncio.to_thread(scrape)
    families = {f.name: f for f in text_string_to_metric_families(await asyncio.to_thread(scrape))}
    latency = {
        s.labels["window"]: s.value
        for s in families["halcyon_gateway_limiter_latency_seconds"].samples
    }
    assert latency == {"short": limiter.short_latency_s, "long": limiter.long_latency_s}
    assert latency["short"] > 0.0 and latency["long"] > 0.0


async def test_cost_model_learns_each_replica_separately(
    start_worker: Any, start_gateway: Any
) -> None:
    fast = await start_worker(replica_id="w-fast", intercept_ms=20.0)
    slow = await start_worker(replica_id="w-slow", intercept_ms=20.0, speed=0.4)
    gw = await start_gateway()
    gw.apply([fast, slow])
    for _ in range(6):
        await asyncio.gather(*(gw.infer(text=f"p{i}" * (i + 1)) for i in range(6)))
    d = gw.app.dispatchers[("llama-3-8b", "v1")]
    fast_model = d.batcher.cost_model("w-fast")
    slow_model = d.batcher.cost_model("w-slow")
    assert fast_model.observations >= 1 and slow_model.observations >= 1
    # A 0.4x replica costs more per batch than the 1.0x one (20 ms vs 50 ms intercept).
    assert slow_model.upper(100) > fast_model.upper(100)


async def test_request_metrics_by_tenant_model_version_goodput_and_sheds(
    start_worker: Any, start_gateway: Any
) -> None:
    worker = await start_worker(replica_id="w-1", intercept_ms=60.0)
    gw = await start_gateway(metrics=True)
    gw.apply([worker])
    await gw.infer(key="demo-key-premium")
    await gw.infer(key="demo-key-standard")
    # A request that cannot make its deadline is shed, counted with its tenant's priority.
    err = await gw.infer_error(key="demo-key-batch", timeout=duration_pb2.Duration(nanos=10**6))
    assert err.reason == "DEADLINE_UNREACHABLE"
    await gw.infer_error(key="no-such-key")

    def by(name: str, **labels: str) -> float:
        return gw.sample(name, labels)

    series = {"model": "llama-3-8b", "version": "v1"}
    assert by("halcyon_gateway_requests_total", tenant="premium", outcome="ok", **series) == 1
    assert by("halcyon_gateway_requests_total", tenant="standard", outcome="ok", **series) == 1
    assert by("halcyon_gateway_goodput_total", tenant="premium", **series) == 1
    assert by("halcyon_gateway_request_seconds_count", tenant="standard", **series) == 1
    # The unauthenticated call: no tenant, no version chosen.
    unauthenticated = {"tenant": "none", "version": "none", "outcome": "unauthenticated"}
    assert by("halcyon_gateway_requests_total", model="llama-3-8b", **unauthenticated) == 1
    assert by("halcyon_gateway_shed_total", reason="deadline_unreachable", priority="sheddable")
    assert by("halcyon_gateway_shed_total", priority="critical") == 0

    # Read at scrape time: weights, routable replicas, breakers, quota balances.
    assert by("halcyon_gateway_version_weight", **series) == 1.0
    assert by("halcyon_gateway_routable_replicas", **series) == 1
    assert by("halcyon_gateway_replica_breaker_state", replica="w-1", state="closed") == 1
    assert by("halcyon_gateway_replica_breaker_state", replica="w-1", state="open") == 0
    quota = {t: by("halcyon_gateway_quota_available_tokens", tenant=t) for t in ("premium",)}
    assert 0 < quota["premium"] <= 4_000_000


async def test_goodput_counts_only_answers_within_their_deadline(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker(replica_id="w-1", intercept_ms=5.0)])
    for _ in range(5):
        await gw.infer()
    labels = {"tenant": "standard", "model": "llama-3-8b", "version": "v1"}
    assert gw.sample("halcyon_gateway_goodput_total", labels) == 5
    assert gw.sample("halcyon_gateway_requests_total", {**labels, "outcome": "ok"}) == 5


async def test_scrape_from_another_thread_reads_state_on_the_loop(
    start_worker: Any, start_gateway: Any
) -> None:
    gw = await start_gateway(metrics=True)
    gw.apply([await start_worker(replica_id="w-1")])
    await gw.infer()
    url = f"http://127.0.0.1:{gw.app.host.metrics_port}/metrics"
    # The HTTP thread hands the snapshot to this loop, which must stay free to compute it.
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    families = {f.name: f for f in text_string_to_metric_families(body)}
    [weight] = families["halcyon_gateway_version_weight"].samples
    assert weight.labels == {"model": "llama-3-8b", "version": "v1"} and weight.value == 1.0
    assert {
        s.labels["tenant"] for s in families["halcyon_gateway_quota_available_tokens"].samples
    } == {
        "premium",
        "standard",
        "batch",
    }


async def test_streams_written_with_context_write_are_traced_and_still_stream(
    span_exporter: InMemorySpanExporter, wait_until: Any
) -> None:
    """The controller's streams send with ``context.write`` from a coroutine; the
    instrumentation assumes async generators, which common.tracing works around."""

    async def watch(request: bytes, context: grpc.aio.ServicerContext) -> None:
        for i in range(3):
            await context.write(request + bytes([48 + i]))

    def register(_servicer: Any, server: grpc.aio.Server) -> None:
        handler = grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=bytes, response_serializer=bytes
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("halcyon.test.Stream", {"Watch": handler}),)
        )

    host = ServiceHost("stream", ServingOptions(listen="127.0.0.1:0", metrics_listen=None), None)
    host.add_service(register, None, "halcyon.test.Stream")
    await host.start()
    try:
        async with grpc.aio.insecure_channel(
            host.grpc_address, interceptors=client_interceptors()
        ) as channel:
            call = channel.unary_stream(
                "/halcyon.test.Stream/Watch",
                request_serializer=bytes,
                response_deserializer=bytes,
            )(b"m", timeout=5)
            assert [m async for m in call] == [b"m0", b"m1", b"m2"]
    finally:
        await host.stop(0)
    name = "/halcyon.test.Stream/Watch"
    await wait_until(lambda: bool(_named(span_exporter, name, SpanKind.SERVER)))
    [server] = _named(span_exporter, name, SpanKind.SERVER)
    [client] = _named(span_exporter, name, SpanKind.CLIENT)
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert server.attributes is not None and server.attributes["rpc.method"] == "Watch"
