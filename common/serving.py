"""Hosting a Halcyon gRPC service: one way every process binds, probes, measures and stops.

What it decides: the plumbing around a ``grpc.aio`` server that controller, gateway and worker
share (design sections 3 and 6), so none of them re-invents it:

* health (``grpc.health.v1``) with separate names: ``liveness`` SERVING from start until stop
  while the data path makes progress (``common.liveness`` judges it from a watchdog thread);
  ``readiness``, ``""`` and every added service's full name NOT_SERVING until
  :meth:`ServiceHost.set_ready`, and whenever liveness is off — Kubernetes' native gRPC probes
  can use either name, on the main port or on a probe port (``--health-listen``) that gRPC's
  own threads answer, off the event loop;
* which path serves the hot unary methods (``--serving-path``, ADR 0010): the completion-queue
  endpoints (``common.raw_unary``) where grpcio is a verified release, else ``grpc.aio``, said
  in one log line; an endpoint that fails for good turns liveness off and stops the process;
* server reflection, so ``grpcurl -plaintext host:port list`` works with no proto files;
* ``grpc_server_*`` Prometheus metrics plus process metrics and ``halcyon_build_info``
  (:mod:`common.build_info`) on a per-host registry, served on a separate HTTP port;
* the auth gate (:mod:`common.auth`) ahead of every handler, fail-closed: a service whose
  methods are not all in the method table cannot even be added;
* request bytes that do not decode answered ``INVALID_ARGUMENT`` on every method grpc.aio
  serves (:mod:`common.decode_guard`), inside the auth gate, never ``UNKNOWN``;
* OpenTelemetry RPC spans for every method grpc.aio serves
  (:func:`common.tracing.server_interceptor`);
* a bounded connection age (``--max-connection-age``): the server sends GOAWAY to connections
  older than it, so HTTP/2 clients — which otherwise keep one connection for ever — reconnect
  and spread over the pods a Service has now, not the ones it had when they connected;
* optional TLS, with the two jobs of a CA kept apart: ``--tls-client-ca`` requires and verifies
  client certificates on incoming calls (mTLS), ``--tls-ca`` verifies servers on outgoing calls;
* explicit gRPC limits (:data:`MAX_RECEIVE_MESSAGE_BYTES`, :data:`MAX_METADATA_BYTES`): the
  core rejects a call above them with RESOURCE_EXHAUSTED before any handler sees it;
* a ready file written atomically after binding, so scripts and tests learn ephemeral ports;
* graceful shutdown on SIGTERM/SIGINT: readiness off, keep serving for ``--drain-delay`` (so
  load balancers and health-checking clients see NOT_SERVING and stop sending), the caller's
  drain hook (the application stops taking new work and finishes what it accepted), then new
  calls held until none is pending in gRPC's transport (:mod:`common.stop_gate`, at most
  :data:`STOP_HOLD_LIMIT_S`), then ``server.stop(grace)`` and the held calls refused with
  ``SHUTTING_DOWN``. A second signal skips what is left of the delay and the grace.

Why ``so_reuseport`` is off: with it on (gRPC's default on Linux) a second process silently
binds the same port and steals half the connections; a fixed port must fail loudly instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
import grpc.aio
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)

from common.auth import Access, AuthInterceptor, AuthPolicy
from common.buffered_metrics import ScrapeHooks
from common.build_info import export_build_info
from common.decode_guard import DecodeGuard
from common.grpc_metrics import GrpcServerMetrics, ServerMetricsInterceptor
from common.health import NOT_SERVING, SERVING, HealthService, ProbeServer
from common.keepalive import KEEPALIVE_ENV, KeepalivePolicy
from common.keepalive import configure as configure_keepalive
from common.keepalive import current as current_keepalive
from common.liveness import LIVE, LivenessWatchdog, Verdict
from common.ports import describe_port_holders
from common.raw_unary import RawUnaryEndpoint, ServingPathError, fast_path_refusal
from common.stop_gate import StopGate
from common.tracing import server_interceptor

__all__ = [
    "DEFAULT_DRAIN_DELAY_S",
    "LIVENESS",
    "MAX_METADATA_BYTES",
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
    "add_serving_arguments",
    "format_hostport",
    "outgoing_tls_from_args",
    "parse_hostport",
    "serving_options_from_args",
]

LIVENESS = "liveness"
READINESS = "readiness"
_HEALTH_SERVICE = "grpc.health.v1.Health"
_OPEN = (Access.PUBLIC, Access.TENANT)  # the auth gate lets these through to the handler
# gRPC's own limits, set explicitly so the documented numbers are the enforced ones. Above
# them the core answers RESOURCE_EXHAUSTED (no ErrorInfo: no handler ever sees the call).
MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024
# One limit for all metadata of a call: soft = hard, so a rejection is certain, not random.
MAX_METADATA_BYTES = 16 * 1024
# Calls gRPC core holds for a server whose application has not yet taken them. Past core's
# default soft limit (1,000) it drops new calls at random with a bare CANCELLED before any
# handler sees them, so a retry storm lost thousands of requests with no answer at all. Held
# instead, each reaches admission and gets a typed answer (ADR 0017). A held call costs its
# arena and what flow control already let in, so the bound is memory, not correctness.
MAX_PENDING_CALLS = 50_000
# On SIGTERM, how long a server stays up with readiness off before it stops accepting calls:
# Kubernetes removes a pod from Service endpoints asynchronously, typically within a few
# seconds of the pod's termination starting.
DEFAULT_DRAIN_DELAY_S = 5.0
# After the drain hook, before the stop (ServiceHost.quiesce): new calls are held until none has
# arrived for STOP_QUIET_S (gRPC's pending calls have all been taken), STOP_HOLD_LIMIT_S at most.
# 50 ms: 32 closed-loop clients' calls were all held within ~8 ms of the gate closing.
STOP_QUIET_S = 0.05
STOP_HOLD_LIMIT_S = 0.25
_log = logging.getLogger("halcyon.serving")
# fast: the completion-queue endpoints where grpcio is verified (else aio, said once); aio: never.
SERVING_PATHS = ("fast", "aio")
SERVING_PATH_ENV = "HALCYON_SERVING_PATH"


def _default_serving_path() -> str:
    """``$HALCYON_SERVING_PATH`` if set (how the test suite runs both paths), else fast."""
    value = os.environ.get(SERVING_PATH_ENV, "").strip().lower() or "fast"
    if value not in SERVING_PATHS:
        raise ValueError(f"${SERVING_PATH_ENV} must be one of {', '.join(SERVING_PATHS)}")
    return value


def parse_hostport(value: str) -> tuple[str, int]:
    """``"127.0.0.1:50060"`` / ``"[::1]:0"`` / ``"localhost:9"`` -> ``(host, port)``."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port in {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port in {value!r} is out of range")
    return host, port


