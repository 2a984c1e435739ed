"""``halcyon fleet``: see the fleet, and take a replica out of service and back, by name.

What it decides: how an operator reads ``ControlService/GetState`` and drives
``DrainReplica`` / ``UndrainReplica`` without grpcurl — ``status`` (one aligned table of
replicas, a line per gateway, the routing and any running rollout), ``drain REPLICA [--wait]``
and ``undrain REPLICA``; ``--json`` prints the controller's answer as JSON for scripts
(``json_format`` with the proto field names, as grpcurl prints them, and fields at their
default shown, so ``load.draining`` is always there to read).

``drain --wait`` ends when the replica has no batch in flight, judged from its heartbeats (the
only place GetState shows work in flight): the wait is over at the second heartbeat after the
drain whose ``busy_slots`` is 0. The second, not the first, because a heartbeat the worker sent
just before it read the drain command could still say 0 while a gateway's last batch is on its
way. Progress goes to stderr, one line each time the busy count changes.

Connection and credential as ``halcyon rollout`` (:class:`halcyon.tools.operator_cli.Console`,
:mod:`halcyon.tools.operator_cli`): ``--controller``, ``--operator-token-file PATH`` or
``$HALCYON_OPERATOR_TOKEN`` (never a flag with the secret), else the insecure dev token with a
warning; the channel pings as every fleet channel does (``$HALCYON_KEEPALIVE_S``). Every failure
is one line on stderr — the status, the ``ErrorInfo`` reason and the controller's message.

Exit codes: 0 done; 1 the controller refused (an unknown replica is ``NOT_FOUND
(UNKNOWN_REPLICA)``, a missing or wrong credential ``UNAUTHENTICATED``, a fleet credential
``PERMISSION_DENIED (WRONG_ROLE)``) or could not be reached, or the replica left the fleet or
was undrained during ``--wait``; 2 bad flags; 3 ``drain --wait`` timed out with batches still
in flight (the drain itself stands).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from common.durations import to_seconds
from halcyon.tools.operator_cli import CliError, Console, add_controller_flags, run_command, table
from halcyon.tools.rollout_display import ROLLOUT_HEADERS, rollout_rows
from halcyon.v1 import control_pb2, fleet_pb2

__all__ = [
    "EXIT_STILL_BUSY",
    "REPLICA_HEADERS",
    "configure",
    "drained",
    "replica_rows",
    "run",
]

EXIT_STILL_BUSY = 3
DRAIN_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.25
# Heartbeats after the drain that must report no busy slot (see the module docstring).
QUIET_HEARTBEATS = 2

_EPILOG = """\
examples (against `make stack`):
  halcyon fleet status
  halcyon fleet status --json | jq '.replicas[].load'
  halcyon fleet drain replica-b --wait     # returns once its in-flight batches are done
  halcyon fleet undrain replica-b

