"""The ``halcyon stack`` command: its flags, the checks before anything starts, and its run.

What it decides: what must hold before a child starts, and what is left after the stack stops.

* **No secret in sight.** Credentials come from ``--fleet-token-file`` /
  ``--operator-token-file`` or ``$HALCYON_FLEET_TOKEN`` / ``$HALCYON_OPERATOR_TOKEN``, else the
  public development tokens (the stack runs its children in development mode, loopback only);
  children get them through their environment, never their command line. The operator token
  is written to ``<state-dir>/operator-token`` (mode 0600).
* **A port already taken** is reported with the process holding it, before anything starts.
* **Nothing left behind.** The temporary state directory is removed at exit unless
  ``--state-dir`` was given, and those of stacks that died without cleaning up are removed by
  the next one.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from common.argtypes import hostport, non_negative
from common.credentials import (
    DEV_FLEET_TOKEN,
    DEV_MODE_ENV,
    DEV_OPERATOR_TOKEN,
    FLEET_TOKEN_ENV,
    OPERATOR_TOKEN_ENV,
    CredentialError,
    add_credential_arguments,
    is_loopback,
    load_credentials,
)
from common.ports import describe_port_holders
from common.serving import parse_hostport
from halcyon.tools.stack_howto import describe_stack
from halcyon.tools.stack_layout import OPERATOR_TOKEN_FILE, PID_FILE, STATE_PREFIX, nth_address
from halcyon.tools.stack_supervisor import Stack, StackError, _say, _StopRequested

# -- state directory, ports, credentials ----------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (0600), replacing any file."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_state_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove the temporary state directories of stacks that died without cleaning up (their
    ``stack.pid`` names a process that no longer exists); returns what was removed."""
    removed = []
    for d in (tmp or Path(tempfile.gettempdir())).glob(f"{STATE_PREFIX}*"):
        try:
            if not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            pid = int((d / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _check_runtime(args: argparse.Namespace) -> None:
    if args.runtime != "simulated" and (
        args.zero_device_time or args.intercept_ms is not None or args.ms_per_token is not None
    ):
        raise StackError(
            "--zero-device-time, --intercept-ms and --ms-per-token describe the simulated "
            f"device; --runtime {args.runtime} measures its real cost instead"
        )


def _check_ports(args: argparse.Namespace) -> None:
    gateways = range(getattr(args, "gateways", 1))
    for flag, listen in (
        ("--controller-listen", args.controller_listen),
        *[("--gateway-listen", nth_address(args.gateway_listen, i)) for i in gateways],
        *[("--gateway-metrics-listen", nth_address(args.gateway_metrics_listen, i))
          for i in gateways],
        *([("--console-listen", args.console_listen)] if args.console_listen else []),
    ):  # fmt: skip
        host, port = parse_hostport(listen)
        if not is_loopback(host):
            raise StackError(
                f"{flag} {listen}: the stack runs in development mode with public credentials, "
                "so it listens on loopback only; use 127.0.0.1:PORT"
            )
        holders = describe_port_holders(port) if port else ""
        if holders:
            raise StackError(
                f"port {port} ({flag}) is already in use, {holders}; stop that process or "
                f"pass {flag} 127.0.0.1:PORT (0 picks a free port)"
            )


def _child_env(args: argparse.Namespace) -> dict[str, str]:
    """The children's environment: this one, plus the credentials and development mode."""
    args.dev_mode = True  # public dev tokens when none are configured; loopback is checked
    quiet = logging.getLogger("halcyon.credentials")
    level, quiet.level = quiet.level, logging.ERROR  # one note below instead of a log line each
    try:
        credentials = load_credentials(
            args, fleet_required=True, operator_required=True, listen=args.gateway_listen
        )
    finally:
        quiet.setLevel(level)
    assert credentials.fleet is not None and credentials.operator is not None
    public = [
        name
        for name, token in (("fleet", credentials.fleet), ("operator", credentials.operator))
        if token in (DEV_FLEET_TOKEN, DEV_OPERATOR_TOKEN)
    ]
    if public:
        _say(
            f"development mode: the public dev {' and '.join(public)} token (loopback only); "
            f"set ${FLEET_TOKEN_ENV} / ${OPERATOR_TOKEN_ENV} or pass --*-token-file for your own"
        )
    env = dict(os.environ)
    env[FLEET_TOKEN_ENV] = credentials.fleet
    env[OPERATOR_TOKEN_ENV] = credentials.operator
    env[DEV_MODE_ENV] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- the command ------------------------------------------------------------------------------


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the whole system on loopback: a controller, a heterogeneous fleet (fast v1, 0.6x "
        "straggler v1, and with --canary a faster v2) and a gateway, each its own process, "
        "supervised (a process that dies is restarted on the same ports). Prints the ports "
        "and ready-to-paste commands; Ctrl-C stops everything."
    )
    parser.add_argument("--canary", action="store_true", help="add a v2 replica on faster hardware")
    parser.add_argument(
        "--runtime",
        choices=("simulated", "onnx"),
        default="simulated",
        help="what the workers run: the calibrated simulated device, or a real byte-level "
        "decoder in ONNX Runtime (generated on first use into ~/.cache/halcyon, or "
        "$HALCYON_CACHE_DIR), on two threads for replica-a and one for replica-b "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--batching",
        choices=("halcyon", "fixed", "none"),
        default="halcyon",
        help="the gateway's batching: deadline-aware (halcyon), the seed's fixed 32 items / "
        "25 ms (fixed), or one request per batch (none) (default %(default)s)",
    )
    parser.add_argument(
        "--gateways",
        type=_at_least_one,
        default=1,
        metavar="N",
        help="gateways to run, on consecutive ports from --gateway-listen's and "
        "--gateway-metrics-listen's (50051, 50052, …), each told --expected-gateways N: "
        "tenant quotas are then shared by the N, as the controller's leases split them "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--gateway-listen",
        type=hostport,
        metavar="HOST:PORT",
        default="127.0.0.1:50051",
        help="gateway gRPC address (default %(default)s)",
    )
    parser.add_argument(
        "--gateway-metrics-listen",
        type=hostport,
        metavar="HOST:PORT",
        default="127.0.0.1:9451",
        help="gateway /metrics address (default %(default)s)",
    )
    parser.add_argument(
        "--controller-listen",
        type=hostport,
        metavar="HOST:PORT",
        default="127.0.0.1:50050",
        help="controller gRPC address (default %(default)s)",
    )
    parser.add_argument(
        "--console-listen",
        type=hostport,
        metavar="HOST:PORT",
        default=None,
        help="the controller's operator console, a web page; loopback only (default: the "
        "controller's, 127.0.0.1:9440, or none when that port is taken)",
    )
    parser.add_argument(
        "--zero-device-time",
        action="store_true",
        help="workers take no device time (measures the gateway's own overhead); "
        "same as --intercept-ms 0 --ms-per-token 0",
    )
    parser.add_argument(
        "--intercept-ms",
        type=non_negative,
        metavar="MS",
        help="every worker's fixed cost per batch (default: the worker's, 18); a worker "
        "registers after measuring two warm-up batches, so with 5000 the fleet serves ~10 s "
        "after start",
    )
    parser.add_argument(
        "--ms-per-token",
        type=non_negative,
        metavar="MS",
        help="every worker's marginal cost per token (default: the worker's, 0.022)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="controller database, logs and the operator-token file; kept at exit "
        "(default: a temporary directory, removed at exit)",
    )
    parser.add_argument("--verbose", action="store_true", help="stream every process's logs here")
    add_credential_arguments(
        parser,
        fleet_use="shared by the stack's processes",
        operator_use="for the controller's operator API",
        dev_mode_flag=False,
    )


def _make_state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir is not None:
        state_dir: Path = args.state_dir.resolve()
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    else:
        remove_stale_state_dirs()
        state_dir = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
    (state_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    return state_dir


def run(args: argparse.Namespace) -> int:
    try:
        _check_runtime(args)
        _check_ports(args)
        env = _child_env(args)
    except (StackError, CredentialError) as err:
        print(f"stack: {err}", file=sys.stderr)
        return 2
    state_dir = _make_state_dir(args)
    _write_private(state_dir / OPERATOR_TOKEN_FILE, env[OPERATOR_TOKEN_ENV])
    stack = Stack(args, state_dir, env)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stack.signals.handler)
    code = 0
    try:
        stack.start()
        print(describe_stack(stack), flush=True)
        stack.supervise()
        _say(f"\n{stack.signals.last}: stopping (again to hurry)…")
    except _StopRequested:
        _say(f"\n{stack.signals.last} while starting: stopping…")
    except StackError as err:
        _say(f"stack: {err}")
        code = 1
    finally:
        stack.stop()
        if args.state_dir is None:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            (state_dir / PID_FILE).unlink(missing_ok=True)
    return code
