"""The standard ``OTEL_*`` variables, honoured by every component (:mod:`common.tracing`).

What the environment decides is read by two pure functions (:func:`plan_tracing`,
:func:`tracing_resource`), checked here in-process; :func:`configure_tracing` installs the
process's one global provider, so it runs in a subprocess; and real ``halcyon`` processes
(controller, worker, gateway, each with its own ``OTEL_SERVICE_NAME``) export over OTLP/gRPC to
a real ``TraceService`` receiver on 127.0.0.1:0 in this test process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from common.build_info import halcyon_version
from common.tracing import plan_tracing, tracing_resource
from tests.support import e2e

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("controller", "gateway", "worker")
EXPORT_TIMEOUT_S = 20.0


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


# -- the resource: the component's name is only the default ----------------------------------


@pytest.mark.parametrize("component", COMPONENTS)
def test_service_name_is_the_component_unless_the_environment_names_it(
    component: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    attributes = tracing_resource(component).attributes
    assert attributes["service.name"] == component
    assert attributes["service.version"] == halcyon_version()
    assert attributes["telemetry.sdk.language"] == "python"  # the SDK's detectors still run

    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,team=ml-platform")
    attributes = tracing_resource(component).attributes
    assert attributes["service.name"] == "from-attrs"
    assert attributes["team"] == "ml-platform"

    # OTEL_SERVICE_NAME beats service.name in OTEL_RESOURCE_ATTRIBUTES (the spec's order).
    monkeypatch.setenv("OTEL_SERVICE_NAME", f"halcyon-{component}-eu1")
    attributes = tracing_resource(component).attributes
    assert attributes["service.name"] == f"halcyon-{component}-eu1"
    assert attributes["team"] == "ml-platform"


def test_resource_attributes_override_the_version_and_add_to_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "service.version=build-1234,deployment.environment=staging,k8s.pod.name=gw%2D0",
    )
    attributes = tracing_resource("gateway").attributes
    assert attributes["service.name"] == "gateway"
    assert attributes["service.version"] == "build-1234"
    assert attributes["deployment.environment"] == "staging"
    assert attributes["k8s.pod.name"] == "gw-0"  # values are percent-decoded


# -- whether and where spans go ---------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    env: dict[str, str]
    exporters: tuple[str, ...]
    endpoint: str | None
    record: bool
    disabled: bool = False


PLANS = {
    "nothing set: no exporter, nothing recorded": Case({}, (), None, record=False),
    "an OTLP endpoint exports to it": Case(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
        ("otlp",),
        "http://collector:4317",
        record=True,
    ),
    "the traces endpoint alone is enough": Case(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317"},
        ("otlp",),
        "http://traces:4317",
        record=True,
    ),
    "the traces endpoint beats the general one": Case(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
        },
        ("otlp",),
        "http://traces:4317",
        record=True,
    ),
    "exporter none wins over an endpoint": Case(
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
        (),
        None,
        record=False,
    ),
    "exporter otlp with no endpoint uses the spec's default": Case(
        {"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",), "http://localhost:4317", record=True
    ),
    "console alone": Case({"OTEL_TRACES_EXPORTER": "console"}, ("console",), None, record=True),
    "a list of exporters": Case(
        {"OTEL_TRACES_EXPORTER": "console, OTLP", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
        ("otlp", "console"),
        "http://c:4317",
        record=True,
    ),
    "a sampler without an exporter still records (trace ids in logs)": Case(
        {"OTEL_TRACES_SAMPLER": "always_on"}, (), None, record=True
    ),
    "SDK disabled beats everything": Case(
        {
            "OTEL_SDK_DISABLED": "TRUE",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            "OTEL_TRACES_SAMPLER": "always_on",
        },
        (),
        None,
        record=False,
        disabled=True,
    ),
    "SDK disabled false is enabled": Case(
        {"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"},
        ("otlp",),
        "http://c:4317",
        record=True,
    ),
}


@pytest.mark.parametrize("case", PLANS.values(), ids=PLANS.keys())
def test_the_environment_decides_the_exporters(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    plan = plan_tracing()
    assert (plan.disabled, plan.exporters, plan.otlp_endpoint, plan.record) == (
        case.disabled,
        case.exporters,
        case.endpoint,
        case.record,
    )


def test_values_it_cannot_honour_are_said_not_guessed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "yes")  # only "true" is true (the spec)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin,otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    with caplog.at_level(logging.WARNING, logger="halcyon.tracing"):
        plan = plan_tracing()
    assert not plan.disabled
    assert plan.exporters == ("otlp",)
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "OTEL_SDK_DISABLED='yes' is not true or false" in messages
    assert "zipkin not available" in messages
    assert "'http/protobuf' is not installed; exporting spans over OTLP/gRPC" in messages


# -- configure_tracing: the process's provider (one per process, so in a subprocess) -----------

_CONFIGURE = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from common import tracing
provider = tracing.configure_tracing("gateway")
span = trace.get_tracer("t").start_span("s")
print(json.dumps({
    "returned": provider is not None,
    "sdk": isinstance(trace.get_tracer_provider(), TracerProvider),
    "processors": len(provider._active_span_processor._span_processors) if provider else 0,
    "service": provider.resource.attributes["service.name"] if provider else None,
    "recorded": tracing.spans_recorded(),
    "span_recording": span.is_recording(),
}))
"""


