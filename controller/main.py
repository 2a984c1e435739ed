"""``halcyon controller``: flags, process lifecycle and exit codes of the controller.

What it decides: how the command line maps onto :class:`controller.app.ControllerConfig` and
the serving options, and the process's life — bind, open the store, report ready, and on
SIGTERM/SIGINT turn readiness off, end every stream cleanly, stop within the grace period and
exit 0. Exit 2 for unusable flags or config, 1 when the store cannot be opened or the port
cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
from pathlib import Path

import yaml

from common.argtypes import non_negative
from common.auth import (
    DEV_FLEET_TOKEN,
    DEV_OPERATOR_TOKEN,
    FLEET_TOKEN_ENV,
    OPERATOR_TOKEN_ENV,
    AuthPolicy,
    token_from_env_or_default,
)
from common.logs import configure_logging
from common.serving import ServiceHost, add_serving_arguments, serving_options_from_args
from controller.app import Controller, ControllerConfig
from controller.servicer import AUTH_RULES
from controller.stable_versions import (
    merge_configured,
    parse_stable_assignment,
    stable_map_from_config,
)
from controller.store import StoreError

__all__ = ["configure", "run"]

_log = logging.getLogger("halcyon.controller")

DEFAULT_LISTEN = "127.0.0.1:50050"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9450"
DEFAULT_DB = "./halcyon-controller.sqlite"

_EPILOG = """\
examples:
  halcyon controller --stable resnet=v1 --stable bert=v3
  HALCYON_FLEET_TOKEN=... HALCYON_OPERATOR_TOKEN=... halcyon controller --db /var/lib/halcyon.db

config file (--config, YAML):
  stable:
    resnet: v1
    bert: v3

Stable versions: --stable flags win over the config file. A model with no configured stable
version is routed to its only registered version; with several versions registered and none
configured it has no stable version and gateways refuse it (the controller logs a warning).
A promotion persisted in the --db file survives restarts until the configured version for
that model changes.

