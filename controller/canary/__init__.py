"""The canary judge: pure, clock-injected policy for progressive rollouts (ADR 0008).

What it decides: whether a canary version advances to the next traffic step, holds, is rolled
back, or is promoted — from per-arm evidence the controller feeds it, compared over the same
wall-clock windows, with window guards (minimum requests, error rate, p95, a rank test) and
sequential tests that roll a clearly bad canary back as soon as the evidence proves it, at a
stated false-alarm rate. No gRPC, no sockets, no wall clock: time is a float the caller passes.
"""

from controller.canary.gates import ApprovalMode, Gates, NotAwaitingApproval
from controller.canary.model import (
    ArmEvidence,
    ArmSummary,
    Decision,
    JudgePolicy,
    RolloutAction,
    RolloutPhase,
    error_limit,
)
from controller.canary.run import RolloutRun
from controller.canary.steps import DEFAULT_STEPS, InvalidSteps, normalize_steps

__all__ = [
    "DEFAULT_STEPS",
    "ApprovalMode",
    "ArmEvidence",
    "ArmSummary",
    "Decision",
    "Gates",
    "InvalidSteps",
    "JudgePolicy",
    "NotAwaitingApproval",
    "RolloutAction",
    "RolloutPhase",
    "RolloutRun",
    "error_limit",
    "normalize_steps",
]