credentials: the operator token from --operator-token-file PATH or $HALCYON_OPERATOR_TOKEN
(the insecure dev token otherwise, with a warning).
exit codes: 0 ok; 1 the controller refused or could not be reached (one line says why: an
unknown replica is NOT_FOUND (UNKNOWN_REPLICA)), or the replica left or was undrained during
--wait; 2 bad flags; 3 drain --wait timed out with batches still in flight.
"""

REPLICA_HEADERS = (
    "replica", "model", "version", "runtime", "hardware", "state", "busy", "batches", "speed",
    "lease", "learned cost (gateway fit)",
)  # fmt: skip


# -- status -----------------------------------------------------------------------------------


def _ms(d: Any) -> float:
    return to_seconds(d) * 1000.0


def _fits(state: control_pb2.GetStateResponse) -> dict[str, fleet_pb2.CostModel]:
    """Per replica, the cost model of the gateway that learned it from the most batches."""
    best: dict[str, fleet_pb2.CostModel] = {}
    for gateway in state.gateways:
        for model in gateway.cost_models:
            known = best.get(model.replica_id)
            if known is None or model.samples > known.samples:
                best[model.replica_id] = model
    return best


def _learned(fit: fleet_pb2.CostModel | None) -> str:
    if fit is None or not fit.samples:
        return "-"
    text = f"{_ms(fit.intercept):.2f} ms + {_ms(fit.per_token):.4f} ms/token"
    if fit.per_step.seconds or fit.per_step.nanos:
        text += f" + {_ms(fit.per_step):.3f} ms/step"
    return f"{text} ({fit.samples} batches)"


def _state(member: control_pb2.FleetMember, now: float) -> str:
    if member.lease_expires_at.seconds and member.lease_expires_at.ToNanoseconds() / 1e9 < now:
        return "lapsed"
    return "draining" if member.load.draining else "serving"


def replica_rows(state: control_pb2.GetStateResponse, now: float) -> list[list[str]]:
    """One row per registered replica (:data:`REPLICA_HEADERS`), in replica-id order."""
    fits = _fits(state)
    rows = []
    for member in sorted(state.replicas, key=lambda m: m.replica.replica_id):
        r, load = member.replica, member.load
        lease = member.lease_expires_at.ToNanoseconds() / 1e9 - now
        failed = f" ({load.batches_failed} failed)" if load.batches_failed else ""
        rows.append(
            [
                r.replica_id,
                r.model,
                r.version,
                r.runtime or "-",
                r.hardware or "-",
                _state(member, now),
                f"{load.busy_slots}/{r.slots}",
                f"{load.batches_total}{failed}",
                f"{r.speed:g}x",
                f"{lease:.1f}s" if member.lease_expires_at.seconds else "-",
                _learned(fits.get(r.replica_id)),
            ]
        )
    return rows


def _gateway_lines(state: control_pb2.GetStateResponse, now: float) -> list[str]:
    lines = []
    for g in sorted(state.gateways, key=lambda g: g.gateway_id):
        seen = now - g.last_report_at.ToNanoseconds() / 1e9
        lines.append(
            f"gateway {g.gateway_id}: concurrency limit {g.concurrency_limit}, "
            f"{g.inflight} in flight, last report {max(0.0, seen):.1f} s ago"
        )
    return lines


def _routing_lines(state: control_pb2.GetStateResponse) -> list[str]:
    lines = []
    for x in state.routing:
        line = f"routing {x.model}: stable {x.stable_version or '(none)'}"
        if x.canary_version:
            line += f", canary {x.canary_version} at {x.canary_weight_bp / 100:g}%"
        lines.append(line)
    return lines


def cmd_status(console: Console, args: argparse.Namespace) -> int:
    state = console.call(console.stub.GetState, control_pb2.GetStateRequest())
    if args.json:
        console.emit_json(state)
        return 0
    now = time.time()
    if state.replicas:
        print(table(REPLICA_HEADERS, replica_rows(state, now)))
    else:
        print("no replicas registered")
    extra = [*_gateway_lines(state, now), *_routing_lines(state)]
    if extra:
        print()
        print("\n".join(extra))
    running = [r for r in state.rollouts if r.state == control_pb2.ROLLOUT_STATE_PROGRESSING]
    if running:
        print()
        print(table(ROLLOUT_HEADERS, rollout_rows(running)))
    return 0


# -- drain and undrain ------------------------------------------------------------------------


def _member(console: Console, replica_id: str, timeout_s: float) -> control_pb2.FleetMember | None:
    state: control_pb2.GetStateResponse = console.stub.GetState(
        control_pb2.GetStateRequest(), metadata=console.metadata, timeout=timeout_s
    )
    for member in state.replicas:
        if member.replica.replica_id == replica_id:
            return member
    return None


def drained(heartbeats_since_drain: int, member: control_pb2.FleetMember) -> bool:
    """True once enough heartbeats after the drain came in and the latest reports no busy slot."""
    return heartbeats_since_drain >= QUIET_HEARTBEATS and member.load.busy_slots == 0


def _say(args: argparse.Namespace, message: str) -> None:
    print(f"halcyon fleet {args.action}: {message}", file=sys.stderr, flush=True)


def wait_drained(
    console: Console,
    args: argparse.Namespace,
    answer: control_pb2.DrainReplicaResponse,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll GetState until the replica has no batch in flight (0), or ``args.timeout`` passes
    (:data:`EXIT_STILL_BUSY`). Raises CliError if it leaves the fleet or is undrained."""
    rid = answer.replica.replica.replica_id
    started = clock()
    deadline = started + args.timeout
    last_lease = answer.replica.lease_expires_at.ToNanoseconds()
    heartbeats = 0
    shown: tuple[int, int] | None = None
    member = answer.replica
    while True:
        left = deadline - clock()
        if left <= 0:
            slots = member.replica.slots
            _say(
                args,
                f"{rid} still had {member.load.busy_slots}/{slots} slots busy after "
                f"{args.timeout:g} s (--timeout); it stays draining, and its batches finish "
                "within its shutdown grace",
            )
            return EXIT_STILL_BUSY
        found = _member(console, rid, max(0.1, min(left, 10.0)))
        if found is None:
            raise CliError(
                f"{rid} left the fleet while draining (its process stopped or its lease lapsed)"
            )
        member = found
        if not member.load.draining:
            raise CliError(
                f"{rid} is no longer draining (undrained, or its process registered again) "
                "while waiting for its drain to finish"
            )
        lease = member.lease_expires_at.ToNanoseconds()
        if lease != last_lease:  # a heartbeat arrived: every one renews the lease
            heartbeats += 1
            last_lease = lease
        if drained(heartbeats, member):
            elapsed = clock() - started
            if args.json:
                return 0
            print(f"{rid} drained: no batch in flight ({elapsed:.1f} s)")
            return 0
        progress = (member.load.busy_slots, member.replica.slots)
        if progress != shown:
            shown = progress
            _say(
                args,
                f"waiting for {rid}: {progress[0]}/{progress[1]} slots busy at its last "
                f"heartbeat ({clock() - started:.1f} s of {args.timeout:g})",
            )
        sleep(max(0.0, min(POLL_INTERVAL_S, deadline - clock())))