def format_hostport(host: str, port: int) -> str:
    """The inverse of :func:`parse_hostport` (IPv6 literals in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _holder_hint(listen: str) -> str:
    """``"; held by pid 42 (...)"`` when another process listens on the port, else ``""``."""
    try:
        _, port = parse_hostport(listen)
    except ValueError:
        return ""
    holders = describe_port_holders(port) if port else ""
    return f"; {holders}" if holders else ""


@dataclass(frozen=True)
class TlsOptions:
    """PEM files: this process's certificate and key, and the CAs it trusts for each direction.

    * serving (:meth:`server_credentials`): ``cert``/``key`` are the server's identity;
      ``client_ca`` set requires every client to present a certificate it signed (mTLS);
    * calling (:meth:`channel_credentials`): ``ca`` verifies the server (None: the system's
      trust roots); ``cert``/``key``, when set, are presented as the client's certificate.
    """

    cert: Path | None
    key: Path | None
    client_ca: Path | None = None
    ca: Path | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise ValueError("serving TLS needs a certificate and its key")
        ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        own = self.cert is not None and self.key is not None
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes() if self.ca else None,
            private_key=self.key.read_bytes() if own and self.key else None,
            certificate_chain=self.cert.read_bytes() if own and self.cert else None,
        )


@dataclass
class ServingOptions:
    """Where and how a host listens."""

    listen: str = "127.0.0.1:0"  # host:port for gRPC
    metrics_listen: str | None = "127.0.0.1:0"  # host:port for /metrics; None = off
    ready_file: Path | None = None  # {"grpc": "h:p", "metrics": "h:p", "pid": n}, atomically
    grace_s: float = 10.0  # SIGTERM grace for in-flight RPCs
    tls: TlsOptions | None = None  # server cert/key (+ client CA for mTLS)
    serving_path: str = field(default_factory=_default_serving_path)  # "fast" | "aio"
    health_listen: str | None = None  # host:port for a loop-free health probe port; None = off
    stall_limit_s: float = 10.0  # liveness off after this long without data-path progress
    # GOAWAY to connections older than this (gRPC adds +-10 % jitter); None = never. Calls
    # still running then get ``max_connection_age_grace_s`` before the connection closes.
    max_connection_age_s: float | None = None
    max_connection_age_grace_s: float = 30.0

    # SIGTERM: readiness off this long before the server stops accepting (the CLI's default
    # is DEFAULT_DRAIN_DELAY_S; embedded hosts and tests stop at once).
    drain_delay_s: float = 0.0
    # Which keepalive pings the server accepts (common.keepalive); None: the process's policy.
    keepalive: KeepalivePolicy | None = None


class ServingFailed(Exception):
    """:meth:`ServiceHost.serve_until_signal` stopped the host because a completion-queue
    endpoint could not go on (already logged): the process should exit non-zero."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _MetricsHttpServer:
    """Prometheus text exposition of one registry on its own port, in a daemon thread."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        host, port = parse_hostport(listen)

        class Server(_ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._httpd = make_server(
            host, port, make_wsgi_app(registry), Server, handler_class=_QuietHandler
        )
        self.host = host
        self.port: int = self._httpd.server_address[1]
        # A short poll interval so stop() returns promptly.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"metrics-http-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _GenericOnly:
    """What a generated ``add_*Servicer_to_server`` sees: it may add generic handlers only."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass  # the generic handlers added alongside serve the same methods


