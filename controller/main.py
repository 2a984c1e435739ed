"""``halcyon controller``: flags, process lifecycle and exit codes of the controller.

What it decides: how the command line maps onto :class:`controller.app.ControllerConfig` and
the serving options, and the process's life — bind, open the store, report ready, and on
SIGTERM/SIGINT turn readiness off, end every stream cleanly, stop within the grace period and
exit 0. Exit 2 for unusable flags or config, 1 when the store cannot be opened or the port
cannot be bound.

The operator console (:mod:`controller.console`, ``--console-listen``) is served on the same
event loop; it binds before the ready file is written, so the file (and the "controller ready"
log line) names its address too (``"console"``; absent when ``--console-listen off``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
from pathlib import Path

import yaml

from common.argtypes import hostport, non_negative
from common.auth import AuthPolicy
from common.credentials import (
    CredentialError,
    add_credential_arguments,
    is_loopback,
    load_credentials,
)
from common.leader_gate import LeaderGate
from common.logs import configure_logging
from common.parent_death import die_with_parent
from common.ports import describe_port_holders
from common.serving import (
    ServiceHost,
    add_serving_arguments,
    parse_hostport,
    serving_options_from_args,
)
from common.tracing import configure_tracing
from controller.app import Controller, ControllerConfig
from controller.console import Console, ConsoleConfig
from controller.leadership import Leadership
from controller.stable_versions import (
    merge_configured,
    parse_stable_assignment,
    stable_map_from_config,
)
from controller.store import StoreError
from controller.store_url import Backend, parse_store_location
from halcyon.v1 import control_pb2

__all__ = ["configure", "run"]

_log = logging.getLogger("halcyon.controller")

DEFAULT_LISTEN = "127.0.0.1:50050"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9450"
DEFAULT_DB = "./halcyon-controller.sqlite"
# --db's default, told apart by identity from a --db the operator typed (argparse keeps a
# non-string default as it is), so that --db with --store is refused even for this path.
_DEFAULT_DB_PATH = Path(DEFAULT_DB)
DEFAULT_CONSOLE_LISTEN = "127.0.0.1:9440"
CONSOLE_OFF = "off"
# What a standby serves besides health and reflection (common.leader_gate): reading is safe.
STANDBY_SERVES = (
    f"/{control_pb2.DESCRIPTOR.services_by_name['ControlService'].full_name}/GetState",
)
# Exit code of a leader that lost its lock: its supervisor restarts it, as a standby.
EXIT_LOST_LEADERSHIP = 3

_EPILOG = """\
examples:
  halcyon controller --dev-mode --stable resnet=v1 --stable bert=v3
  halcyon controller --fleet-token-file /run/secrets/fleet --operator-token-file \
      /run/secrets/operator --db /var/lib/halcyon.db --listen 0.0.0.0:50050

config file (--config, YAML):
  stable:
    resnet: v1
    bert: v3

Stable versions: --stable flags win over the config file. A model with no configured stable
version is routed to its only registered version; with several versions registered and none
configured it has no stable version and gateways refuse it (the controller logs a warning).
A promotion persisted in the store survives restarts until the configured version for
that model changes.

Store: an SQLite file by default (--db PATH). --store postgresql://USER@HOST:PORT/DBNAME keeps
it in a PostgreSQL database the user owns instead (the same schema, migrated at start), so the
controller can move to another machine. Several controllers may share one PostgreSQL store:
exactly one leads (a PostgreSQL advisory lock), the others stand by — readiness NOT_SERVING,
GetState only, every other call refused UNAVAILABLE/NOT_LEADER naming the leader (--advertise)
— and one takes over within seconds of the leader's death. Give the password in $PGPASSWORD
or a ~/.pgpass file ($PGPASSFILE), not in the URL: the command line is visible to every user
of the machine.

Operator console: a web page at http://127.0.0.1:9440/ (--console-listen; 'off' disables it).
On loopback anyone on this machine may look; promote, abort, drain and undrain need the
operator token, typed into the page. Listening beyond loopback, every page needs it.

Credentials: workers and gateways present the fleet token, operators the operator token, as
'authorization: Bearer <token>'. Give each as a file (--fleet-token-file, --operator-token-file)
or in $HALCYON_FLEET_TOKEN / $HALCYON_OPERATOR_TOKEN, never on the command line. Without them
the controller refuses to start, unless --dev-mode (loopback only) lets it use the public
development tokens.
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


