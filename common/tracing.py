"""OpenTelemetry tracing: the process's tracer provider and RPC spans on every gRPC path.

What it decides: every process gets one global ``TracerProvider`` configured by the standard
``OTEL_*`` environment variables (OpenTelemetry SDK environment variable specification,
https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/), with the
component's name (``gateway``, ``worker``, ``controller``) and Halcyon's version only as the
defaults of ``service.name`` and ``service.version``:

* ``OTEL_SERVICE_NAME`` sets ``service.name``; ``OTEL_RESOURCE_ATTRIBUTES`` adds attributes
  (and may set ``service.name`` when ``OTEL_SERVICE_NAME`` does not) — the environment wins;
* ``OTEL_SDK_DISABLED=true``: no SDK provider at all (the API's no-op one stays), no spans;
* ``OTEL_TRACES_EXPORTER``: ``otlp`` (over gRPC, the only OTLP transport installed),
  ``console`` (stdout), ``none``, or a comma-separated list. Unset, spans are exported over
  OTLP only when an endpoint is configured (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_ENDPOINT``): the spec's default is ``otlp`` to ``localhost:4317``, but
  nothing in Halcyon needs a collector to run, so no endpoint means no exporter;
* ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``, ``OTEL_BSP_*``, span limits,
  ``OTEL_EXPORTER_OTLP_*`` (headers, certificates, timeout, compression) and
  ``OTEL_PROPAGATORS`` are read by the SDK, the exporter and the API themselves.

With no exporter and no sampler configured nothing would read the spans: the provider records
none (an incoming sampled ``traceparent`` is still honoured), and :func:`spans_recorded` tells
the hot paths to make none at all.

RPC spans on the server: every call a host serves gets one SERVER span named
``/package.Service/Method`` with the OpenTelemetry RPC semantic conventions (``rpc.system``,
``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``, ``net.peer.*``), the child of the
caller's W3C ``traceparent``, made and ended by :class:`TracingLayer`: as the unary pipeline's
outermost layer (so a refused call still has its span) on either transport, and through
:class:`StreamTracing` for the streaming methods ``grpc.aio`` serves. None at all is made when
nothing would record it (:func:`spans_recorded`): the request path does not pay for unread
spans. Probes and reflection are untraced (:func:`traced`). On the client,
``opentelemetry-instrumentation-grpc``'s interceptors (:func:`client_interceptors`); the
gateway's own ExecuteBatch calls bypass grpc.aio and use :func:`start_client_span`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import grpc
from opentelemetry import propagate, trace
from opentelemetry.context import Context, attach, detach
from opentelemetry.instrumentation.grpc import aio_client_interceptors
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import SpanKind, Status, StatusCode

from common.build_info import halcyon_version
from common.call import UnaryCall, Verdict
from common.grpc_metrics import ended_code
from common.handlers import behaviour_of, same_kind_handler
from common.pipeline import Layer

__all__ = [
    "EXPORTER_ENV",
    "OTLP_ENDPOINT_ENV",
    "OTLP_TRACES_ENDPOINT_ENV",
    "SDK_DISABLED_ENV",
    "StreamTracing",
    "TracingLayer",
    "TracingPlan",
    "client_interceptors",
    "configure_tracing",
    "end_rpc_span",
    "extract_context",
    "inject_metadata",
    "plan_tracing",
    "spans_recorded",
    "start_client_span",
    "start_server_span",
    "traced",
    "tracing_resource",
]

# The RPC semantic-convention attribute names the instrumentation puts on its spans. Spelled
# out: the semconv package keeps them in a private (``_incubating``) module.
RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code"
NET_PEER_IP = "net.peer.ip"
NET_PEER_NAME = "net.peer.name"
NET_PEER_PORT = "net.peer.port"

# The specification's names (opentelemetry.sdk.environment_variables has the same strings).
OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTLP_TRACES_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
SAMPLER_ENV = "OTEL_TRACES_SAMPLER"
EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
SDK_DISABLED_ENV = "OTEL_SDK_DISABLED"
_EXPORTERS = ("otlp", "console")  # the OTEL_TRACES_EXPORTER values this process can honour
_DEFAULT_OTLP_ENDPOINT = "http://localhost:4317"  # the spec's default for OTLP/gRPC
_log = logging.getLogger("halcyon.tracing")
_spans_recorded = True


def spans_recorded() -> bool:
    """False when :func:`configure_tracing` chose to record nothing (no exporter configured,
    or the SDK disabled): hot paths may then skip per-request spans altogether instead of
    making non-recording ones.
    """
    return _spans_recorded


def tracing_resource(service: str) -> Resource:
    """The resource of ``service``'s spans: ``service.name`` = ``service`` and
    ``service.version`` = Halcyon's version unless the environment says otherwise.

    ``Resource.create`` runs the SDK's detectors (``OTEL_RESOURCE_ATTRIBUTES`` and
    ``OTEL_SERVICE_NAME`` among them) and then lets the attributes it is given win; the
    defaults go in there and the environment's attributes are merged back on top, so
    ``OTEL_SERVICE_NAME`` beats ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, which beats
    the component's name (the specification's order).
    """
    defaults = {SERVICE_NAME: service, SERVICE_VERSION: halcyon_version()}
    return Resource.create(defaults).merge(OTELResourceDetector().detect())


def _env_flag(name: str) -> bool:
    """A boolean variable as the specification reads one: only ``true`` (any case) is true;
    anything but unset, empty or ``false`` is false with a warning."""
    raw = os.environ.get(name, "").strip().lower()
    if raw not in ("", "true", "false"):
        _log.warning(f"{name}={raw!r} is not true or false; treated as false")
    return raw == "true"


@dataclass(frozen=True)
class TracingPlan:
    """What the environment asks of this process's tracing (:func:`plan_tracing`)."""

    disabled: bool  # OTEL_SDK_DISABLED=true: no SDK provider, no spans
    exporters: tuple[str, ...]  # among _EXPORTERS
    otlp_endpoint: str | None  # where OTLP spans go, when "otlp" is among the exporters
    record: bool  # spans are recorded (something exports them, or a sampler was asked for)


