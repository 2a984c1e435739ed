"""Operator gates on a rollout: pause, approval before a move, analysis only.

What it decides: which of the judge's moves an operator has reserved for themselves. The judge
keeps judging whatever the gates say — evidence is gathered and every verdict is recorded — and
the gates only decide whether a verdict moves traffic:

* ``paused`` holds the weight: a step proven healthy is not advanced (HOLD ``paused``) until the
  operator resumes; a proven regression still rolls back unless ``auto_rollback`` is off, in
  which case it is held once (HOLD ``rollback_held``) for the operator to abort or resume.
* ``approval`` stops before promotion (``PROMOTION``) or before every move (``EVERY_STEP``):
  the judge announces it once (HOLD ``awaiting_approval``) and waits, still watching for a
  regression, until :meth:`~controller.canary.run.RolloutRun.approve`.
* ``analysis_only`` is a dry run: the canary keeps the first step's share, the judge walks its
  steps in shadow and records what it *would* do, and its final decision ends the rollout with
  traffic back at zero and the canary never made stable (``Decision.applied`` is False).

Pure values; the controller stores them with the rollout so they survive a restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "APPROVED",
    "AWAITING_APPROVAL",
    "PAUSED",
    "ROLLBACK_HELD",
    "ApprovalMode",
    "Gates",
    "NotAwaitingApproval",
]

PAUSED = "paused"
AWAITING_APPROVAL = "awaiting_approval"
ROLLBACK_HELD = "rollback_held"
APPROVED = "approved"


class ApprovalMode(StrEnum):
    """Which of the judge's moves wait for an operator's approval."""

    NONE = "none"
    PROMOTION = "promotion"  # stop before promoting
    EVERY_STEP = "every_step"  # stop before every advance and before promoting


@dataclass(frozen=True)
class Gates:
    """The gates in force on one rollout (see the module docstring)."""

    paused: bool = False
    auto_rollback: bool = True
    approval: ApprovalMode = ApprovalMode.NONE
    analysis_only: bool = False

    def needs_approval(self, promote: bool) -> bool:
        """Whether a move (an advance, or the promotion) waits for an operator."""
        if self.approval is ApprovalMode.EVERY_STEP:
            return True
        return promote and self.approval is ApprovalMode.PROMOTION


class NotAwaitingApproval(Exception):
    """``approve`` on a rollout that is not waiting for one; the message says where it is."""