def _drain_line(member: control_pb2.FleetMember) -> str:
    r, load = member.replica, member.load
    return (
        f"{r.replica_id} ({r.model} {r.version}): draining, {load.busy_slots}/{r.slots} slots "
        "busy at its last heartbeat"
    )


def cmd_drain(console: Console, args: argparse.Namespace) -> int:
    answer = console.call(
        console.stub.DrainReplica, control_pb2.DrainReplicaRequest(replica_id=args.replica)
    )
    if args.json:
        console.emit_json(answer)
    else:
        print(_drain_line(answer.replica))
        print(answer.next_steps)
        print(f"undo: halcyon fleet undrain {answer.replica.replica.replica_id}")
    if args.wait:
        return wait_drained(console, args, answer)
    return 0


def cmd_undrain(console: Console, args: argparse.Namespace) -> int:
    answer = console.call(
        console.stub.UndrainReplica, control_pb2.UndrainReplicaRequest(replica_id=args.replica)
    )
    if args.json:
        console.emit_json(answer)
    else:
        r = answer.replica.replica
        done = "undrained" if answer.was_draining else "was not draining"
        print(f"{r.replica_id} ({r.model} {r.version}): {done}")
        print(answer.next_steps)
    return 0


# -- argument parsing -------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The fleet as the controller sees it, and a replica out of service and back without "
        "a restart: drain stops gateways sending it batches at once and lets the running ones "
        "finish; it stays registered, shown as draining, until undrain."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name,
            help=help_text,
            description=help_text[0].upper() + help_text[1:] + ".",
            epilog=_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return p

    status = action("status", "replicas (state, load, learned cost), gateways, routing, rollouts")
    add_controller_flags(status)

    drain = action("drain", "stop sending a replica work; it stays registered")
    drain.add_argument("replica", help="replica id, as `halcyon fleet status` lists it")
    drain.add_argument(
        "--wait",
        action="store_true",
        help="then wait until it has no batch in flight (progress on stderr; exit 3 if "
        "--timeout passes first)",
    )
    add_controller_flags(
        drain,
        timeout_s=DRAIN_TIMEOUT_S,
        timeout_help="deadline of each call to the controller, and with --wait how long to "
        "wait for the replica's batches to finish",
    )

    undrain = action("undrain", "let a drained replica take work again")
    undrain.add_argument("replica", help="replica id, as `halcyon fleet status` lists it")
    add_controller_flags(undrain)


_COMMANDS: dict[str, Callable[[Console, argparse.Namespace], int]] = {
    "status": cmd_status,
    "drain": cmd_drain,
    "undrain": cmd_undrain,
}


def run(args: argparse.Namespace) -> int:
    return run_command(f"halcyon fleet {args.action}", args, _COMMANDS)