def plan_tracing() -> TracingPlan:
    """Read the ``OTEL_*`` variables that decide whether and where spans go (module docstring).

    Unknown ``OTEL_TRACES_EXPORTER`` values and an OTLP protocol other than ``grpc`` are
    logged (a WARNING each): the first is ignored, the second exported over gRPC anyway.
    """
    if _env_flag(SDK_DISABLED_ENV):
        return TracingPlan(disabled=True, exporters=(), otlp_endpoint=None, record=False)
    endpoint = os.environ.get(OTLP_TRACES_ENDPOINT_ENV) or os.environ.get(OTLP_ENDPOINT_ENV)
    requested = os.environ.get(EXPORTER_ENV, "").strip().lower()
    if requested:
        names = [n.strip() for n in requested.split(",") if n.strip()]
        unknown = [n for n in names if n not in (*_EXPORTERS, "none")]
        if unknown:
            _log.warning(
                f"{EXPORTER_ENV}: {', '.join(unknown)} not available; "
                f"this process exports to {', '.join(_EXPORTERS)} or none"
            )
        chosen = () if "none" in names else tuple(n for n in _EXPORTERS if n in names)
    else:
        # The spec's default is otlp (to localhost:4317); without an endpoint configured,
        # Halcyon exports nothing, so nothing needs a collector to run.
        chosen = ("otlp",) if endpoint else ()
    if "otlp" in chosen:
        endpoint = endpoint or _DEFAULT_OTLP_ENDPOINT
        protocol = (
            os.environ.get(OTLP_TRACES_PROTOCOL_ENV) or os.environ.get(OTLP_PROTOCOL_ENV) or "grpc"
        ).strip()
        if protocol != "grpc":
            _log.warning(
                f"OTLP protocol {protocol!r} is not installed; exporting spans over OTLP/gRPC",
                extra={"endpoint": endpoint},
            )
    else:
        endpoint = None
    record = bool(chosen) or bool(os.environ.get(SAMPLER_ENV))
    return TracingPlan(disabled=False, exporters=chosen, otlp_endpoint=endpoint, record=record)