class ServiceHost:
    """One grpc.aio server with health (liveness + readiness names), reflection, Prometheus
    grpc_server_* metrics, auth, structured logs and graceful shutdown.

    Construct it inside the event loop that will run it (``grpc.aio`` binds the server to the
    loop current at construction), e.g. in the ``async def main()`` given to ``asyncio.run``.
    """

    def __init__(self, name: str, options: ServingOptions, auth: AuthPolicy | None) -> None:
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
        # Tracing outermost, so a call the auth gate refuses still has its span; the stop gate
        # inside the metrics, so held calls are counted. The decode guard innermost: the auth
        # gate's rejection replaces the guarded behaviour, so a caller without credentials
        # hears UNAUTHENTICATED whatever bytes it sent.
        self._stop_gate = StopGate(name)
        interceptors: list[Any] = [
            server_interceptor(),
            ServerMetricsInterceptor(self.grpc_metrics),
            self._stop_gate,
        ]
        self._auth = auth
        if auth is not None:
            interceptors.append(AuthInterceptor(auth))
        interceptors.append(DecodeGuard())
        self.server: grpc.aio.Server = grpc.aio.server(
            interceptors=interceptors, options=server_options(options)
        )
        self.health = HealthService()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
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
        generic handler only when no completion-queue endpoint (:meth:`add_raw_unary`) took
        it, which the aio server's own registered methods would pre-empt.
        """
        if self._started:
            raise RuntimeError("add_service must be called before start()")
        self._check_authorized(service_full_name)
        register(servicer, _GenericOnly(self.server))
        self._services.append(service_full_name)

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

    def add_raw_unary(self, endpoint: RawUnaryEndpoint) -> None:
        """Serve one unary method off its own completion queue (``common.raw_unary``); before
        start(). Register an ordinary handler for the method too: it serves the method if the
        endpoint cannot attach."""
        if self._started:
            raise RuntimeError("add_raw_unary must be called before start()")
        # Decided once: a public or tenant method (Infer) needs no per-call check here.
        if self._auth is not None and self._auth.required(endpoint.method) not in _OPEN:
            endpoint.authorize = self._auth.check
        endpoint.on_failure = functools.partial(self._raw_endpoint_failed, endpoint.method)
        self._raw_endpoints.append(endpoint)
        self.scrape_hooks.add(endpoint.flush_metrics)

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
        for endpoint in self._raw_endpoints:
            endpoint.hold = self._stop_gate.hold_raw
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


def server_options(options: ServingOptions) -> list[tuple[str, Any]]:
    """The gRPC core options a host's server is built with."""
    core: list[tuple[str, Any]] = [
        ("grpc.so_reuseport", 0),
        # Measured on the gateway at ~4,000 Infer/s: 0.194-0.198 ms of CPU per request
        # with it, 0.199-0.227 without, and no change to light-load latency.
        ("grpc.optimization_target", "throughput"),
        ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
        ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
        # Accept the fleet's keepalive pings, however long a call runs without data: gRPC's
        # default answers a ping every ~minute on a quiet call with GOAWAY too_many_pings.
        *(options.keepalive or current_keepalive()).server_options(),
    ]
    if options.max_connection_age_s:
        core += [
            ("grpc.max_connection_age_ms", max(1, round(options.max_connection_age_s * 1000))),
            (
                "grpc.max_connection_age_grace_ms",
                max(0, round(options.max_connection_age_grace_s * 1000)),
            ),
        ]
    return core


