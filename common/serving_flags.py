"""The command-line flags every Halcyon server shares, and the options they make.

What it decides: the ``serving`` and ``TLS`` argument groups (:func:`add_serving_arguments`),
their validation into :class:`common.serving_options.ServingOptions`
(:func:`serving_options_from_args`, exiting with a message on a bad combination) and the TLS a
process uses for its outgoing calls (:func:`outgoing_tls_from_args`), so controller, gateway
and worker parse the same flags the same way.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.keepalive import KEEPALIVE_ENV
from common.keepalive import configure as configure_keepalive
from common.serving_options import (
    DEFAULT_DRAIN_DELAY_S,
    SERVING_PATH_ENV,
    SERVING_PATHS,
    ServingOptions,
    TlsOptions,
    _default_serving_path,
    parse_hostport,
)


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
