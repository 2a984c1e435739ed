"""``halcyon gateway``: serve ``InferService`` in front of a fleet the controller describes.

What it decides: the gateway's command-line surface (flags, defaults, help) and its process
lifecycle: JSON logs, tracing, serve until SIGTERM/SIGINT, then readiness off, finish accepted
work within ``--shutdown-grace``, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from common.argtypes import hostport, positive
from common.auth import DEV_FLEET_TOKEN, FLEET_TOKEN_ENV, token_from_env_or_default
from common.gc_tuning import tune_for_serving
from common.logs import configure_logging
from common.serving import (
    ServingFailed,
    TlsOptions,
    add_serving_arguments,
    serving_options_from_args,
)
from common.thread_scheduling import add_helper_threads_argument, tune_threads
from common.tracing import configure_tracing
from gateway.admission import TenantRegistry
from gateway.app import GatewayApp, GatewayConfig
from gateway.batching import Objective

__all__ = ["configure", "run"]

_log = logging.getLogger("halcyon.gateway")

_EPILOG = """\
examples:
  halcyon gateway --controller 127.0.0.1:50050
  halcyon gateway --listen 0.0.0.0:50051 --tenants /etc/halcyon/tenants.yaml \\
      --controller halcyon-controller:50050

Clients authenticate with a tenant API key ('x-api-key: KEY' or 'authorization: Bearer KEY').
Without --tenants the demo tenants apply: demo-key-premium (critical), demo-key-standard,
demo-key-batch (sheddable). The gateway is ready (grpc.health.v1 name "readiness") once the
controller has told it about at least one replica.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``halcyon gateway`` flags to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--controller",
        type=hostport,
        metavar="HOST:PORT",
        help="controller to subscribe to for fleet membership and rollout weights",
    )
    fleet.add_argument(
        "--fleet-token",
        metavar="TOKEN",
        help=f"fleet credential (default ${FLEET_TOKEN_ENV}, else the insecure dev token)",
    )
    fleet.add_argument(
        "--gateway-id", metavar="ID", help="id reported to the controller (default gw-HOST-PID)"
    )
    policy = parser.add_argument_group("policy")
    policy.add_argument(
        "--tenants",
        type=Path,
        metavar="YAML",
        help="tenant keys (SHA-256), quotas and priorities (default: the demo tenants)",
    )
    policy.add_argument(
        "--default-timeout",
        type=positive,
        default=10.0,
        metavar="SECONDS",
        help="deadline for requests that carry neither a gRPC deadline nor a timeout "
        "(default %(default)s)",
    )
    policy.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        default=Objective.ON_TIME_REQUESTS.value,
        help="what the batcher maximises under overload (default %(default)s)",
    )
    policy.add_argument(
        "--linger-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="hold an idle replica this long to let a batch grow (default %(default)s: "
        "dispatch at once; batches grow while replicas are busy)",
    )
    policy.add_argument(
        "--seed", type=int, default=0, help="seed for routing choices (default %(default)s)"
    )
    add_serving_arguments(
        parser, default_listen="127.0.0.1:50051", default_metrics_listen="127.0.0.1:9451"
    )
    add_helper_threads_argument(parser, default="batch")


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    fleet_token, fleet_dev = token_from_env_or_default(
        args.fleet_token, FLEET_TOKEN_ENV, DEV_FLEET_TOKEN
    )
    if fleet_dev:
        _log.warning(
            "using the built-in dev fleet credential; set --fleet-token or "
            f"${FLEET_TOKEN_ENV} outside development"
        )
    if args.tenants is not None:
        tenants = TenantRegistry.from_yaml(args.tenants)
    else:
        _log.warning("no --tenants given: serving the demo tenants (demo-key-*)")
        tenants = TenantRegistry.demo()
    serving = serving_options_from_args(args)
    peer_tls = (
        TlsOptions(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_ca)
        if serving.tls is not None
        else None
    )
    config = GatewayConfig(
        serving=serving,
        tenants=tenants,
        controller=args.controller,
        fleet_token=fleet_token,
        default_timeout_s=args.default_timeout,
        seed=args.seed,
        objective=Objective(args.objective),
        linger_s=max(0.0, args.linger_ms) / 1000.0,
        controller_tls=peer_tls,
        worker_tls=peer_tls,
    )
    if args.gateway_id:
        config.gateway_id = args.gateway_id
    return config


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, finish accepted work, exit 0."""
    configure_logging("gateway", args.log_level)
    configure_tracing("gateway")
    try:
        config = config_from_args(args)
    except (OSError, ValueError) as exc:
        _log.error("invalid gateway configuration", extra={"error": str(exc)})
        return 2

    def after_start() -> None:
        tune_for_serving()
        tune_threads(args.helper_threads)

    async def main() -> None:
        # Built inside the loop: grpc.aio binds a server to the loop current at construction.
        await GatewayApp(config).run_until_signal(after_start=after_start)

    try:
        asyncio.run(main())
    except ServingFailed:
        return 1  # logged when the completion-queue path failed
    except OSError as exc:
        _log.error("gateway failed to start", extra={"error": str(exc)})
        return 1
    return 0
