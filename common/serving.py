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
* ``grpc_server_*`` Prometheus metrics plus process metrics on a per-host registry, served on
  a separate HTTP port;
* the auth gate (:mod:`common.auth`) ahead of every handler;
* optional TLS / mTLS;
* a ready file written atomically after binding, so scripts and tests learn ephemeral ports;
* graceful shutdown on SIGTERM/SIGINT: readiness off, the caller's drain hook, then
  ``server.stop(grace)``.

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

from common.auth import AuthInterceptor, AuthPolicy
from common.buffered_metrics import ScrapeHooks
from common.grpc_metrics import GrpcServerMetrics, ServerMetricsInterceptor
from common.health import NOT_SERVING, SERVING, HealthService, ProbeServer
from common.liveness import LIVE, LivenessWatchdog, Verdict
from common.raw_unary import RawUnaryEndpoint, ServingPathError, fast_path_refusal

__all__ = [
    "LIVENESS",
    "READINESS",
    "SERVING_PATHS",
    "SERVING_PATH_ENV",
    "ServiceHost",
    "ServingFailed",
    "ServingOptions",
    "TlsOptions",
    "add_serving_arguments",
    "format_hostport",
    "parse_hostport",
    "serving_options_from_args",
]

LIVENESS = "liveness"
READINESS = "readiness"
_HEALTH_SERVICE = "grpc.health.v1.Health"
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


@dataclass(frozen=True)
class TlsOptions:
    """PEM files: this process's certificate and key, plus a CA for the peer.

    On a server, ``client_ca`` turns on mTLS (clients must present a certificate it signed).
    On a client (:meth:`channel_credentials`), ``client_ca`` verifies the server and the
    cert/key are the client's identity for mTLS.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.client_ca.read_bytes() if self.client_ca else None,
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
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
        interceptors: list[Any] = [ServerMetricsInterceptor(self.grpc_metrics)]
        self._auth = auth
        if auth is not None:
            interceptors.append(AuthInterceptor(auth))
        self.server: grpc.aio.Server = grpc.aio.server(
            interceptors=interceptors,
            options=[
                ("grpc.so_reuseport", 0),
                # Measured on the gateway at ~4,000 Infer/s: 0.194-0.198 ms of CPU per request
                # with it, 0.199-0.227 without, and no change to light-load latency.
                ("grpc.optimization_target", "throughput"),
            ],
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
        register(servicer, _GenericOnly(self.server))
        self._services.append(service_full_name)

    def add_raw_unary(self, endpoint: RawUnaryEndpoint) -> None:
        """Serve one unary method off its own completion queue (``common.raw_unary``); before
        start(). Register an ordinary handler for the method too: it serves the method if the
        endpoint cannot attach."""
        if self._started:
            raise RuntimeError("add_raw_unary must be called before start()")
        if self._auth is not None:
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
            raise OSError(f"{self.name}: cannot bind gRPC on {self.options.listen}: {exc}") from exc
        if port == 0:
            raise OSError(f"{self.name}: cannot bind gRPC on {self.options.listen}")
        self.grpc_port = port
        self.grpc_address = format_hostport(host, port)
        self._open_probe_port()
        self._choose_serving_path()
        await self.server.start()
        loop = asyncio.get_running_loop()
        await self._start_raw_endpoints(loop)
        self._start_watchdog(loop)

        if self.options.metrics_listen:
            try:
                self._metrics_http = _MetricsHttpServer(self.options.metrics_listen, self.registry)
            except OSError:
                await self.server.stop(0)
                raise
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
        """Readiness (``readiness``, ``""`` and every added service name) on or off, now."""
        self._want_ready = ready
        self._publish_health()

    @property
    def ready(self) -> bool:
        return self.health.get(READINESS) == SERVING

    async def stop(self, grace_s: float | None = None) -> None:
        """Every health name NOT_SERVING, stop the server within the grace, close /metrics."""
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
        await self.server.stop(grace)
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
        """Make :meth:`serve_until_signal` proceed as if SIGTERM had arrived."""
        self._shutdown.set()

    async def serve_until_signal(
        self, on_shutdown: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Wait for SIGTERM/SIGINT (or :meth:`request_shutdown`), then shut down gracefully:
        readiness off, ``await on_shutdown()``, ``server.stop(grace)``.

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
            _log.info("shutting down", extra={"host_name": self.name})
            self.set_ready(False)
            if on_shutdown is not None:
                await on_shutdown()
            await self.stop()
        finally:
            for sig in installed:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)
        if self.failure is not None:
            # Stopped because a raw endpoint failed, not because we were asked to.
            raise ServingFailed(self.failure)

    def _on_signal(self, sig: signal.Signals) -> None:
        _log.info("signal received", extra={"signal": sig.name, "host_name": self.name})
        self._shutdown.set()


# -- the command-line flags every server shares -----------------------------------------------


def add_serving_arguments(
    parser: argparse.ArgumentParser, *, default_listen: str, default_metrics_listen: str
) -> None:
    """``--listen --metrics-listen --ready-file --log-level --shutdown-grace --serving-path
    --health-listen --stall-limit --tls-*``."""
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
        help="on SIGTERM, how long in-flight work may take to finish (default 10)",
    )
    add_serving_path_arguments(group)
    group.add_argument("--tls-cert", type=Path, metavar="PEM", help="TLS certificate")
    group.add_argument("--tls-key", type=Path, metavar="PEM", help="TLS private key")
    group.add_argument(
        "--tls-ca",
        type=Path,
        metavar="PEM",
        help="CA for peers: on the server, require client certificates signed by it (mTLS); "
        "on outgoing calls, verify the server with it",
    )


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
        tls = TlsOptions(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_ca)
    elif args.tls_ca:
        raise SystemExit("--tls-ca needs --tls-cert and --tls-key")
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
    return ServingOptions(
        listen=args.listen,
        metrics_listen=metrics,
        ready_file=args.ready_file,
        grace_s=args.shutdown_grace,
        tls=tls,
        serving_path=args.serving_path,
        health_listen=health_listen,
        stall_limit_s=args.stall_limit,
    )