def configure_tracing(service: str) -> TracerProvider | None:
    """Install (once per process) and return the global SDK tracer provider for ``service``,
    as the ``OTEL_*`` environment configures it (module docstring); None when
    ``OTEL_SDK_DISABLED`` is true (the API's no-op provider stays: no span is made).

    A second call returns the provider already installed: OpenTelemetry forbids replacing it.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    plan = plan_tracing()
    global _spans_recorded
    _spans_recorded = plan.record
    if plan.disabled:
        _log.info(f"tracing disabled ({SDK_DISABLED_ENV})")
        return None
    # Nothing would export the spans: don't record them, and let the hot paths (the gateway's
    # request and batch spans) skip making them at all (spans_recorded()). An incoming sampled
    # traceparent is still honoured by the servers' own spans (ParentBased). Otherwise the
    # SDK reads OTEL_TRACES_SAMPLER / _ARG (default parentbased_always_on).
    sampler = None if plan.record else ParentBased(ALWAYS_OFF)
    provider = TracerProvider(resource=tracing_resource(service), sampler=sampler)
    if "otlp" in plan.exporters:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # The exporter reads the rest of OTEL_EXPORTER_OTLP_* (headers, TLS, timeout).
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=plan.otlp_endpoint))
        )
        _log.info("exporting spans over OTLP", extra={"endpoint": plan.otlp_endpoint})
    if "console" in plan.exporters:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def inject_metadata(context: Context | None = None) -> list[tuple[str, str]]:
    """``traceparent`` (and ``tracestate``) for an outgoing call, from the current span.

    Empty when there is no valid span, so it can always be appended to call metadata.
    """
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return sorted(carrier.items())


def extract_context(metadata: Iterable[tuple[str, Any]] | None) -> Context:
    """The remote parent context carried in incoming call metadata (binary keys ignored)."""
    carrier: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            carrier[key.lower()] = value
    return propagate.extract(carrier)


# -- RPC spans --------------------------------------------------------------------------------

# Server span statuses as the instrumentation sets them: only these codes are the server's
# fault (OpenTelemetry's gRPC conventions); the others leave the status unset.
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


class _StreamCall:
    """A streaming call as :class:`TracingLayer` reads it: method, metadata, peer, its span."""

    __slots__ = ("_context", "metadata", "method", "span")

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self._context = context
        self.method = method
        self.metadata = context.invocation_metadata() or ()
        self.span: trace.Span = trace.INVALID_SPAN

    def peer(self) -> str:
        return str(self._context.peer())


class StreamTracing(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """SERVER spans for the streaming calls ``grpc.aio`` serves, made and ended by the same
    :class:`TracingLayer` hooks as every unary call's; the span is current in the handler."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer
        self._layers: dict[str, TracingLayer] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not traced(method):
            return handler
        layer = self._layers.get(method)
        if layer is None:
            layer = self._layers[method] = TracingLayer(self._tracer, method)
        return same_kind_handler(handler, _traced(layer, method, behaviour_of(handler)))


