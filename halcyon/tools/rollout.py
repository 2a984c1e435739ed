"""``halcyon rollout``: ship a new model version from the command line.

What it decides: how an operator drives the rollout RPCs — ``start``, ``status``, ``promote``,
``abort``, the gates ``pause``, ``resume`` and ``approve`` (issue #20), ``history``, ``watch``
and ``verify`` (:mod:`halcyon.tools.rollout_verify`) — and how the answers read: aligned tables by
default, ``--json`` for scripts (one object; ``watch`` prints one object per line as decisions
arrive). Every failure is one line on stderr — the status, the ``ErrorInfo`` reason and the
controller's message, which says what to do — and a non-zero exit (1), never a traceback.
``watch --until-done`` and ``start --watch`` exit 0 when the canary is promoted and 3 when it is
rolled back or aborted, so a deploy script can branch on the outcome; for an analysis-only
rollout the same codes say what the judge *would* have done (0: it would promote).

Gate state shows wherever a rollout does: ``status`` has a ``gates`` column (``paused``,
``no-auto-rollback``, ``awaiting_approval``, ``approval=…``, ``analysis-only``), and a decision
an analysis-only rollout recorded but did not apply prints its action in parentheses, e.g.
``(advance)``, in ``history`` and ``watch``.

The operator credential comes from ``--operator-token-file PATH`` or ``$HALCYON_OPERATOR_TOKEN``
(there is deliberately no flag that takes the secret itself: command lines are visible to every
user of the machine); with neither, the insecure dev token, with a warning.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable

from common.argtypes import positive, probability
from common.durations import to_duration
from controller.canary import JudgePolicy
from halcyon.tools import rollout_verify
from halcyon.tools.operator_cli import (
    CliError,
    Console,
    add_controller_flags,
    as_dict,
    run_command,
    table,
)
from halcyon.tools.rollout_display import (
    DECISION_HEADERS,
    EXIT_NOT_PROMOTED,
    ROLLOUT_HEADERS,
    TERMINAL_ACTIONS,
    count_at_least,
    decision_row,
    parse_steps,
    rollout_rows,
    stream_header,
    stream_row,
)
from halcyon.v1 import control_pb2

__all__ = ["configure", "run"]

DEFAULT_MODEL = "llama-3-8b"
_APPROVAL = {
    "promotion": control_pb2.APPROVAL_MODE_PROMOTION,
    "every-step": control_pb2.APPROVAL_MODE_EVERY_STEP,
}

_EPILOG = """\
examples (against `make stack`):
  halcyon rollout start llama-3-8b v2 --steps 5,25,50,100 --watch
  halcyon rollout status
  halcyon rollout history llama-3-8b --limit 20
  halcyon rollout watch llama-3-8b --replay 5
  halcyon rollout abort llama-3-8b --reason "error budget"
  halcyon rollout start llama-3-8b v2 --require-approval   # then: halcyon rollout approve
  halcyon rollout start llama-3-8b v2 --analysis-only      # a dry run: judged, never routed
  halcyon rollout pause llama-3-8b --no-auto-rollback; halcyon rollout resume llama-3-8b
  halcyon rollout verify          # ships four candidates against the running stack

