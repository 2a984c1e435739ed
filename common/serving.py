"""Hosting a Halcyon gRPC service: one way every process binds, probes, measures and stops.

What it decides: the plumbing around a ``grpc.aio`` server that controller, gateway and worker
share (design sections 3 and 6), so none of them re-invents it. :class:`ServiceHost` lives here;
the rest is in sibling modules and imported back, so existing imports keep working:

* :mod:`common.serving_options` -- ``HOST:PORT`` parsing, :class:`TlsOptions` (``--tls-client-ca``
  verifies clients, ``--tls-ca`` verifies servers), :class:`ServingOptions`, the serving-path
  choice, the explicit gRPC limits and core options (why ``so_reuseport`` is off);
* :mod:`common.metrics_http` -- the ``/metrics`` HTTP server on its own port;
* :mod:`common.serving_flags` -- the command-line flags every server shares.

What :class:`ServiceHost` adds on top:

* health (``grpc.health.v1``) with separate names: ``liveness`` SERVING from start until stop
  while the data path makes progress (``common.liveness`` judges it from a watchdog thread);
  ``readiness``, ``""`` and every added service's full name NOT_SERVING until
  :meth:`ServiceHost.set_ready`, and whenever liveness is off -- on the main port or on a probe
  port (``--health-listen``) that gRPC's own threads answer, off the event loop;
* which path serves the hot unary methods (``--serving-path``, ADR 0010): the completion-queue
  endpoints (``common.raw_unary``) where grpcio is a verified release, else ``grpc.aio``, said
  in one log line; an endpoint that fails for good turns liveness off and stops the process;
* one unary pipeline (:mod:`common.pipeline`) per unary method, composed here in one order
  (:meth:`ServiceHost._layers`) and run by both transports — the completion queue and
  ``grpc.aio`` (:mod:`common.aio_unary`): RPC spans, ``grpc_server_*`` metrics, the stop gate,
  the method's size limit, the auth gate (:mod:`common.auth`, fail-closed), decoding and
  error mapping. Streaming methods get the same concerns from ``grpc.aio`` interceptors;
* server reflection, process metrics plus ``halcyon_build_info`` (:mod:`common.build_info`) on
  a per-host registry;
* a ready file written atomically after binding, so scripts and tests learn ephemeral ports;
* graceful shutdown on SIGTERM/SIGINT: readiness off, keep serving for ``--drain-delay``, the
  caller's drain hook, then new calls held until none is pending in gRPC's transport
  (:mod:`common.stop_gate`, at most :data:`STOP_HOLD_LIMIT_S`), then ``server.stop(grace)``
  and the held calls refused with ``SHUTTING_DOWN``. A second signal skips what is left of the
  delay and the grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from common.aio_unary import PipelinedHandlers, StreamingOnly, call_style_handler
from common.auth import AuthInterceptor, AuthPolicy, TenantCheck
from common.buffered_metrics import ScrapeHooks
from common.build_info import export_build_info
from common.call_metrics import CallMetrics
from common.decode_guard import DecodeGuard, message_type_of
from common.grpc_metrics import GrpcServerMetrics, ServerMetricsInterceptor, split_method
from common.health import NOT_SERVING, SERVING, HealthService, ProbeServer
from common.host_layers import AddedInterceptors, HostLayer
from common.liveness import LIVE, LivenessWatchdog, Verdict
from common.metrics_http import _MetricsHttpServer, _QuietHandler, _ThreadingWSGIServer
from common.pipeline import Layer, UnaryHandler, UnaryPipeline
from common.ports import describe_port_holders
from common.raw_unary import RawUnaryEndpoint, ServingPathError, fast_path_refusal
from common.serving_flags import (
    _non_negative_seconds,
    add_serving_arguments,
    add_serving_path_arguments,
    outgoing_tls_from_args,
    serving_options_from_args,
)
from common.serving_options import (
    DEFAULT_DRAIN_DELAY_S,
    MAX_METADATA_BYTES,
    MAX_PENDING_CALLS,
    MAX_RECEIVE_MESSAGE_BYTES,
    SERVING_PATH_ENV,
    SERVING_PATHS,
    ServingOptions,
    TlsOptions,
    _default_serving_path,
    format_hostport,
    parse_hostport,
    server_options,
)
from common.size_limit import SizeLimit
from common.stop_gate import StopGate
from common.tracing import StreamTracing, TracingLayer, traced

__all__ = [
    "DEFAULT_DRAIN_DELAY_S",
    "LIVENESS",
    "MAX_METADATA_BYTES",
    "MAX_PENDING_CALLS",
    "MAX_RECEIVE_MESSAGE_BYTES",
    "READINESS",
    "SERVING_PATHS",
    "SERVING_PATH_ENV",
    "STOP_HOLD_LIMIT_S",
    "STOP_QUIET_S",
    "ServiceHost",
    "ServingFailed",
    "ServingOptions",
    "TlsOptions",
    "_MetricsHttpServer",
    "_QuietHandler",
    "_ThreadingWSGIServer",
    "_default_serving_path",
    "_non_negative_seconds",
    "add_serving_arguments",
    "add_serving_path_arguments",
    "format_hostport",
    "outgoing_tls_from_args",
    "parse_hostport",
    "server_options",
    "serving_options_from_args",
]

LIVENESS = "liveness"
READINESS = "readiness"
_HEALTH_SERVICE = "grpc.health.v1.Health"
_NEVER_HELD = f"/{_HEALTH_SERVICE}/"  # health is answered to the end, never held
# After the drain hook, before the stop (ServiceHost.quiesce): new calls are held until none has
# arrived for STOP_QUIET_S (gRPC's pending calls have all been taken), STOP_HOLD_LIMIT_S at most.
# 50 ms: 32 closed-loop clients' calls were all held within ~8 ms of the gate closing.
STOP_QUIET_S = 0.05
STOP_HOLD_LIMIT_S = 0.25
_log = logging.getLogger("halcyon.serving")


def _holder_hint(listen: str) -> str:
    """``"; held by pid 42 (...)"`` when another process listens on the port, else ``""``."""
    try:
        _, port = parse_hostport(listen)
    except ValueError:
        return ""
    holders = describe_port_holders(port) if port else ""
    return f"; {holders}" if holders else ""


class ServingFailed(Exception):
    """:meth:`ServiceHost.serve_until_signal` stopped the host because a completion-queue
    endpoint could not go on (already logged): the process should exit non-zero."""


class _GenericOnly:
    """What a generated ``add_*Servicer_to_server`` sees: it may add generic handlers only,
    and each of its unary methods is served behind its pipeline (``common.aio_unary``)."""

    def __init__(self, host: ServiceHost) -> None:
        self._host = host

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        host = self._host
        host.server.add_generic_rpc_handlers(
            tuple(PipelinedHandlers(h, host._servicer_pipeline, host._unary) for h in handlers)
        )

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass  # the generic handlers added alongside serve the same methods


class ServiceHost:
    """One grpc.aio server with health (liveness + readiness names), reflection, Prometheus
    grpc_server_* metrics, auth, structured logs and graceful shutdown.

    Construct it inside the event loop that will run it (``grpc.aio`` binds the server to the
    loop current at construction), e.g. in the ``async def main()`` given to ``asyncio.run``.
    """

    def __init__(
        self,
        name: str,
        options: ServingOptions,
        auth: AuthPolicy | None,
        *,
        tracer: trace.Tracer | None = None,
    ) -> None:
        """``tracer`` makes the unary methods' SERVER spans (default: ``halcyon.<name>`` on
        the global provider)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "construct ServiceHost inside a running event loop (grpc.aio binds the server "
                "to the loop current at construction)"
            ) from None
        self.name = name
        self.options = options
        self.registry = CollectorRegistry()
        # First in the registry: buffered hot-path counters are handed over before any family
        # they feed is read.
        self.scrape_hooks = ScrapeHooks()
        self.registry.register(self.scrape_hooks)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.grpc_metrics = GrpcServerMetrics(self.registry)
        self._call_metrics = CallMetrics(self.grpc_metrics)
        self.scrape_hooks.add(self._call_metrics.flush)
        self._tracer = tracer if tracer is not None else trace.get_tracer(f"halcyon.{name}")
        self._stop_gate = StopGate(name)
        self._auth = auth
        # Streaming methods: the same concerns as interceptors, in the pipeline's order
        # (see _layers); unary handlers pass straight through them.
        streaming: list[Any] = [
            StreamTracing(self._tracer),
            ServerMetricsInterceptor(self._call_metrics.for_method),
            self._stop_gate,
        ]
        if auth is not None:
            streaming.append(AuthInterceptor(auth))
        self._added = AddedInterceptors()
        streaming.append(self._added)
        streaming.append(DecodeGuard())
        self.server: grpc.aio.Server = grpc.aio.server(
            interceptors=[StreamingOnly(streaming)], options=server_options(options)
        )
        self._unary: set[str] = set()  # methods added with add_unary
        self.health = HealthService()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, _GenericOnly(self))
        self._services: list[str] = []
        self._raw_endpoints: list[RawUnaryEndpoint] = []
        # Health as published: readiness is what the host was told AND live (see _publish).
        self._want_ready = False
        self._verdict: Verdict = LIVE
        self._health_lock = threading.Lock()
        self._probe: ProbeServer | None = None
        self._watchdog: LivenessWatchdog | None = None
        self.serving_path = "aio"  # what serves the raw endpoints' methods, once started
        self.failure: str | None = None  # why a raw endpoint stopped for good
        self.health_address: str | None = None
        self._metrics_http: _MetricsHttpServer | None = None
        self._shutdown = asyncio.Event()
        self._hurry = asyncio.Event()  # a second signal: skip what is left of delay and grace
        self._draining = False  # readiness stays off once shutdown began
        self._started = False
        self._stopped = False
        self.grpc_address = ""
        self.grpc_port = 0
        self.metrics_address: str | None = None
        self.metrics_port: int | None = None

    def add_service(
        self,
        register: Callable[[Any, grpc.aio.Server], None],
        servicer: Any,
        service_full_name: str,
    ) -> None:
        """Register a servicer, e.g. ``add_WorkerServiceServicer_to_server``; before start().

        Its methods are registered as generic handlers only: the core hands a method to a
        generic handler only when no completion-queue endpoint (:meth:`add_unary`) took it,
        which the aio server's own registered methods would pre-empt. Each unary method runs
        behind its pipeline (:meth:`_layers`); a method :meth:`add_unary` claims is served
        by that handler instead.
        """
        if self._started:
            raise RuntimeError("add_service must be called before start()")
        self._check_authorized(service_full_name)
        register(servicer, _GenericOnly(self))
        self._services.append(service_full_name)

    # -- the unary pipeline ---------------------------------------------------------------------

    def _layers(
        self, method: str, max_request_bytes: int | None, tenant_check: TenantCheck | None
    ) -> list[Layer]:
        """THE order of every unary call's layers, outermost first; the pipeline then decodes
        the request and runs the handler, mapping what it raises to INTERNAL.

        1. tracing — outermost, so a refused call still has its span (not for health and
           reflection);
        2. metrics — every call counted, held and refused ones too;
        3. stop gate — holds new calls once the host stops (never health);
        4. size limit — huge bytes refused unread whatever the credential, as gRPC core's own
           limit refuses them (only where the method has one);
        5. auth — the credential before the bytes are decoded: undecodable bytes without a
           key are UNAUTHENTICATED (only where the method needs a check);
        6. the application's layers (:meth:`add_layer`), in the order added;
        7. decode, 8. handler (``common.pipeline``).
        """
        layers: list[Layer] = []
        if traced(method):
            layers.append(TracingLayer(self._tracer, method))
        layers.append(self._call_metrics.for_method(method))
        if not method.startswith(_NEVER_HELD):
            layers.append(self._stop_gate)
        if max_request_bytes is not None:
            layers.append(SizeLimit(method, max_request_bytes))
        if self._auth is not None:
            auth = self._auth.layer_for(method, tenant_check)
            if auth is not None:
                layers.append(auth)
        layers.extend(self._added.chain)
        return layers

    def add_layer(self, layer: HostLayer) -> None:
        """Run ``layer`` on every call after auth; before add_service() and start()."""
        if self._started or self._services:
            raise RuntimeError("add_layer must be called before add_service and start()")
        self._added.chain.append(layer)

    def _servicer_pipeline(self, method: str, handler: grpc.RpcMethodHandler) -> UnaryPipeline:
        """The pipeline of an added servicer's unary method (its own handler runs after it)."""
        deserializer = handler.request_deserializer
        return UnaryPipeline(
            method,
            self._layers(method, None, None),
            deserializer=deserializer,
            message_type=message_type_of(method, deserializer) if deserializer else "",
            handler=None,
        )

    def add_unary(
        self,
        method: str,
        handler: UnaryHandler,
        *,
        deserializer: Callable[[bytes], Any] | None,
        max_request_bytes: int | None = None,
        tenant_check: TenantCheck | None = None,
    ) -> None:
        """Serve the unary ``/pkg.Service/Method`` with ``handler(request, call)``, which
        answers through the call (:class:`common.call.UnaryCall`); before start().

        Served off its own completion queue where the fast path may attach (``common.raw_unary``,
        ADR 0010), else through ``grpc.aio``; the same pipeline either way. ``deserializer``
        None hands the handler the request bytes; ``max_request_bytes`` refuses larger requests
        unread (``common.size_limit``); ``tenant_check`` is a TENANT method's credential check
        (``common.auth``), run before the request is decoded.
        """
        if self._started:
            raise RuntimeError("add_unary must be called before start()")
        if method in self._unary:
            raise ValueError(f"{method} is already added")
        service, name = split_method(method)
        self._check_authorized(service)
        pipeline = UnaryPipeline(
            method,
            self._layers(method, max_request_bytes, tenant_check),
            deserializer=deserializer,
            message_type=message_type_of(method, deserializer) if deserializer else "",
            handler=handler,
        )
        self._unary.add(method)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {name: call_style_handler(pipeline)}),)
        )
        endpoint = RawUnaryEndpoint(pipeline)
        endpoint.on_failure = functools.partial(self._raw_endpoint_failed, method)
        self._raw_endpoints.append(endpoint)
        if service not in self._services:
            self._services.append(service)

    def _check_authorized(self, service_full_name: str) -> None:
        """Fail-closed at build time: every method of the service must have a rule."""
        if self._auth is None:
            return
        try:
            service = descriptor_pool.Default().FindServiceByName(service_full_name)
        except KeyError:  # no descriptor (a hand-written generic service): runtime check only
            return
        unlisted = self._auth.unlisted(f"/{service_full_name}/{m.name}" for m in service.methods)
        if unlisted:
            raise ValueError(
                f"{self.name}: no authorization rule for {', '.join(unlisted)}; name each "
                "method's access in common.auth.METHOD_ACCESS"
            )

    async def start(self) -> None:
        """Bind and start; afterwards the addresses are set and the ready file is written."""
        if self._started:
            raise RuntimeError("already started")
        self._started = True
        reflection.enable_server_reflection(
            (*self._services, _HEALTH_SERVICE, reflection.SERVICE_NAME), self.server
        )
        self._publish_health()

        host, _ = parse_hostport(self.options.listen)
        try:
            if self.options.tls is not None:
                port = self.server.add_secure_port(
                    self.options.listen, self.options.tls.server_credentials()
                )
            else:
                port = self.server.add_insecure_port(self.options.listen)
        except RuntimeError as exc:
            raise OSError(
                f"{self.name}: cannot bind gRPC on {self.options.listen}: {exc}"
                + _holder_hint(self.options.listen)
            ) from exc
        if port == 0:
            raise OSError(
                f"{self.name}: cannot bind gRPC on {self.options.listen}"
                + _holder_hint(self.options.listen)
            )
        self.grpc_port = port
        self.grpc_address = format_hostport(host, port)
        self._open_probe_port()
        self._choose_serving_path()
        export_build_info(self.registry, self.name, self.serving_path)
        await self.server.start()
        loop = asyncio.get_running_loop()
        await self._start_raw_endpoints(loop)
        self._start_watchdog(loop)

        if self.options.metrics_listen:
            try:
                self._metrics_http = _MetricsHttpServer(self.options.metrics_listen, self.registry)
            except OSError as exc:
                await self.server.stop(0)
                raise OSError(
                    f"{self.name}: cannot bind /metrics on {self.options.metrics_listen}: "
                    f"{exc.strerror or exc}" + _holder_hint(self.options.metrics_listen)
                ) from exc
            self.metrics_port = self._metrics_http.port
            self.metrics_address = format_hostport(self._metrics_http.host, self.metrics_port)
        if self.options.ready_file is not None:
            self._write_ready_file(self.options.ready_file)
        _log.info(
            "serving",
            extra={
                "host_name": self.name,
                "grpc": self.grpc_address,
                "metrics": self.metrics_address,
                "tls": self.options.tls is not None,
                "health": self.health_address,
                "serving_path": self.serving_path,
            },
        )

    def _readiness_names(self) -> list[str]:
        return [READINESS, "", *self._services]

    # -- serving path and liveness (ADR 0010) ---------------------------------------------------

    def _choose_serving_path(self) -> None:
        """Attach the raw endpoints where allowed; otherwise say once why grpc.aio serves."""
        if not self._raw_endpoints:
            return
        methods = [e.method for e in self._raw_endpoints]
        if self.options.serving_path == "aio":
            why: str | None = "--serving-path aio"
        else:
            why = fast_path_refusal()
            if why is None:
                refusals = [r for e in self._raw_endpoints if (r := e.attach(self.server))]
                why = refusals[0] if refusals else None
        self.serving_path = "fast" if why is None else "aio"
        Gauge(
            "halcyon_serving_path_info",
            "1 for the path serving this process's hot unary methods: fast (completion queue) "
            "or aio (grpc.aio, when forced or when grpcio is not a verified release)",
            ["path"],
            registry=self.registry,
        ).labels(self.serving_path).set(1)
        if why is not None:
            forced = self.options.serving_path == "aio"
            _log.log(
                logging.INFO if forced else logging.WARNING,
                f"serving {', '.join(methods)} through grpc.aio: {why}",
                extra={"serving_path": "aio", "grpcio": grpc.__version__},
            )

    async def _start_raw_endpoints(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            for endpoint in self._raw_endpoints:
                endpoint.start(loop)
        except ServingPathError:
            # Registered with the core but unable to take calls: stop before anyone waits.
            await self.server.stop(0)
            for endpoint in self._raw_endpoints:
                await endpoint.close()
            raise

    def _open_probe_port(self) -> None:
        if not self.options.health_listen:
            return
        self._probe = ProbeServer(self.options.health_listen)
        host, _ = parse_hostport(self.options.health_listen)
        self.health_address = format_hostport(host, self._probe.port)
        self._publish_health()

    def _start_watchdog(self, loop: asyncio.AbstractEventLoop) -> None:
        pumps = [e for e in self._raw_endpoints if e.attached]
        self._watchdog = LivenessWatchdog(
            loop, pumps, self.options.stall_limit_s, self._liveness_changed
        )
        self._watchdog.start()

    def _liveness_changed(self, verdict: Verdict) -> None:
        """The watchdog's thread: the probe port at once, the loop's health when it runs."""
        self._verdict = verdict
        if verdict.live:
            _log.info("liveness SERVING again", extra={"host_name": self.name})
        else:
            _log.warning(f"liveness NOT_SERVING: {verdict.reason}", extra={"host_name": self.name})
        self._publish_probe()
        if self._watchdog is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._watchdog.loop.call_soon_threadsafe(self._publish_health)

    def _raw_endpoint_failed(self, method: str, reason: str) -> None:
        """A raw endpoint cannot go on (on the loop): calls would wait for nothing. Liveness
        and readiness off, then stop like on SIGTERM; :meth:`serve_until_signal` exits 1."""
        if self.failure is not None:
            return
        self.failure = f"{method}: {reason}"
        _log.error(
            f"the completion-queue path for {method} cannot go on ({reason}); liveness and "
            "readiness are NOT_SERVING and the process stops (set --serving-path aio if it "
            "recurs)",
            extra={"host_name": self.name},
        )
        self._publish_health()
        self.request_shutdown()

    def _health_statuses(self) -> dict[str, int]:
        live = self._verdict.live and self.failure is None
        ready = SERVING if live and self._want_ready else NOT_SERVING
        return {LIVENESS: SERVING if live else NOT_SERVING} | {
            name: ready for name in self._readiness_names()
        }

    def _publish_probe(self) -> None:
        """Any thread."""
        with self._health_lock:
            if self._probe is not None:
                for name, status in self._health_statuses().items():
                    self._probe.set(name, status)

    def _publish_health(self) -> None:
        """On the loop: the main port's health and the probe port's."""
        for name, status in self._health_statuses().items():
            self.health.set(name, status)
        self._publish_probe()

    def _write_ready_file(self, path: Path) -> None:
        payload = {
            "grpc": self.grpc_address,
            "metrics": self.metrics_address,
            "health": self.health_address,
            "pid": os.getpid(),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload) + "\n")
        os.replace(tmp, path)

    def set_ready(self, ready: bool) -> None:
        """Readiness (``readiness``, ``""`` and every added service name) on or off, now.

        Once shutdown began, readiness stays off whatever the caller asks."""
        if ready and self._draining:
            return
        self._want_ready = ready
        self._publish_health()

    @property
    def ready(self) -> bool:
        return self.health.get(READINESS) == SERVING

    async def quiesce(self) -> None:
        """Hold every new call from now until :meth:`stop` (which refuses them with
        ``SHUTTING_DOWN`` once the server's stop has begun), and return once no call is
        pending in gRPC's transport any more: none has arrived for :data:`STOP_QUIET_S`, or
        :data:`STOP_HOLD_LIMIT_S` has passed (:mod:`common.stop_gate`)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        await self._stop_gate.quiet(STOP_QUIET_S, STOP_HOLD_LIMIT_S)
        _log.info(
            "stopping the server",
            extra={
                "host_name": self.name,
                "held_calls": self._stop_gate.held,
                "held_for_s": round(loop.time() - began, 3),
            },
        )

    async def stop(self, grace_s: float | None = None) -> None:
        """Every health name NOT_SERVING, stop the server within the grace (calls held by
        :meth:`quiesce` are refused as it begins), close /metrics."""
        if self._stopped:
            return
        self._stopped = True
        self.health.shutdown()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._probe is not None:
            self._probe.shutdown()
        grace = self.options.grace_s if grace_s is None else grace_s
        for endpoint in self._raw_endpoints:
            endpoint.stop_accepting()
        stopping = asyncio.ensure_future(self.server.stop(grace))
        # Held calls are answered right after the stop's first step, which sends GOAWAY (in
        # grpc.aio it runs to the core's shutdown call without yielding; callbacks run in the
        # order they were scheduled): the clients' next calls then go to another server.
        asyncio.get_running_loop().call_soon(self._stop_gate.release)
        await stopping
        for endpoint in self._raw_endpoints:
            await endpoint.close()
        if self._probe is not None:
            await asyncio.to_thread(self._probe.stop)
            self._probe = None
        if self._metrics_http is not None:
            await asyncio.to_thread(self._metrics_http.close)
            self._metrics_http = None
        _log.info("stopped", extra={"host_name": self.name})

    def request_shutdown(self) -> None:
        """Make :meth:`serve_until_signal` proceed as if SIGTERM had arrived (a second call
        hastens the stop, as a second signal does)."""
        if self._shutdown.is_set():
            self._hurry.set()
        self._shutdown.set()

    async def serve_until_signal(
        self, on_shutdown: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Wait for SIGTERM/SIGINT (or :meth:`request_shutdown`), then shut down gracefully:
        readiness off, keep serving for the drain delay, ``await on_shutdown()``, hold new
        calls until none is pending (:mod:`common.stop_gate`), ``server.stop(grace)`` and
        refuse the held calls. A second signal hastens this: the rest of the delay is skipped
        and, once stopping, the drain hook is cancelled and in-flight calls are ended now.

        Raises :class:`ServingFailed` after that stop if it began because a completion-queue
        endpoint failed for good rather than on request."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                _log.warning("cannot install a %s handler", sig.name)
        try:
            await self._shutdown.wait()
            self._draining = True
            self.set_ready(False)
            delay = self.options.drain_delay_s
            _log.info(
                "shutting down: readiness off, serving on for the drain delay",
                extra={"host_name": self.name, "drain_delay_s": delay},
            )
            if delay > 0 and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), delay)
            await self._stop_or_hurry(on_shutdown)
        finally:
            for sig in installed:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)
        if self.failure is not None:
            # Stopped because a raw endpoint failed, not because we were asked to.
            raise ServingFailed(self.failure)

    async def _stop_or_hurry(self, on_shutdown: Callable[[], Awaitable[None]] | None) -> None:
        async def graceful() -> None:
            if on_shutdown is not None:
                await on_shutdown()
            await self.quiesce()
            await self.stop()

        stopping = asyncio.ensure_future(graceful())
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait((stopping, hurry), return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()
        if stopping.done():
            stopping.result()
            return
        _log.warning("second signal: stopping now", extra={"host_name": self.name})
        stopping.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await stopping
        self._stopped = False  # stop() may have begun with a long grace: end it now
        await self.stop(0)

    def _on_signal(self, sig: signal.Signals) -> None:
        _log.info("signal received", extra={"signal": sig.name, "host_name": self.name})
        self.request_shutdown()
