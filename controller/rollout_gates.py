"""A stored rollout's gates: read back from its record, and said in its decisions' words.

What it decides: the :class:`~controller.canary.Gates` a stored rollout runs under (so a
restarted controller re-arms it as it was), and the notes its start and resume decisions carry
about them.
"""

from __future__ import annotations

from controller.canary import ApprovalMode, Gates
from controller.store import RolloutRecord

__all__ = ["gate_note", "gates_of", "start_note"]


def gates_of(record: RolloutRecord) -> Gates:
    """The gates a stored rollout runs under."""
    return Gates(
        paused=record.paused,
        auto_rollback=record.auto_rollback,
        approval=ApprovalMode(record.approval),
        analysis_only=record.analysis_only,
    )


def start_note(gates: Gates) -> str:
    """What a start decision says about the gates it was started with."""
    notes = []
    if gates.analysis_only:
        notes.append(
            "analysis only: every decision is recorded, traffic stays at the first step and "
            "the canary is never made stable"
        )
    if gates.approval is ApprovalMode.PROMOTION:
        notes.append("promotion waits for `halcyon rollout approve`")
    elif gates.approval is ApprovalMode.EVERY_STEP:
        notes.append("every advance and the promotion wait for `halcyon rollout approve`")
    return "".join(f"; {n}" for n in notes)


def gate_note(record: RolloutRecord) -> str:
    """What a restart's resume decision says about the gates still in force."""
    notes = []
    if record.paused:
        notes.append("still paused" + ("" if record.auto_rollback else " (auto-rollback off)"))
    if record.awaiting_approval:
        notes.append("still awaiting approval")
    if record.analysis_only:
        notes.append("analysis only")
    return "".join(f"; {n}" for n in notes)