credentials: the operator token from --operator-token-file PATH or $HALCYON_OPERATOR_TOKEN
(the insecure dev token otherwise, with a warning).
exit codes: 0 ok; 1 the controller refused or could not be reached (one line says why);
2 bad flags; 3 (--watch / --until-done / verify) the canary was not promoted as expected.
"""


# -- subcommands ------------------------------------------------------------------------------


def _policy(args: argparse.Namespace) -> control_pb2.RolloutPolicy:
    policy = control_pb2.RolloutPolicy(
        min_requests=args.min_requests or 0,
        max_error_rate_increase=args.max_error_rate_increase or 0.0,
        max_error_rate_ratio=args.max_error_rate_ratio or 0.0,
        max_p95_ratio=args.max_p95_ratio or 0.0,
        healthy_windows_to_advance=args.healthy_windows or 0,
        unhealthy_windows_to_rollback=args.unhealthy_windows or 0,
        false_alarm_rate=args.false_alarm_rate or 0.0,
    )
    if args.window:
        policy.window.CopyFrom(to_duration(args.window))
    if args.max_duration:
        policy.max_duration.CopyFrom(to_duration(args.max_duration))
    return policy


def cmd_start(console: Console, args: argparse.Namespace) -> int:
    request = control_pb2.StartRolloutRequest(
        model=args.model,
        canary_version=args.canary_version,
        step_percents=args.steps,
        policy=_policy(args),
        approval=_APPROVAL.get(args.require_approval or "", control_pb2.APPROVAL_MODE_UNSPECIFIED),
        analysis_only=args.analysis_only,
    )
    started = console.call(console.stub.StartRollout, request).rollout
    if args.json and not args.watch:
        console.emit_json(started)
        return 0
    if not args.json:
        print(table(ROLLOUT_HEADERS, rollout_rows([started])))
    if args.watch:
        return follow(console, args.model, replay=0, until_done=True, as_json=args.json)
    return 0


def cmd_status(console: Console, args: argparse.Namespace) -> int:
    state = console.call(console.stub.GetState, control_pb2.GetStateRequest())
    rollouts = [r for r in state.rollouts if not args.model or r.model == args.model]
    if not args.all:
        # Running rollouts, and for a model with none running its latest one.
        latest: dict[str, control_pb2.Rollout] = {}
        for r in rollouts:
            latest[r.model] = r
        rollouts = [
            r
            for r in rollouts
            if r.state == control_pb2.ROLLOUT_STATE_PROGRESSING or latest[r.model] is r
        ]
    routes = [x for x in state.routing if not args.model or x.model == args.model]
    if args.json:
        print(
            json.dumps(
                {
                    "rollouts": [as_dict(r) for r in rollouts],
                    "routing": [as_dict(x) for x in routes],
                },
                sort_keys=True,
            )
        )
        return 0
    if rollouts:
        print(table(ROLLOUT_HEADERS, rollout_rows(rollouts)))
    else:
        print("no rollouts" + (f" of {args.model}" if args.model else ""))
    if routes:
        rows = [
            [x.model, x.stable_version or "(none)", x.canary_version or "-",
             f"{x.canary_weight_bp / 100:g}"]
            for x in routes
        ]  # fmt: skip
        print()
        print(table(("model", "stable", "canary", "canary %"), rows))
    return 0


def cmd_promote(console: Console, args: argparse.Namespace) -> int:
    done = console.call(
        console.stub.PromoteRollout, control_pb2.PromoteRolloutRequest(model=args.model)
    ).rollout
    return _show_rollout(console, args, done)


def cmd_abort(console: Console, args: argparse.Namespace) -> int:
    done = console.call(
        console.stub.AbortRollout,
        control_pb2.AbortRolloutRequest(model=args.model, reason=args.reason),
    ).rollout
    return _show_rollout(console, args, done)


def cmd_pause(console: Console, args: argparse.Namespace) -> int:
    request = control_pb2.PauseRolloutRequest(
        model=args.model, auto_rollback=args.auto_rollback, reason=args.reason
    )
    return _show_rollout(console, args, console.call(console.stub.PauseRollout, request).rollout)


def cmd_resume(console: Console, args: argparse.Namespace) -> int:
    request = control_pb2.ResumeRolloutRequest(model=args.model, reason=args.reason)
    return _show_rollout(console, args, console.call(console.stub.ResumeRollout, request).rollout)


def cmd_approve(console: Console, args: argparse.Namespace) -> int:
    reply = console.call(
        console.stub.ApproveRollout, control_pb2.ApproveRolloutRequest(model=args.model)
    )
    if args.json:
        console.emit_json(reply)
        return 0
    print(table(ROLLOUT_HEADERS, rollout_rows([reply.rollout])))
    print()
    print(table(DECISION_HEADERS, [decision_row(reply.decision)]))
    return 0


def _show_rollout(console: Console, args: argparse.Namespace, r: control_pb2.Rollout) -> int:
    if args.json:
        console.emit_json(r)
    else:
        print(table(ROLLOUT_HEADERS, rollout_rows([r])))
    return 0


def cmd_history(console: Console, args: argparse.Namespace) -> int:
    listed = console.call(
        console.stub.ListRolloutDecisions,
        control_pb2.ListRolloutDecisionsRequest(model=args.model or "", limit=args.limit),
    )
    if args.json:
        console.emit_json(listed)
    elif listed.decisions:
        print(table(DECISION_HEADERS, [decision_row(d) for d in listed.decisions]))
    else:
        print("no decisions" + (f" for {args.model}" if args.model else ""))
    return 0


def follow(console: Console, model: str, *, replay: int, until_done: bool, as_json: bool) -> int:
    """Print decisions as they are taken; with ``until_done`` stop at the first terminal one
    (exit 0 promoted, EXIT_NOT_PROMOTED otherwise)."""
    if not as_json:
        print(stream_header(), flush=True)
    for item in console.watch(model, replay):
        d = item.decision
        if as_json:
            console.emit_json(d)
        else:
            print(stream_row(d), flush=True)
        if until_done and d.action in TERMINAL_ACTIONS:
            # An analysis-only verdict (applied false) ends the rollout too: 0 if it would
            # have promoted.
            return 0 if d.action == control_pb2.DECISION_ACTION_PROMOTE else EXIT_NOT_PROMOTED
    raise CliError("the controller ended the decision stream (shutting down?)")


def cmd_watch(console: Console, args: argparse.Namespace) -> int:
    return follow(
        console, args.model or "", replay=args.replay, until_done=args.until_done, as_json=args.json
    )


def cmd_verify(console: Console, args: argparse.Namespace) -> int:
    return rollout_verify.verify(console, args)


def _policy_flags(parser: argparse.ArgumentParser) -> None:
    d = JudgePolicy()  # the controller's defaults, shown in --help
    g = parser.add_argument_group("guards (default: the controller's, shown in brackets)")
    g.add_argument(
        "--window", type=positive, metavar="SECONDS", help=f"analysis window [{d.window_s:g}]"
    )
    g.add_argument(
        "--min-requests",
        type=count_at_least(1),
        metavar="N",
        help=f"requests per arm per window [{d.min_requests}]",
    )
    g.add_argument(
        "--max-error-rate-increase",
        type=probability,
        metavar="X",
        help=f"absolute error-rate increase tolerated, 0.01 = 1 point "
        f"[{d.max_error_rate_increase:g}]",
    )
    g.add_argument(
        "--max-error-rate-ratio",
        type=positive,
        metavar="X",
        help=f"error-rate factor tolerated [{d.max_error_rate_ratio:g}]",
    )
    g.add_argument(
        "--max-p95-ratio", type=positive, metavar="X", help=f"p95 factor [{d.max_p95_ratio:g}]"
    )
    g.add_argument(
        "--healthy-windows",
        type=count_at_least(1),
        metavar="N",
        help=f"healthy windows in a row to advance [{d.healthy_windows_to_advance}]",
    )
    g.add_argument(
        "--unhealthy-windows",
        type=count_at_least(1),
        metavar="N",
        help="deprecated, accepted and ignored: an unhealthy window holds the step, and only "
        "the sequential tests roll back (ADR 0008)",
    )
    g.add_argument(
        "--max-duration",
        type=positive,
        metavar="SECONDS",
        help=f"roll back a rollout still undecided after this [{d.max_duration_s:g}]",
    )
    g.add_argument(
        "--false-alarm-rate",
        type=probability,
        metavar="P",
        help=f"chance the sequential tests roll back a healthy canary [{d.false_alarm_rate:g}]",
    )


def _wrapped(text: str) -> str:
    """A description for a raw-formatted parser (its epilog keeps its line breaks)."""
    return textwrap.fill(text, width=90)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Ship a new model version progressively: the controller moves a growing share of "
        "sessions to the canary, compares it with the stable version over the same windows, "
        "and promotes it or rolls it back on the evidence."
    )
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    start = sub.add_parser("start", help="start a rollout of a canary version")
    start.add_argument("model", help="model name, e.g. llama-3-8b")
    start.add_argument("canary_version", help="version to roll out (needs a live replica)")
    start.add_argument(
        "--steps",
        type=parse_steps,
        default=[],
        metavar="P,P,…",
        help="canary percentages, increasing; a final 100 means promote (default 1,5,25,50)",
    )
    start.add_argument(
        "--watch",
        action="store_true",
        help="then stream decisions until promoted (exit 0) or rolled back/aborted (exit 3)",
    )
    gates = start.add_argument_group("gates")
    gates.add_argument(
        "--require-approval",
        nargs="?",
        const="promotion",
        choices=sorted(_APPROVAL),
        metavar="promotion|every-step",
        help="wait for `halcyon rollout approve MODEL` before promoting (the default, "
        "=promotion) or before every step and the promotion (=every-step); the rollout shows "
        "awaiting_approval meanwhile",
    )
    gates.add_argument(
        "--analysis-only",
        action="store_true",
        help="a dry run: judge and record every decision with its evidence, but keep the "
        "canary at the first step's share and never promote; ends as `analyzed`",
    )
    _policy_flags(start)

    status = sub.add_parser("status", help="running rollouts and routing")
    status.add_argument("model", nargs="?", help="only this model")
    status.add_argument("--all", action="store_true", help="every rollout, finished ones too")

    promote = sub.add_parser("promote", help="make the canary the stable version now")
    promote.add_argument("model")
    abort = sub.add_parser("abort", help="send all traffic back to the baseline now")
    abort.add_argument("model")
    abort.add_argument("--reason", default="", help="stored with the decision")

    pause = sub.add_parser(
        "pause",
        help="hold the canary's weight; judging continues",
        description=_wrapped(
            "Hold the canary's weight where it is: the judge keeps judging and every "
            "decision is still stored, but no step advances and nothing is promoted until "
            "`halcyon rollout resume`. A proven regression still rolls back unless "
            "--no-auto-rollback. Survives a controller restart."
        ),
        epilog="example:\n  halcyon rollout pause llama-3-8b --reason 'change freeze'\n"
        "  halcyon rollout pause llama-3-8b --no-auto-rollback   # I will decide myself",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pause.add_argument("model")
    pause.add_argument(
        "--no-auto-rollback",
        dest="auto_rollback",
        action="store_false",
        help="while paused, hold a proven regression (reason rollback_held) for you to abort "
        "or resume, instead of rolling back",
    )
    pause.add_argument("--reason", default="", help="stored with the decision")
    resume = sub.add_parser(
        "resume",
        help="lift a pause: continue from where the rollout was",
        description=_wrapped(
            "Lift a pause: the judge moves traffic on its verdicts again, from the "
            "step the rollout was paused at."
        ),
        epilog="example:\n  halcyon rollout resume llama-3-8b --reason 'freeze over'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    resume.add_argument("model")
    resume.add_argument("--reason", default="", help="stored with the decision")
    approve = sub.add_parser(
        "approve",
        help="let a rollout awaiting approval take its next move",
        description=_wrapped(
            "A rollout started with --require-approval stops when the judge has proven "
            "the step healthy (status shows awaiting_approval); approve lets it take that "
            "move: the promotion, or with --require-approval=every-step the next step. Refused "
            "(ROLLOUT_NOT_AWAITING_APPROVAL) when nothing waits."
        ),
        epilog="example:\n  halcyon rollout start llama-3-8b v2 --require-approval\n"
        "  halcyon rollout status llama-3-8b      # gates: awaiting_approval\n"
        "  halcyon rollout approve llama-3-8b",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    approve.add_argument("model")

    history = sub.add_parser("history", help="stored decisions with their evidence")
    history.add_argument("model", nargs="?", help="only this model")
    history.add_argument(
        "--limit",
        type=count_at_least(1),
        default=50,
        metavar="N",
        help="newest N decisions (default 50)",
    )

    watch = sub.add_parser("watch", help="stream decisions as they are taken")
    watch.add_argument("model", nargs="?", help="only this model")
    watch.add_argument(
        "--replay",
        type=count_at_least(0),
        default=0,
        metavar="N",
        help="first show the N newest (default 0)",
    )
    watch.add_argument(
        "--until-done",
        action="store_true",
        help="exit at the first promote (0) or rollback/abort (3)",
    )

    verify = sub.add_parser(
        "verify",
        help="ship a faster, an erroring, a slow and an A/A candidate against a running stack",
        description="Drive load at a running stack (make stack) and ship four candidates in "
        "turn: the fastest non-stable registered version (the stack's v2; promoted), then, "
        "against that new baseline, a replica failing 5%% of batches (rolled back on "
        "error_rate), one 1.5x slower (rolled back on latency), and an A/A twin of the "
        "baseline with transient batch faults at the same rate on both arms (promoted). "
        "Starts and stops the extra workers itself, prints the decision trails, restores the "
        "original stable version, and exits 0 only if all four ended as expected (3 "
        "otherwise).",
    )
    rollout_verify.configure(verify)
    for p in (start, status, promote, abort, pause, resume, approve, history, watch, verify):
        add_controller_flags(p)


_COMMANDS: dict[str, Callable[[Console, argparse.Namespace], int]] = {
    "start": cmd_start,
    "status": cmd_status,
    "promote": cmd_promote,
    "abort": cmd_abort,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "approve": cmd_approve,
    "history": cmd_history,
    "watch": cmd_watch,
    "verify": cmd_verify,
}


def run(args: argparse.Namespace) -> int:
    return run_command(f"halcyon rollout {args.action}", args, _COMMANDS)
