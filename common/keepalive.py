"""HTTP/2 keepalive: one policy for every server and every channel the project opens.

What it decides: how often a client pings a quiet connection, how long it waits for the
answer, and which pings a server accepts — on both sides from one interval, so they agree.

Why both sides: a client that pings a connection every ``interval_s`` while a call runs finds
out that the peer went away (a host that died without a FIN, a partition) within
``interval_s + timeout_s`` instead of at the call's deadline. But a gRPC server by default
accepts at most one ping per five minutes on a connection that sends no data, counts faster
ones as strikes and, past two strikes, closes the connection with ``GOAWAY too_many_pings`` —
cutting every call on it. A batch that runs for tens of seconds (a long generation on a real
model) sends no data for as long, so the server side must permit the client's rate:

* client: ping every ``interval_s`` (``grpc.keepalive_time_ms``), give up on the connection
  after ``timeout_s`` without an answer, keep pinging however long no data flows
  (``grpc.http2.max_pings_without_data`` 0; gRPC's default stops after two pings, so a long
  call had no keepalive at all) and also on idle connections (a dead worker is found before
  a batch is sent to it);
* server: accept pings every ``interval_s / 2`` without data, also with no call running,
  and keep gRPC's two strikes for clients that ping faster than that.

The interval is the same for every process of a fleet: ``$HALCYON_KEEPALIVE_S`` (seconds,
default 20) or a server's ``--keepalive-interval`` flag, which sets it for the server and the
channels that process opens. A client set to ping faster than its servers accept is cut by
them — so lower it everywhere or nowhere.

A server outside the project (an Open Inference Protocol backend: Triton, KServe …) keeps
gRPC's strict defaults; :func:`backend_client_options` pings it only as those allow (at most
two pings per quiet spell, never on an idle connection).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = [
    "DEFAULT_INTERVAL_S",
    "KEEPALIVE_ENV",
    "KeepalivePolicy",
    "backend_client_options",
    "client_options",
    "configure",
    "current",
    "policy_from_env",
    "server_options",
]

KEEPALIVE_ENV = "HALCYON_KEEPALIVE_S"
DEFAULT_INTERVAL_S = 20.0
# A peer that does not answer a ping within this long is gone (longer than the liveness
# watchdog's default stall limit, so a peer merely busy for a moment is not cut).
DEFAULT_TIMEOUT_S = 10.0
# Pings faster than a server accepts before it sends GOAWAY (gRPC's own default, explicit).
MAX_PING_STRIKES = 2


@dataclass(frozen=True)
class KeepalivePolicy:
    """Keepalive pings every ``interval_s``, answered within ``timeout_s``."""

    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("interval_s", "timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"keepalive {name} must be a positive number of seconds")

    def client_options(self) -> list[tuple[str, int]]:
        """Channel options for a channel to a Halcyon server."""
        return [
            ("grpc.keepalive_time_ms", _ms(self.interval_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.timeout_s)),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.keepalive_permit_without_calls", 1),
        ]

    def backend_client_options(self) -> list[tuple[str, int]]:
        """Channel options for a channel to a server with gRPC's default ping policy."""
        return [
            ("grpc.keepalive_time_ms", _ms(self.interval_s)),
            ("grpc.keepalive_timeout_ms", _ms(self.timeout_s)),
            ("grpc.http2.max_pings_without_data", 2),
            ("grpc.keepalive_permit_without_calls", 0),
        ]

    def server_options(self) -> list[tuple[str, int]]:
        """Server options: accept this policy's clients' pings (with a margin for timers)."""
        return [
            ("grpc.http2.min_ping_interval_without_data_ms", max(1, _ms(self.interval_s / 2))),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000.0))


_configured: KeepalivePolicy | None = None


def policy_from_env(environ: dict[str, str] | None = None) -> KeepalivePolicy:
    """The policy ``$HALCYON_KEEPALIVE_S`` names (the default when unset or empty)."""
    text = (os.environ if environ is None else environ).get(KEEPALIVE_ENV, "").strip()
    if not text:
        return KeepalivePolicy()
    try:
        return KeepalivePolicy(interval_s=float(text))
    except ValueError:
        raise ValueError(
            f"${KEEPALIVE_ENV} must be a positive number of seconds, got {text!r}"
        ) from None


def configure(interval_s: float | None) -> KeepalivePolicy:
    """Fix this process's policy (a ``--keepalive-interval`` flag); None: from the env."""
    global _configured
    _configured = policy_from_env() if interval_s is None else KeepalivePolicy(interval_s)
    return _configured


def current() -> KeepalivePolicy:
    """This process's policy: as configured, else from the environment."""
    return _configured if _configured is not None else policy_from_env()


def client_options() -> list[tuple[str, int]]:
    """This process's channel options for a channel to a Halcyon server."""
    return current().client_options()


def backend_client_options() -> list[tuple[str, int]]:
    """This process's channel options for a channel to a third-party gRPC server."""
    return current().backend_client_options()


def server_options() -> list[tuple[str, int]]:
    """This process's server options."""
    return current().server_options()