# -- the command-line flags every server shares -----------------------------------------------


def add_serving_arguments(
    parser: argparse.ArgumentParser,
    *,
    default_listen: str,
    default_metrics_listen: str,
    default_max_connection_age: float = 0.0,
) -> None:
    """``--listen --metrics-listen --ready-file --log-level --shutdown-grace --serving-path
    --health-listen --stall-limit --max-connection-age --max-connection-age-grace
    --keepalive-interval --drain-delay --tls-cert --tls-key --tls-client-ca --tls-ca``."""
    group = parser.add_argument_group("serving")
    group.add_argument(
        "--listen",
        default=default_listen,
        metavar="HOST:PORT",
        help=f"gRPC listen address; port 0 picks a free one (default {default_listen})",
    )
    group.add_argument(
        "--metrics-listen",
        default=default_metrics_listen,
        metavar="HOST:PORT",
        help=f"Prometheus /metrics listen address, or 'off' (default {default_metrics_listen})",
    )
    group.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help='after binding, write {"grpc": ..., "metrics": ..., "health": ..., "pid": ...} here '
        "atomically",
    )
    group.add_argument(
        "--log-level",
        default="INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="JSON log lines on stderr at this level (default INFO)",
    )
    group.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, after the drain delay, how long in-flight work may take to finish "
        "(default 10)",
    )
    add_serving_path_arguments(group)
    group.add_argument(
        "--max-connection-age",
        type=float,
        default=default_max_connection_age,
        metavar="SECONDS",
        help="send GOAWAY to client connections older than this (+-10%% jitter), so "
        "long-lived HTTP/2 clients reconnect and rebalance across replicas; 0 = never "
        "(default %(default)s)",
    )
    group.add_argument(
        "--max-connection-age-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="after GOAWAY, how long calls still running on the old connection may take "
        "before it is closed (default %(default)s)",
    )
    group.add_argument(
        "--keepalive-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="HTTP/2 keepalive: ping peers on the channels this process opens this often "
        "while calls run or connections idle, and accept pings from clients twice as often; "
        f"use the same value on every process of a fleet (default ${KEEPALIVE_ENV} or 20)",
    )
    group.add_argument(
        "--drain-delay",
        type=_non_negative_seconds,
        default=DEFAULT_DRAIN_DELAY_S,
        metavar="SECONDS",
        help="on SIGTERM, keep serving this long with readiness NOT_SERVING so load balancers "
        f"stop sending, then stop accepting; a second signal cuts it short "
        f"(default {DEFAULT_DRAIN_DELAY_S:g})",
    )
    tls = parser.add_argument_group("TLS (off unless given)")
    tls.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="this process's certificate: serve TLS with it, and present it as the client "
        "certificate on outgoing calls (default: plaintext)",
    )
    tls.add_argument(
        "--tls-key", type=Path, metavar="PEM", help="the private key of --tls-cert (default: none)"
    )
    tls.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="incoming calls: require a client certificate signed by this CA (mutual TLS; "
        "needs --tls-cert/--tls-key) (default: no client certificate asked)",
    )
    tls.add_argument(
        "--tls-ca",
        type=Path,
        metavar="PEM",
        help="outgoing calls: use TLS and verify the server against this CA (default: TLS with "
        "the system's trust roots when --tls-cert is given, else plaintext)",
    )


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (value >= 0.0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text!r}")
    return value


