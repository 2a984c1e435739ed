"""What every ``halcyon rollout`` subcommand shares: how a rollout and its decisions read.

The aligned rows of ``status``, ``history`` and ``watch`` (also ``halcyon fleet status``'s
rollout table and ``rollout verify``'s decision trails), the decisions that end a rollout and
the exit code for "not promoted", and the argument types the subcommands' flags use.

A module of its own so that :mod:`halcyon.tools.rollout` (the subcommands),
:mod:`halcyon.tools.rollout_verify` (the experiment) and :mod:`halcyon.tools.fleet_cmd` read
rollouts the same way without importing each other.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable
from typing import Any

from common.durations import to_seconds
from halcyon.tools.operator_cli import table
from halcyon.v1 import control_pb2

EXIT_NOT_PROMOTED = 3
TERMINAL_ACTIONS = {
    control_pb2.DECISION_ACTION_PROMOTE,
    control_pb2.DECISION_ACTION_ROLLBACK,
    control_pb2.DECISION_ACTION_ABORT,
}
ACTION_NAMES = {
    control_pb2.DECISION_ACTION_START: "start",
    control_pb2.DECISION_ACTION_ADVANCE: "advance",
    control_pb2.DECISION_ACTION_HOLD: "hold",
    control_pb2.DECISION_ACTION_ROLLBACK: "rollback",
    control_pb2.DECISION_ACTION_PROMOTE: "promote",
    control_pb2.DECISION_ACTION_ABORT: "abort",
}
_STATE = {
    control_pb2.ROLLOUT_STATE_PROGRESSING: "progressing",
    control_pb2.ROLLOUT_STATE_PROMOTED: "promoted",
    control_pb2.ROLLOUT_STATE_ROLLED_BACK: "rolled back",
    control_pb2.ROLLOUT_STATE_ABORTED: "aborted",
    control_pb2.ROLLOUT_STATE_ANALYZED: "analyzed",
}

_APPROVAL_NAMES = {
    control_pb2.APPROVAL_MODE_PROMOTION: "promotion",
    control_pb2.APPROVAL_MODE_EVERY_STEP: "every-step",
}


def _clock(ts: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts.seconds)) if ts.seconds else "-"


def _ms(d: Any) -> str:
    return f"{to_seconds(d) * 1000:.1f}"


def _arm(arm: control_pb2.ArmMetrics) -> str:
    if not arm.version:
        return "-"
    return (
        f"{arm.version}: {arm.requests} req {100 * arm.error_rate:.1f}% err p95 {_ms(arm.p95)} ms"
    )


def action_name(d: control_pb2.RolloutDecision) -> str:
    """The decision's action; in parentheses when it was recorded but not applied."""
    name = ACTION_NAMES.get(d.action, "?")
    return name if d.applied or d.action == control_pb2.DECISION_ACTION_HOLD else f"({name})"


def gate_text(r: control_pb2.Rollout) -> str:
    """The gates in force on a rollout, e.g. ``paused,no-auto-rollback``; ``-`` for none."""
    gates = []
    running = r.state == control_pb2.ROLLOUT_STATE_PROGRESSING
    if running and r.paused:
        gates.append("paused" if r.auto_rollback else "paused,no-auto-rollback")
    if running and r.awaiting_approval:
        gates.append("awaiting_approval")
    if r.approval in _APPROVAL_NAMES:
        gates.append(f"approval={_APPROVAL_NAMES[r.approval]}")
    if r.analysis_only:
        gates.append("analysis-only")
    return ",".join(gates) or "-"


def decision_row(d: control_pb2.RolloutDecision) -> list[str]:
    step = (
        f"{d.from_percent:g}→{d.to_percent:g}"
        if d.from_percent != d.to_percent
        else f"{d.to_percent:g}"
    )
    detail = d.detail
    if d.needed_requests:
        detail += f" (needs {d.needed_requests} more requests)"
    if not d.applied and d.action != control_pb2.DECISION_ACTION_HOLD:
        detail = f"analysis only, not applied: {detail}"
    return [
        _clock(d.decided_at),
        f"#{d.rollout_id}",
        action_name(d),
        d.reason,
        step,
        _arm(d.baseline),
        _arm(d.canary),
        detail,
    ]


DECISION_HEADERS = ("time", "rollout", "action", "reason", "canary %", "baseline", "canary", "")
# Streams print a row at a time, so their columns are fixed (wide enough for typical rows).
STREAM_WIDTHS = (8, 7, 9, 21, 8, 34, 40)


def stream_header() -> str:
    return table(DECISION_HEADERS, [], STREAM_WIDTHS)


def stream_row(d: control_pb2.RolloutDecision) -> str:
    return table(DECISION_HEADERS, [decision_row(d)], STREAM_WIDTHS).split("\n", 1)[1]


def rollout_rows(rollouts: Iterable[control_pb2.Rollout]) -> list[list[str]]:
    rows = []
    for r in rollouts:
        last = r.last_decision
        rows.append(
            [
                r.model,
                f"#{r.id}",
                f"{r.canary_version} vs {r.baseline_version}",
                _STATE.get(r.state, "?"),
                f"{r.step_index + 1}/{len(r.step_percents)}",
                f"{r.canary_weight_bp / 100:g}",
                gate_text(r),
                _clock(r.started_at),
                f"{action_name(last)} {last.reason}: {last.detail}" if last.reason else "-",
            ]
        )
    return rows


ROLLOUT_HEADERS = (
    "model", "rollout", "canary", "state", "step", "canary %", "gates", "started", "latest",
)  # fmt: skip


# -- argument types ---------------------------------------------------------------------------


def parse_steps(text: str) -> list[float]:
    try:
        return [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected percentages separated by commas, e.g. 5,25,50,100; got {text!r}"
        ) from None


def count_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} must be at least {minimum}")
        return value

    return parse
