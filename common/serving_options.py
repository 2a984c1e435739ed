"""Where and how a Halcyon gRPC host listens: addresses, TLS credentials and core options.

What it decides: the option values :class:`common.serving.ServiceHost` is built from, kept apart
from the host so the flags (:mod:`common.serving_flags`) and callers that only need an address
or a credential do not pull in the whole host:

* ``HOST:PORT`` parsing and formatting (IPv6 literals in brackets);
* :class:`TlsOptions`, with the two jobs of a CA kept apart: ``client_ca`` requires and verifies
  client certificates on incoming calls (mTLS), ``ca`` verifies servers on outgoing calls;
* :class:`ServingOptions` and the serving-path choice (``$HALCYON_SERVING_PATH``, ADR 0010);
* explicit gRPC limits (:data:`MAX_RECEIVE_MESSAGE_BYTES`, :data:`MAX_METADATA_BYTES`,
  :data:`MAX_PENDING_CALLS`) and the rest of the core options (:func:`server_options`).

Why ``so_reuseport`` is off: with it on (gRPC's default on Linux) a second process silently
binds the same port and steals half the connections; a fixed port must fail loudly instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from common.keepalive import KeepalivePolicy
from common.keepalive import current as current_keepalive

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