def add_serving_path_arguments(group: argparse._ArgumentGroup) -> None:
    """``--serving-path --health-listen --stall-limit`` (ADR 0010)."""
    try:
        default_path = _default_serving_path()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    group.add_argument(
        "--serving-path",
        choices=SERVING_PATHS,
        default=default_path,
        help="what serves the hot unary methods (the gateway's Infer, the worker's "
        "ExecuteBatch): 'fast' = gRPC's completion queue where grpcio is a release the test "
        "suite verified, else grpc.aio with one log line saying why; 'aio' = always grpc.aio "
        f"(default ${SERVING_PATH_ENV} or fast: %(default)s)",
    )
    group.add_argument(
        "--health-listen",
        default="off",
        metavar="HOST:PORT",
        help="also answer grpc.health.v1 (liveness, readiness) on this plaintext port from "
        "gRPC's own threads, off the event loop: for Kubernetes probes (default %(default)s)",
    )
    group.add_argument(
        "--stall-limit",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="liveness turns NOT_SERVING when the event loop runs nothing, or a completion "
        "queue holds calls nobody takes, for this long (default %(default)s)",
    )


def serving_options_from_args(args: argparse.Namespace) -> ServingOptions:
    """ServingOptions from the flags :func:`add_serving_arguments` added."""
    tls: TlsOptions | None = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise SystemExit("--tls-cert and --tls-key go together")
        tls = TlsOptions(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_client_ca)
    elif args.tls_client_ca:
        raise SystemExit(
            "--tls-client-ca (require client certificates) needs --tls-cert and --tls-key"
        )
    metrics = args.metrics_listen
    if metrics is not None and metrics.strip().lower() in ("", "off", "none"):
        metrics = None
    health_listen = args.health_listen
    if health_listen is not None and health_listen.strip().lower() in ("", "off", "none"):
        health_listen = None
    if health_listen is not None:
        try:
            parse_hostport(health_listen)
        except ValueError as exc:
            raise SystemExit(f"--health-listen: {exc}") from None
    if not args.stall_limit > 0:
        raise SystemExit("--stall-limit must be a positive number of seconds")
    if args.max_connection_age < 0 or args.max_connection_age_grace < 0:
        raise SystemExit("--max-connection-age and --max-connection-age-grace must be >= 0")
    # Process-wide: the channels this process opens (to workers, to the controller) ping at
    # the same interval its server accepts.
    try:
        keepalive = configure_keepalive(getattr(args, "keepalive_interval", None))
    except ValueError as exc:
        raise SystemExit(f"--keepalive-interval: {exc}") from None
    return ServingOptions(
        listen=args.listen,
        metrics_listen=metrics,
        ready_file=args.ready_file,
        grace_s=args.shutdown_grace,
        tls=tls,
        serving_path=args.serving_path,
        health_listen=health_listen,
        stall_limit_s=args.stall_limit,
        max_connection_age_s=args.max_connection_age or None,
        max_connection_age_grace_s=args.max_connection_age_grace,
        drain_delay_s=args.drain_delay,
        keepalive=keepalive,
    )


def outgoing_tls_from_args(args: argparse.Namespace) -> TlsOptions | None:
    """How this process calls its peers: TLS when ``--tls-ca`` or ``--tls-cert`` is given
    (verifying servers against ``--tls-ca``, else the system roots; presenting ``--tls-cert``
    as the client certificate when given), else None for plaintext."""
    if not (args.tls_ca or args.tls_cert):
        return None
    return TlsOptions(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