Credentials: workers and gateways present the fleet token, operators the operator token, as
'authorization: Bearer <token>'. Prefer the environment variables to the flags (flags are
visible in the process list). Without either, insecure dev defaults are used, with a warning.
"""


def _stable_arg(text: str) -> tuple[str, str]:
    try:
        return parse_stable_assignment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0.0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the controller's flags to ``parser``."""
    parser.description = (
        "Run the Halcyon controller: the fleet registry (workers register and heartbeat;\n"
        "members leave when their stream ends or their lease lapses), per-model routing\n"
        "(stable and canary versions) streamed to gateways, outcome reports from gateways,\n"
        "the SQLite store, and the operator API (GetState, DrainReplica, rollouts)."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    group = parser.add_argument_group("controller")
    group.add_argument(
        "--db",
        type=Path,
        default=Path(DEFAULT_DB),
        metavar="PATH",
        help=f"SQLite store (created if missing; default {DEFAULT_DB})",
    )
    group.add_argument(
        "--stable",
        type=_stable_arg,
        action="append",
        default=[],
        metavar="MODEL=VERSION",
        help="the stable (baseline) version of a model; repeat for each model",
    )
    group.add_argument(
        "--config",
        type=Path,
        metavar="PATH",
        help="YAML file with a 'stable' map of model -> version (flags win)",
    )
    group.add_argument(
        "--lease-ttl",
        type=_positive_seconds,
        default=3.0,
        metavar="SECONDS",
        help="a worker leaves the fleet if no heartbeat arrives within this (default 3)",
    )
    group.add_argument(
        "--heartbeat-interval",
        type=_positive_seconds,
        default=1.0,
        metavar="SECONDS",
        help="heartbeat period the controller asks workers for; < --lease-ttl (default 1)",
    )
    group.add_argument(
        "--warm-up",
        type=non_negative,
        default=None,
        metavar="SECONDS",
        help="after start, how long fleet snapshots say 'warming up' so that gateways keep the "
        "replicas they knew while workers re-register; 0 turns it off (default: --lease-ttl)",
    )
    group.add_argument(
        "--outcome-window",
        type=_positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="rolling window over which gateway outcome reports are aggregated (default 60)",
    )
    group.add_argument(
        "--fleet-token",
        metavar="TOKEN",
        help=f"fleet credential (default ${FLEET_TOKEN_ENV}, else the insecure dev default)",
    )
    group.add_argument(
        "--operator-token",
        metavar="TOKEN",
        help=f"operator credential (default ${OPERATOR_TOKEN_ENV}, else the insecure dev default)",
    )
    add_serving_arguments(
        parser, default_listen=DEFAULT_LISTEN, default_metrics_listen=DEFAULT_METRICS_LISTEN
    )


def _load_config_file(path: Path) -> dict[str, str]:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read config file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {path} is not valid YAML: {exc}") from exc
    try:
        return stable_map_from_config(document)
    except ValueError as exc:
        raise ValueError(f"config file {path}: {exc}") from exc


def build_config(args: argparse.Namespace) -> ControllerConfig:
    """The ControllerConfig the flags describe (raises ValueError with a helpful message)."""
    if args.heartbeat_interval >= args.lease_ttl:
        raise ValueError(
            f"--heartbeat-interval ({args.heartbeat_interval:g}s) must be shorter than "
            f"--lease-ttl ({args.lease_ttl:g}s)"
        )
    from_file = _load_config_file(args.config) if args.config else {}
    stable = merge_configured(from_file, args.stable)
    return ControllerConfig(
        db_path=args.db,
        stable=stable,
        lease_ttl_s=args.lease_ttl,
        heartbeat_interval_s=args.heartbeat_interval,
        outcome_window_s=args.outcome_window,
        warm_up_s=args.warm_up,
    )


def _auth_policy(args: argparse.Namespace) -> AuthPolicy:
    fleet, fleet_dev = token_from_env_or_default(args.fleet_token, FLEET_TOKEN_ENV, DEV_FLEET_TOKEN)
    operator, operator_dev = token_from_env_or_default(
        args.operator_token, OPERATOR_TOKEN_ENV, DEV_OPERATOR_TOKEN
    )
    for name, dev, env in (
        ("fleet", fleet_dev, FLEET_TOKEN_ENV),
        ("operator", operator_dev, OPERATOR_TOKEN_ENV),
    ):
        if dev:
            _log.warning(
                f"using the insecure dev {name} token; set ${env} outside development",
                extra={"credential": name},
            )
    if fleet == operator:
        raise ValueError("the fleet and operator tokens must differ")
    return AuthPolicy(fleet_token=fleet, operator_token=operator, rules=AUTH_RULES)


async def _serve(args: argparse.Namespace, config: ControllerConfig, auth: AuthPolicy) -> int:
    options = serving_options_from_args(args)
    host = ServiceHost("controller", options, auth)
    try:
        controller = await Controller.open(config, metrics_registry=host.registry)
    except StoreError as exc:
        _log.error("cannot open the store", extra={"db": str(config.db_path), "error": str(exc)})
        return 1
    try:
        controller.add_to(host)
        try:
            await host.start()
        except OSError as exc:
            _log.error("cannot start serving", extra={"error": str(exc)})
            return 1
        controller.start()
        host.set_ready(True)
        _log.info(
            "controller ready",
            extra={"grpc": host.grpc_address, "metrics": host.metrics_address,
                   "lease_ttl_s": config.lease_ttl_s},
        )  # fmt: skip
        await host.serve_until_signal(on_shutdown=controller.shutdown)
    finally:
        await host.stop()
        await controller.close()
    _log.info("controller stopped")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the controller until SIGTERM/SIGINT; returns the process exit code."""
    configure_logging("controller", args.log_level)
    try:
        config = build_config(args)
        auth = _auth_policy(args)
    except ValueError as exc:
        _log.error(str(exc))
        return 2
    return asyncio.run(_serve(args, config, auth))
