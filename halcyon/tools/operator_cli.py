"""What every operator command (``halcyon rollout``, ``halcyon fleet``) shares with the others.

What it decides: the flags that reach the controller — ``--controller`` (default
127.0.0.1:50050), ``--operator-token-file`` (else ``$HALCYON_OPERATOR_TOKEN``, else the
insecure dev token with a warning; deliberately no flag that takes the secret itself), the
per-call ``--timeout`` and ``--json`` — and how a refusal reads: one line, the status, the
``ErrorInfo`` reason in brackets and the controller's message, plus a hint when nothing
answered at the address. One module so that two commands cannot drift apart in either.

The connection (:class:`Console`: the credential, the keepalive-pinged channel, the deadline of
each call), the table and JSON output, and :func:`run_command` — every operator command's
error handling and exit codes — live here too, so ``halcyon rollout`` and ``halcyon fleet`` are
only their subcommands.

``--controller`` may list several controllers that elect a leader (issue #22): a unary call
refused ``UNAVAILABLE`` — a standby's ``NOT_LEADER`` naming the leader, or nothing answering —
is sent once more, to the named leader or the next address (:mod:`common.controller_targets`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from common import keepalive
from common.argtypes import positive
from common.auth import bearer_metadata
from common.controller_targets import ControllerTargets, controller_addresses
from common.credentials import DEV_OPERATOR_TOKEN, OPERATOR_TOKEN_ENV
from common.errors import RichError, parse_rpc_error
from halcyon.v1 import control_pb2, control_pb2_grpc

__all__ = [
    "DEFAULT_CONTROLLER",
    "CliError",
    "Console",
    "add_controller_flags",
    "as_dict",
    "describe",
    "read_secret",
    "refusal_line",
    "run_command",
    "table",
]

DEFAULT_CONTROLLER = "127.0.0.1:50050"


def add_controller_flags(
    parser: argparse.ArgumentParser,
    *,
    timeout_s: float = 10.0,
    timeout_help: str = "deadline of each call to the controller",
) -> None:
    """``--controller``, ``--operator-token-file``, ``--timeout`` and ``--json``, as every
    operator command spells them (``args.controller``, ``args.operator_token_file``,
    ``args.timeout``, ``args.json``: what :class:`Console` reads)."""
    parser.add_argument(
        "--controller",
        type=controller_addresses,
        default=DEFAULT_CONTROLLER,
        metavar="HOST:PORT[,HOST:PORT...]",
        help=f"controller address; several (comma-separated) for controllers that elect a "
        f"leader (default {DEFAULT_CONTROLLER})",
    )
    parser.add_argument(
        "--operator-token-file",
        type=Path,
        metavar="PATH",
        help=f"file holding the operator token (default ${OPERATOR_TOKEN_ENV}, else the "
        "insecure dev token)",
    )
    parser.add_argument(
        "--timeout",
        type=positive,
        default=timeout_s,
        metavar="SECONDS",
        help=f"{timeout_help} (default {timeout_s:g})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def describe(err: RichError) -> str:
    """``STATUS (REASON): message`` — the status name, the ErrorInfo reason if any."""
    reason = f" ({err.reason})" if err.reason else ""
    return f"{err.code.name}{reason}: {err.message}"


def refusal_line(prog: str, err: RichError, controller: str) -> str:
    """The one stderr line for a failed call; a bare UNAVAILABLE (nothing answered, no
    Halcyon reason) asks whether a controller runs at the address."""
    hint = ""
    if err.code == grpc.StatusCode.UNAVAILABLE and not err.reason:
        hint = f" (is a controller running at {controller}?)"
    return f"{prog}: {describe(err)}{hint}"


class CliError(Exception):
    """A failure to report as one line and exit 1."""


# -- credentials and the connection -----------------------------------------------------------


def read_secret(path: Path | None, env: str, what: str) -> str | None:
    """A credential from a file (first line, stripped) or the environment; None if neither."""
    if path is not None:
        try:
            text = path.read_text().strip()
        except OSError as exc:
            raise CliError(f"cannot read the {what} file {path}: {exc.strerror}") from None
        if not text:
            raise CliError(f"the {what} file {path} is empty")
        return text.splitlines()[0].strip()
    value = os.environ.get(env, "").strip()
    return value or None


class Console:
    """The controller connection and the output conventions of one command."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        token = read_secret(args.operator_token_file, OPERATOR_TOKEN_ENV, "operator token")
        if token is None:
            print(
                f"warning: using the insecure dev operator token; set ${OPERATOR_TOKEN_ENV} "
                "or --operator-token-file",
                file=sys.stderr,
            )
            token = DEV_OPERATOR_TOKEN
        self.metadata = bearer_metadata(token)
        # Watches stream decisions with long quiet spells: pinged as every fleet channel is.
        self.targets = ControllerTargets(args.controller)
        self._connect()
        self.timeout = args.timeout

    def _connect(self) -> None:
        self.channel = grpc.insecure_channel(self.targets.current, keepalive.client_options())
        self.stub = control_pb2_grpc.ControlServiceStub(self.channel)

    def call(self, method: Callable[..., Any], request: Any) -> Any:
        """A unary call with the operator credential and the command's deadline (``method`` is
        one of :attr:`stub`'s); refused UNAVAILABLE, sent once more to the leader the refusal
        names or the next controller listed."""
        try:
            return method(request, metadata=self.metadata, timeout=self.timeout)
        except grpc.RpcError as exc:
            if not self.targets.move_on(parse_rpc_error(exc)):
                raise
        name = next(n for n, m in vars(self.stub).items() if m is method)
        self.channel.close()
        self._connect()
        return getattr(self.stub, name)(request, metadata=self.metadata, timeout=self.timeout)

    def watch(self, model: str, replay: int) -> Iterable[control_pb2.WatchRolloutDecisionsResponse]:
        """The live decision stream (no deadline: it runs until told to stop)."""
        call: Iterable[control_pb2.WatchRolloutDecisionsResponse] = self.stub.WatchRolloutDecisions(
            control_pb2.WatchRolloutDecisionsRequest(model=model, replay=replay),
            metadata=self.metadata,
        )
        return call

    def close(self) -> None:
        self.channel.close()

    def emit_json(self, message: Any) -> None:
        print(json.dumps(as_dict(message), sort_keys=True), flush=True)


def as_dict(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], widths: Sequence[int] = ()) -> str:
    """Left-aligned columns, at least ``widths`` wide; the last column is free text."""
    minimum = [*widths, *[0] * len(headers)][: len(headers)]
    widths = [max(len(h), w) for h, w in zip(headers, minimum, strict=True)]
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(widths[i]) for i, c in enumerate(cells[:-1])]
        return "  ".join([*padded, cells[-1]]).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def run_command(
    prog: str,
    args: argparse.Namespace,
    commands: Mapping[str, Callable[[Console, argparse.Namespace], int]],
) -> int:
    """Run ``commands[args.action]`` on a fresh :class:`Console`: a refusal or a
    :class:`CliError` is one line on stderr and exit 1, never a traceback."""
    console: Console | None = None
    try:
        console = Console(args)
        return commands[args.action](console, args)
    except grpc.RpcError as exc:
        print(refusal_line(prog, parse_rpc_error(exc), args.controller), file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python's exit-time flush of
        # stdout from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if console is not None:
            console.close()
