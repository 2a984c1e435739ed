"""Hosting a Halcyon gRPC service: one way every process binds, probes, measures and stops.

What it decides: the plumbing around a ``grpc.aio`` server that controller, gateway and worker
share (design sections 3 and 6), so none of them re-invents it:

* health (``grpc.health.v1``) with separate names: ``liveness`` SERVING from start until stop;
  ``readiness``, ``""`` and every added service's full name NOT_SERVING until
  :meth:`ServiceHost.set_ready` — Kubernetes' native gRPC probes can use either name;
* server reflection, so ``grpcurl -plaintext host:port list`` works with no proto files;
* ``grpc_server_*`` Prometheus metrics plus process metrics on a per-host registry, served on
  a separate HTTP port;
* the auth gate (:mod:`common.auth`) ahead of every handler, fail-closed: a service whose
  methods are not all in the method table cannot even be added;
* optional TLS, with the two jobs of a CA kept apart: ``--tls-client-ca`` requires and verifies
  client certificates on incoming calls (mTLS), ``--tls-ca`` verifies servers on outgoing calls;
* explicit gRPC limits (:data:`MAX_RECEIVE_MESSAGE_BYTES`, :data:`MAX_METADATA_BYTES`): the
  core rejects a call above them with RESOURCE_EXHAUSTED before any handler sees it;
* a ready file written atomically after binding, so scripts and tests learn ephemeral ports;
* graceful shutdown on SIGTERM/SIGINT: readiness off, keep serving for ``--drain-delay`` (so
  load balancers see NOT_SERVING and stop sending), the caller's drain hook, then
  ``server.stop(grace)``. A second signal skips what is left of the delay and the grace.

Why ``so_reuseport`` is off: with it on (gRPC's default on Linux) a second process silently
binds the same port and steals half the connections; a fixed port must fail loudly instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)

from common.auth import Access, AuthInterceptor, AuthPolicy
from common.buffered_metrics import ScrapeHooks
from common.grpc_metrics import GrpcServerMetrics, ServerMetricsInterceptor
from common.health import NOT_SERVING, SERVING, HealthService
from common.ports import describe_port_holders
from common.raw_unary import RawUnaryEndpoint

__all__ = [
    "DEFAULT_DRAIN_DELAY_S",
    "LIVENESS",
    "MAX_METADATA_BYTES",
    "MAX_RECEIVE_MESSAGE_BYTES",
    "READINESS",
    "ServiceHost",
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
# On SIGTERM, how long a server stays up with readiness off before it stops accepting calls:
# Kubernetes removes a pod from Service endpoints asynchronously, typically within a few
# seconds of the pod's termination starting.
DEFAULT_DRAIN_DELAY_S = 5.0
_log = logging.getLogger("halcyon.serving")


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
    # SIGTERM: readiness off this long before the server stops accepting (the CLI's default
    # is DEFAULT_DRAIN_DELAY_S; embedded hosts and tests stop at once).
    drain_delay_s: float = 0.0


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
                ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
                ("grpc.max_metadata_size", MAX_METADATA_BYTES),
                ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
            ],
        )
        self.health = HealthService()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._services: list[str] = []
        self._raw_endpoints: list[RawUnaryEndpoint] = []
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
        self.health.set(LIVENESS, SERVING)
        for name in self._readiness_names():
            self.health.set(name, NOT_SERVING)

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
        for endpoint in self._raw_endpoints:
            endpoint.attach(self.server)
        await self.server.start()
        loop = asyncio.get_running_loop()
        for endpoint in self._raw_endpoints:
            endpoint.start(loop)

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
            },
        )

    def _readiness_names(self) -> list[str]:
        return [READINESS, "", *self._services]

    def _write_ready_file(self, path: Path) -> None:
        payload = {"grpc": self.grpc_address, "metrics": self.metrics_address, "pid": os.getpid()}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(payload) + "\n")
        os.replace(tmp, path)

    def set_ready(self, ready: bool) -> None:
        """Readiness (``readiness``, ``""`` and every added service name) on or off, now.

        Once shutdown began, readiness stays off whatever the caller asks."""
        if ready and self._draining:
            return
        status = SERVING if ready else NOT_SERVING
        for name in self._readiness_names():
            self.health.set(name, status)

    @property
    def ready(self) -> bool:
        return self.health.get(READINESS) == SERVING

    async def stop(self, grace_s: float | None = None) -> None:
        """Every health name NOT_SERVING, stop the server within the grace, close /metrics."""
        if self._stopped:
            return
        self._stopped = True
        self.health.shutdown()
        grace = self.options.grace_s if grace_s is None else grace_s
        for endpoint in self._raw_endpoints:
            endpoint.stop_accepting()
        await self.server.stop(grace)
        for endpoint in self._raw_endpoints:
            await endpoint.close()
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
        readiness off, keep serving for the drain delay, ``await on_shutdown()``,
        ``server.stop(grace)``. A second signal hastens this: the rest of the delay is skipped
        and, once stopping, the drain hook is cancelled and in-flight calls are ended now."""
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

    async def _stop_or_hurry(self, on_shutdown: Callable[[], Awaitable[None]] | None) -> None:
        async def graceful() -> None:
            if on_shutdown is not None:
                await on_shutdown()
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


# -- the command-line flags every server shares -----------------------------------------------


def add_serving_arguments(
    parser: argparse.ArgumentParser, *, default_listen: str, default_metrics_listen: str
) -> None:
    """``--listen --metrics-listen --ready-file --log-level --shutdown-grace --drain-delay
    --tls-cert --tls-key --tls-client-ca --tls-ca``."""
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
        help='after binding, write {"grpc": ..., "metrics": ..., "pid": ...} here atomically',
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
    return ServingOptions(
        listen=args.listen,
        metrics_listen=metrics,
        ready_file=args.ready_file,
        grace_s=args.shutdown_grace,
        tls=tls,
        drain_delay_s=args.drain_delay,
    )


def outgoing_tls_from_args(args: argparse.Namespace) -> TlsOptions | None:
    """How this process calls its peers: TLS when ``--tls-ca`` or ``--tls-cert`` is given
    (verifying servers against ``--tls-ca``, else the system roots; presenting ``--tls-cert``
    as the client certificate when given), else None for plaintext."""
    if not (args.tls_ca or args.tls_cert):
        return None
    return TlsOptions(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