def _configure(**env: str) -> dict[str, Any]:
    import json

    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", _CONFIGURE],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=REPO,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_sdk_disabled_installs_no_provider_and_makes_no_span() -> None:
    endpoint = "http://127.0.0.1:1"  # would export, if the SDK were on
    on = _configure(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="gw-on")
    assert on == {
        "returned": True,
        "sdk": True,
        "processors": 1,
        "service": "gw-on",
        "recorded": True,
        "span_recording": True,
    }
    off = _configure(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SDK_DISABLED="true")
    assert off == {
        "returned": False,
        "sdk": False,
        "processors": 0,
        "service": None,
        "recorded": False,
        "span_recording": False,
    }


def test_exporter_none_exports_nothing_and_the_hot_path_makes_no_span() -> None:
    none = _configure(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:1", OTEL_TRACES_EXPORTER="none")
    assert none["sdk"] and none["processors"] == 0
    assert not none["recorded"] and not none["span_recording"]


# -- real processes, a real OTLP/gRPC receiver --------------------------------------------------


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    resource: dict[str, str]
    name: str
    kind: int
    attributes: dict[str, Any]
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes


def _value(v: common_pb2.AnyValue) -> Any:
    which = v.WhichOneof("value")
    return None if which is None else getattr(v, which)


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[ReceivedSpan] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for rs in request.resource_spans:
            resource = {kv.key: str(_value(kv.value)) for kv in rs.resource.attributes}
            for scope in rs.scope_spans:
                for span in scope.spans:
                    attributes = {kv.key: _value(kv.value) for kv in span.attributes}
                    received.append(
                        ReceivedSpan(
                            resource.get("service.name", ""),
                            resource,
                            span.name,
                            span.kind,
                            attributes,
                            span.trace_id,
                            span.span_id,
                            span.parent_span_id,
                        )
                    )
        with self._lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def find(
        self, service: str, name: str, kind: int, parent: ReceivedSpan | None = None
    ) -> ReceivedSpan | None:
        with self._lock:
            return next(
                (
                    s
                    for s in self.spans
                    if (s.service, s.name, s.kind) == (service, name, kind)
                    and (parent is None or (s.trace_id, s.parent_span_id) == parent_of(parent))
                ),
                None,
            )


def parent_of(span: ReceivedSpan) -> tuple[bytes, bytes]:
    return span.trace_id, span.span_id


@dataclass
class TracedFleet:
    fleet: Any
    receiver: Receiver


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedFleet]:
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    launcher = e2e.Launcher(tmp_path_factory.mktemp("traced"))
    plain_env = e2e._env
    try:
        with pytest.MonkeyPatch.context() as mp:

            def traced_env(component: str) -> None:
                # The launcher clears OTEL_* for every process; these are this process's own.
                env = {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                    "OTEL_SERVICE_NAME": f"{component}-from-env",
                    "OTEL_RESOURCE_ATTRIBUTES": (
                        f"deployment.environment=otel-test,role={component}"
                    ),
                    "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: export soon after the span ends
                }
                mp.setattr(e2e, "_env", lambda: {**plain_env(), **env})

            traced_env("controller")
            controller = launcher.controller()
            traced_env("worker")
            worker = launcher.worker(controller, "replica-t", *e2e.INSTANT)
            traced_env("gateway")
            gateway = launcher.gateway(controller)
        for proc in (worker, gateway):
            proc.wait_ready()
        fleet = e2e.Fleet(controller, {"replica-t": worker}, gateway)
        launcher.fleets.append(fleet)
        fleet.wait_converged()
        yield TracedFleet(fleet, receiver)
    finally:
        launcher.close()
        server.stop(0)


SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT


def _wait_span(
    traced: TracedFleet, service: str, name: str, kind: int, parent: ReceivedSpan | None = None
) -> ReceivedSpan:
    span: ReceivedSpan = e2e.wait_for(
        lambda: traced.receiver.find(service, name, kind, parent),
        EXPORT_TIMEOUT_S,
        f"a {name} span from {service}",
        watch=traced.fleet.procs,
    )
    return span


def test_gateway_and_worker_export_under_the_environments_service_name(
    traced: TracedFleet,
) -> None:
    traced.fleet.infer(session_key="traced")
    infer = _wait_span(traced, "gateway-from-env", "/halcyon.v1.InferService/Infer", SERVER)
    assert infer.resource["deployment.environment"] == "otel-test"
    assert infer.resource["role"] == "gateway"
    assert infer.resource["service.version"] == halcyon_version()
    assert infer.attributes["rpc.system"] == "grpc"
    call = _wait_span(traced, "gateway-from-env", "/halcyon.v1.WorkerService/ExecuteBatch", CLIENT)
    assert call.attributes["rpc.service"] == "halcyon.v1.WorkerService"
    batch = _wait_span(
        traced, "worker-from-env", "/halcyon.v1.WorkerService/ExecuteBatch", SERVER, parent=call
    )
    assert batch.resource["role"] == "worker"
    assert batch.attributes["halcyon.replica_id"] == "replica-t"


def test_the_controller_exports_a_span_for_get_state(traced: TracedFleet) -> None:
    traced.fleet.get_state()
    span = _wait_span(traced, "controller-from-env", "/halcyon.v1.ControlService/GetState", SERVER)
    assert span.resource["deployment.environment"] == "otel-test"
    assert span.resource["role"] == "controller"
    assert span.attributes["rpc.method"] == "GetState"
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.OK.value[0]
    # Its streams too: the gateway's outcome reports (a client stream, one call a second),
    # each the child of the gateway's CLIENT span across the process boundary.
    method = "/halcyon.v1.ControlService/ReportOutcomes"
    report = _wait_span(traced, "gateway-from-env", method, CLIENT)
    _wait_span(traced, "controller-from-env", method, SERVER, parent=report)
