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

from common.argtypes import positive
from common.controller_targets import controller_addresses
from common.credentials import CredentialError, add_credential_arguments, load_credentials
from common.gc_tuning import tune_for_serving
from common.logs import configure_logging
from common.parent_death import die_with_parent
from common.serving import (
    ServingFailed,
    add_serving_arguments,
    outgoing_tls_from_args,
    serving_options_from_args,
)
from common.thread_scheduling import add_helper_threads_argument, tune_threads
from common.tracing import configure_tracing
from gateway.admission import TenantRegistry
from gateway.app import GatewayApp, GatewayConfig
from gateway.batching import Objective
from gateway.batching.fixed import (
    SEED_FIXED_LINGER_S,
    SEED_FIXED_MAX_ITEMS,
    SEED_FIXED_MAX_QUEUE,
    BatchingStrategy,
)

__all__ = ["configure", "run"]

_log = logging.getLogger("halcyon.gateway")

_EPILOG = """\
examples:
  halcyon gateway --dev-mode --controller 127.0.0.1:50050
  halcyon gateway --listen 0.0.0.0:50051 --tenants /etc/halcyon/tenants.yaml \\
      --fleet-token-file /run/secrets/fleet --controller halcyon-controller:50050

Clients authenticate with a tenant API key ('x-api-key: KEY' or 'authorization: Bearer KEY').
--tenants is required, except in --dev-mode (loopback only), where the public demo tenants
apply: demo-key-premium (critical), demo-key-standard, demo-key-batch (sheddable). The gateway
is ready (grpc.health.v1 name "readiness") once the controller has told it about at least one
replica.
"""


def _objective_flag(text: str) -> str:
    """An ``--objective`` value in the shared spelling (older spellings accepted)."""
    try:
        return Objective.parse(text).flag
    except ValueError:
        return text  # argparse's choices check names the allowed values


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``halcyon gateway`` flags to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--controller",
        type=controller_addresses,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="controller to subscribe to for fleet membership and rollout weights; several "
        "(comma-separated) for controllers that elect a leader: a standby's refusal or a lost "
        "one moves the gateway to the next "
        "(default: none, and a gateway without one has no replicas and never becomes ready)",
    )
    fleet.add_argument(
        "--gateway-id", metavar="ID", help="id reported to the controller (default gw-HOST-PID)"
    )
    fleet.add_argument(
        "--expected-gateways",
        type=_at_least_one,
        default=1,
        metavar="N",
        help="gateways the deployment runs (its replica count). Tenant quotas are fleet-wide: "
        "the controller splits each among the gateways by their demand, and until its first "
        "lease arrives this gateway enforces each quota divided by N, so that N gateways "
        "starting together never admit N times a tenant's contract. 1: this gateway is alone "
        "and enforces whole quotas, as before leases (default %(default)s)",
    )
    policy = parser.add_argument_group("policy")
    policy.add_argument(
        "--tenants",
        type=Path,
        metavar="YAML",
        help="tenant keys (SHA-256), quotas and priorities; required unless --dev-mode "
        "(default: none; with --dev-mode the public demo tenants)",
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
        type=_objective_flag,
        choices=[o.flag for o in Objective],
        default=Objective.ON_TIME_REQUESTS.flag,
        help="what the batcher maximises under overload: on-time requests or on-time tokens, "
        "as in 'halcyon bench --objective' (default %(default)s; on_time_requests and "
        "on_time_tokens are accepted too)",
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
        "--batching",
        choices=[s.value for s in BatchingStrategy],
        default=BatchingStrategy.HALCYON.value,
        help="which batcher serves: 'halcyon' (deadline-aware EDF with feasibility and goodput "
        f"shedding), 'fixed' (the seed's fixed batcher, as the seed description's benchmark "
        f"gives it: batches of up to {SEED_FIXED_MAX_ITEMS} requests flushed when full or "
        f"{SEED_FIXED_LINGER_S * 1000:g} ms after the first arrived, FIFO, a queue of "
        f"{SEED_FIXED_MAX_QUEUE}, no deadline shedding) or 'none' (one request per batch, "
        "FIFO, same queue); the baselines exist to measure Halcyon against (default "
        "%(default)s; --objective and --linger-ms apply to halcyon only)",
    )
    policy.add_argument(
        "--seed", type=int, default=0, help="seed for routing choices (default %(default)s)"
    )
    add_credential_arguments(parser, fleet_use="presented to the controller and workers")
    add_serving_arguments(
        parser,
        default_listen="127.0.0.1:50051",
        default_metrics_listen="127.0.0.1:9451",
        # Clients' HTTP/2 connections rebalance over gateway replicas within this (ADR 0014).
        default_max_connection_age=300.0,
    )
    add_helper_threads_argument(parser, default="batch")


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The :class:`GatewayConfig` the flags describe (raises ValueError / OSError)."""
    credentials = load_credentials(
        args, fleet_required=True, operator_required=False, listen=args.listen
    )
    if args.tenants is not None:
        tenants = TenantRegistry.from_yaml(args.tenants)
    elif credentials.dev_mode:
        _log.warning("development mode: serving the public demo tenants (demo-key-*)")
        tenants = TenantRegistry.demo()
    else:
        raise CredentialError(
            "no --tenants: pass --tenants YAML (format: gateway/admission/tenants.example.yaml), "
            "or --dev-mode (loopback only) for the public demo tenants"
        )
    serving = serving_options_from_args(args)
    peer_tls = outgoing_tls_from_args(args)
    config = GatewayConfig(
        serving=serving,
        tenants=tenants,
        controller=args.controller,
        fleet_token=credentials.fleet or "",
        operator_token=credentials.operator or "",
        default_timeout_s=args.default_timeout,
        seed=args.seed,
        objective=Objective.parse(args.objective),
        linger_s=max(0.0, args.linger_ms) / 1000.0,
        batching=BatchingStrategy.parse(args.batching),
        controller_tls=peer_tls,
        worker_tls=peer_tls,
        expected_gateways=args.expected_gateways,
    )
    if args.gateway_id:
        config.gateway_id = args.gateway_id
    return config


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, finish accepted work, exit 0."""
    die_with_parent()  # a launcher's child: gone with the launcher (SIGKILL too)
    configure_logging("gateway", args.log_level)
    configure_tracing("gateway")
    try:
        config = config_from_args(args)
    except CredentialError as exc:
        _log.error(str(exc))
        return 2
    except (OSError, ValueError) as exc:
        what = (
            f"cannot read {exc.filename}: {exc.strerror or exc}"
            if isinstance(exc, OSError) and exc.filename is not None
            else str(exc)
        )
        _log.error(
            "invalid gateway configuration",
            extra={
                "error": f"{what}; check --tenants (format: "
                "gateway/admission/tenants.example.yaml) and the --tls-* files"
            },
        )
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