def _store_url(text: str) -> str:
    try:
        parse_store_location(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _console_listen(text: str) -> str:
    if text.strip().lower() == CONSOLE_OFF:
        return CONSOLE_OFF
    return hostport(text)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the controller's flags to ``parser``."""
    parser.description = (
        "Run the Halcyon controller: the fleet registry (workers register and heartbeat;\n"
        "members leave when their stream ends or their lease lapses), per-model routing\n"
        "(stable and canary versions) streamed to gateways, outcome reports from gateways,\n"
        "the store (SQLite or PostgreSQL), the operator API (GetState, DrainReplica,\n"
        "rollouts) and the operator console, a web page of the fleet, the traffic and every\n"
        "rollout."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    group = parser.add_argument_group("controller")
    group.add_argument(
        "--db",
        type=Path,
        default=_DEFAULT_DB_PATH,
        metavar="PATH",
        help=f"SQLite store (created if missing; default {DEFAULT_DB}); short for --store "
        "sqlite:///PATH",
    )
    group.add_argument(
        "--store",
        type=_store_url,
        # From the environment too, so a Kubernetes Secret can hold the URL (deploy/k8s).
        default=os.environ.get("HALCYON_STORE") or None,
        metavar="URL",
        help="where the store lives: sqlite:///PATH/FILE.db or postgresql://USER@HOST:PORT/DB "
        "(a database the user owns; the password from $PGPASSWORD or $PGPASSFILE). "
        "Not with --db (default: $HALCYON_STORE)",
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
        "--console-listen",
        type=_console_listen,
        default=None,
        metavar="HOST:PORT|off",
        help="where the operator console (web page and JSON API) listens; port 0 picks a "
        "free one (the ready file and the 'controller ready' log line name it), 'off' "
        "disables it. On loopback, reading needs no credential; on any other address every "
        "page needs the operator credential; actions always do. HTTPS with --tls-cert/--tls-key "
        f"(default {DEFAULT_CONSOLE_LISTEN}; when that port is taken the controller runs "
        "without a console and logs a warning, where an address given here fails the start)",
    )
    group.add_argument(
        "--advertise",
        type=hostport,
        default=None,
        metavar="HOST:PORT",
        help="the address standbys name to clients when this controller leads (PostgreSQL "
        "store only; default: the bound gRPC address)",
    )
    add_credential_arguments(
        parser,
        fleet_use="which workers and gateways must present",
        operator_use="which operators must present",
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
    store = getattr(args, "store", None)
    if store is not None and args.db is not _DEFAULT_DB_PATH:
        raise ValueError(
            "--store and --db both name the store: give one (--db PATH is short for "
            "--store sqlite:///PATH)"
        )
    from_file = _load_config_file(args.config) if args.config else {}
    stable = merge_configured(from_file, args.stable)
    return ControllerConfig(
        db_path=store if store is not None else args.db,
        stable=stable,
        lease_ttl_s=args.lease_ttl,
        heartbeat_interval_s=args.heartbeat_interval,
        outcome_window_s=args.outcome_window,
        warm_up_s=args.warm_up,
    )


def _auth_policy(args: argparse.Namespace) -> AuthPolicy:
    """The gate for the controller's credentials (raises CredentialError, a ValueError)."""
    credentials = load_credentials(
        args, fleet_required=True, operator_required=True, listen=args.listen
    )
    console = getattr(args, "console_listen", None) or DEFAULT_CONSOLE_LISTEN
    if credentials.dev_mode and console != CONSOLE_OFF:
        host, _ = parse_hostport(console)
        if not is_loopback(host):
            raise CredentialError(
                f"--dev-mode accepts public credentials, so the console listens on loopback "
                f"only: got --console-listen {console}; use 127.0.0.1:PORT or drop --dev-mode"
            )
    return credentials.policy()


def _write_ready_file(path: Path, addresses: dict[str, str | None]) -> None:
    """The ready file with every address this process bound, written atomically."""
    payload = {**addresses, "pid": os.getpid()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload) + "\n")
    os.replace(tmp, path)


async def _start_console(console: Console, *, explicit: bool) -> Console | None:
    """Bind the console; a taken *default* port leaves the controller without one (a warning
    says so), a taken port the operator asked for is an OSError like any other."""
    try:
        await console.start()
    except OSError as exc:
        if explicit:
            raise
        hint = _holder(console.config.listen)
        _log.warning(
            "console not started: its default address is taken; pass --console-listen "
            "HOST:PORT (0 picks a free port) or off",
            extra={"console": console.config.listen, "error": str(exc) + hint},
        )
        return None
    return console


def _holder(listen: str) -> str:
    _, port = parse_hostport(listen)
    holders = describe_port_holders(port) if port else ""
    return f"; {holders}" if holders else ""


def _exit_lost_leadership() -> None:
    """The leader's lock session is gone, so another controller may lead already: stop acting
    at once — no graceful drain, which would keep acting — and let the supervisor restart this
    process as a standby."""
    _log.error("lost the leader lock: exiting so that this controller restarts as a standby")
    logging.shutdown()  # flush the line before the process ends
    os._exit(EXIT_LOST_LEADERSHIP)


async def _serve(args: argparse.Namespace, config: ControllerConfig, auth: AuthPolicy) -> int:
    options = serving_options_from_args(args)
    # The host would write the ready file as soon as gRPC is bound; it is written here once
    # the console is bound too, so whoever waits for it can use both.
    ready_file, options.ready_file = options.ready_file, None
    host = ServiceHost("controller", options, auth)
    location = parse_store_location(config.db_path)
    # Only a PostgreSQL store can be shared, so only there is there an election (SQLite: this
    # controller always leads, and takes the store over before serving as it always did).
    leadership: Leadership | None = None
    gate: LeaderGate | None = None
    if location.backend is Backend.POSTGRESQL:
        leadership = Leadership(location, args.advertise or "")
        elected = leadership
        gate = LeaderGate(STANDBY_SERVES, lambda: elected.leader_address)
        host.add_layer(gate)
    try:
        controller = await Controller.open(
            config, metrics_registry=host.registry, active=leadership is None
        )
    except StoreError as exc:
        _log.error("cannot open the store", extra={"db": location.display, "error": str(exc)})
        return 1
    console_listen = args.console_listen or DEFAULT_CONSOLE_LISTEN
    console: Console | None = None
    if console_listen != CONSOLE_OFF:
        console = Console(controller, auth, ConsoleConfig(console_listen, tls=options.tls))
    tasks: list[asyncio.Task[None]] = []

    async def shutdown() -> None:
        for task in tasks:
            task.cancel()
        if console is not None:
            await console.close()
        await controller.shutdown()

    def announce(role: str, addresses: dict[str, str | None]) -> None:
        if ready_file is not None:
            _write_ready_file(ready_file, {**addresses, "role": role})
        _log.info(
            "controller ready",
            extra={**addresses, "lease_ttl_s": config.lease_ttl_s, "role": role},
        )

    async def lead(addresses: dict[str, str | None]) -> None:
        """Act: the only controller, or the one that holds the leader lock."""
        nonlocal console
        if leadership is not None:
            await controller.activate()  # what the previous leader decided, re-armed
            tasks.append(asyncio.create_task(leadership.watch(_exit_lost_leadership)))
        if console is not None:  # its actions write: a standby has none
            console = await _start_console(console, explicit=args.console_listen is not None)
        controller.start()
        if gate is not None:
            gate.lead()
        host.set_ready(True)
        if console is not None:
            addresses["console"] = console.address
            addresses["console_url"] = console.url
        announce("leader", addresses)

    async def stand_by(addresses: dict[str, str | None]) -> None:
        assert leadership is not None
        epoch = await leadership.acquire()
        _log.info(
            "controller took over as leader",
            extra={"advertise": leadership.advertise, "epoch": epoch},
        )
        try:
            await lead(addresses)
        except Exception as exc:
            # Holding the lock without leading would block every standby: whatever failed,
            # exit, and the supervisor starts a standby.
            _log.error("cannot take over as leader", extra={"error": repr(exc)})
            _exit_lost_leadership()

    try:
        controller.add_to(host)
        try:
            await host.start()
        except OSError as exc:
            _log.error("cannot start serving", extra={"error": str(exc)})
            return 1
        addresses: dict[str, str | None] = {
            "grpc": host.grpc_address,
            "metrics": host.metrics_address,
            "health": host.health_address,
        }
        if leadership is not None:
            leadership.advertise = leadership.advertise or host.grpc_address
        if leadership is not None and not await asyncio.to_thread(leadership.try_acquire):
            _log.info(
                "controller is a standby",
                extra={"advertise": leadership.advertise, "leader": leadership.leader_address},
            )
            announce("standby", dict(addresses))
            tasks.append(asyncio.create_task(stand_by(addresses)))
        else:
            if leadership is not None:
                _log.info(
                    "controller is the leader",
                    extra={"advertise": leadership.advertise, "epoch": leadership.epoch},
                )
            try:
                await lead(addresses)
            except StoreError as exc:  # the leader's first reads and writes (activate)
                where = location.display
                _log.error("cannot open the store", extra={"db": where, "error": str(exc)})
                return 1
            except OSError as exc:
                _log.error("cannot start serving", extra={"error": str(exc)})
                return 1
        await host.serve_until_signal(on_shutdown=shutdown)
    finally:
        for task in tasks:
            task.cancel()
        if console is not None:
            await console.close()
        await host.stop()
        await controller.close()
        if leadership is not None:
            leadership.close()
    _log.info("controller stopped")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the controller until SIGTERM/SIGINT; returns the process exit code."""
    die_with_parent()  # a launcher's child: gone with the launcher (SIGKILL too)
    configure_logging("controller", args.log_level)
    configure_tracing("controller")
    try:
        config = build_config(args)
        auth = _auth_policy(args)
    except ValueError as exc:
        _log.error(str(exc))
        return 2
    return asyncio.run(_serve(args, config, auth))