def _traced(layer: TracingLayer, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
    """``inner`` (an async generator or a coroutine behaviour) inside the call's span."""

    def begin(context: grpc.aio.ServicerContext) -> tuple[_StreamCall, object]:
        call = _StreamCall(method, context)
        layer.admit(call)  # type: ignore[arg-type]
        span = call.span
        token = None if span is trace.INVALID_SPAN else attach(trace.set_span_in_context(span))
        return call, token

    def end(call: _StreamCall, token: object, exc: BaseException | None, context: Any) -> None:
        if token is not None:
            detach(token)  # type: ignore[arg-type]
        code = ended_code(context, exc)
        layer.ended(call, code, "" if code is grpc.StatusCode.OK else context.details() or "")  # type: ignore[arg-type]

    if inspect.isasyncgenfunction(inner):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            call, token = begin(context)
            try:
                async for response in inner(request, context):
                    yield response
            except BaseException as exc:
                end(call, token, exc, context)
                raise
            end(call, token, None, context)

        return stream

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        call, token = begin(context)
        try:
            result = inner(request, context)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            end(call, token, exc, context)
            raise
        end(call, token, None, context)
        return result

    return handle


def client_interceptors() -> list[Any]:
    """The OpenTelemetry aio client interceptors (CLIENT spans, ``traceparent`` sent)."""
    return list(aio_client_interceptors())  # type: ignore[no-untyped-call]


def _rpc_attributes(method: str) -> dict[str, Any]:
    service, _, name = method.lstrip("/").partition("/")
    return {
        RPC_SYSTEM: "grpc",
        RPC_GRPC_STATUS_CODE: grpc.StatusCode.OK.value[0],
        RPC_METHOD: name,
        RPC_SERVICE: service,
    }


def _peer_attributes(peer: str, attributes: dict[str, Any]) -> None:
    # "ipv4:127.0.0.1:57284" / "ipv6:[::1]:57284", split as the instrumentation does.
    if not peer or peer.startswith("unix:"):
        return
    try:
        ip, port = peer.split(",")[0].split(":", 1)[1].rsplit(":", 1)
    except (IndexError, ValueError):
        return
    ip = unquote(ip)
    attributes[NET_PEER_IP] = ip
    attributes[NET_PEER_PORT] = port
    if ip in ("[::1]", "127.0.0.1"):
        attributes[NET_PEER_NAME] = "localhost"


def start_server_span(
    tracer: trace.Tracer,
    method: str,
    metadata: Iterable[tuple[str, Any]] | None,
    peer: str = "",
) -> trace.Span:
    """A SERVER span for ``/package.Service/Method`` served off the completion queue: the span
    the instrumentation's server interceptor would make, child of the caller's
    ``traceparent``. End it with :func:`end_rpc_span`."""
    attributes = _rpc_attributes(method)
    _peer_attributes(peer, attributes)
    for key, value in metadata or ():
        if key == "user-agent":
            attributes["rpc.user_agent"] = value
            break
    return tracer.start_span(
        method, context=extract_context(metadata), kind=SpanKind.SERVER, attributes=attributes
    )


def start_client_span(
    tracer: trace.Tracer, method: str, context: Context | None = None
) -> trace.Span:
    """A CLIENT span for a call made without the client interceptors, as they would make it;
    send :func:`inject_metadata` of ``trace.set_span_in_context(span)`` with the call."""
    return tracer.start_span(
        method, context=context, kind=SpanKind.CLIENT, attributes=_rpc_attributes(method)
    )


def end_rpc_span(
    span: trace.Span, code: grpc.StatusCode, details: str = "", *, server: bool = True
) -> None:
    """Record the call's status on ``span`` (conventions: a server span is an error only for
    codes that are the server's fault, a client span for any non-OK code) and end it."""
    span.set_attribute(RPC_GRPC_STATUS_CODE, code.value[0])
    if code is not grpc.StatusCode.OK and (not server or code in _SERVER_ERRORS):
        span.set_status(Status(StatusCode.ERROR, f"{code}:{details}"))
    span.end()


def traced(method: str) -> bool:
    """Whether ``method``'s server calls get spans: probes and reflection are not work anyone
    traces (a kubelet probing every few seconds would fill traces with health checks)."""
    return not method.startswith(_UNTRACED_PREFIXES)


_UNTRACED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class TracingLayer(Layer):
    """The pipeline's tracing: a SERVER span per call of one method, on ``call.span``, ended
    with the status the call ended with."""

    def __init__(self, tracer: trace.Tracer, method: str) -> None:
        self._tracer = tracer
        self._method = method

    def admit(self, call: UnaryCall) -> Verdict:
        if spans_recorded():
            call.span = start_server_span(self._tracer, self._method, call.metadata, call.peer())
        return None

    def ended(self, call: UnaryCall, code: grpc.StatusCode, details: str) -> None:
        span = call.span
        if span is not trace.INVALID_SPAN:
            end_rpc_span(span, code, details)
