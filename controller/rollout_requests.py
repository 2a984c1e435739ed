"""Validation of operator rollout requests, before any rollout logic runs.

What it decides: which rollout requests are malformed — INVALID_ARGUMENT naming the offending
field, never an internal error (defect 13 of the original) — and what a well-formed
``StartRollout`` means: the steps as the judge will run them, the effective policy and the gates
(approval mode, analysis-only; an approval value this controller does not know is refused rather
than taken for "none", which would promote without the approval the caller asked for).

Steps are canary traffic percentages (:func:`controller.canary.normalize_steps`): each strictly
between 0 and 100 and strictly increasing, empty for the default 1, 5, 25, 50; a final 100 is
accepted and means "then promote" (what users type first), because promotion always follows
the last step — a baseline always exists to compare against (defect 2 of the original).
Whether the model and its canary replicas exist is the rollout manager's question, not this
module's: that depends on the fleet, this only on the request.

Names are bounded like a registration's (:func:`controller.registry.identifier_problem`:
model and canary version at most :data:`~controller.registry.MAX_NAME_CHARS` characters), an
abort, pause or resume reason at :data:`MAX_REASON_CHARS`, and the policy's ratios at
:data:`MAX_RATIO` (a larger one would switch the guard off; say so with the largest). A refusal
names the field and never repeats a long value.
"""

from __future__ import annotations

import math

from common.errors import echo, invalid_argument
from controller.canary import ApprovalMode, Gates, InvalidSteps, JudgePolicy, normalize_steps
from controller.convert import APPROVAL_FROM_PB
from controller.registry import MAX_NAME_CHARS, identifier_problem
from controller.rollout_policy import policy_from_pb
from controller.rollouts import StartRequest
from halcyon.v1 import control_pb2

__all__ = [
    "MAX_RATIO",
    "MAX_REASON_CHARS",
    "parse_approval",
    "parse_start",
    "validate_model",
    "validate_name",
    "validate_policy",
    "validate_reason",
    "validate_steps",
]

# The largest max_error_rate_ratio / max_p95_ratio: a canary 1,000 times worse is not one.
MAX_RATIO = 1000.0
# An operator's abort / pause / resume reason, stored with the decision.
MAX_REASON_CHARS = 1024


def validate_name(value: str, field: str) -> None:
    """INVALID_ARGUMENT naming ``field`` for an empty or too long name."""
    problem = identifier_problem(value, MAX_NAME_CHARS)
    if problem is not None:
        raise invalid_argument(field, "is required" if not value.strip() else problem)


def validate_model(model: str) -> None:
    validate_name(model, "model")


def validate_reason(reason: str) -> None:
    if len(reason) > MAX_REASON_CHARS:
        raise invalid_argument(
            "reason", f"at most {MAX_REASON_CHARS} characters, got {len(reason):,}"
        )


def validate_steps(steps: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """The steps the rollout runs; INVALID_ARGUMENT naming ``step_percents`` otherwise."""
    try:
        return normalize_steps(steps)
    except InvalidSteps as exc:
        raise invalid_argument(exc.field, exc.description) from None


def _finite_non_negative(value: float, field: str) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise invalid_argument(field, f"must be a finite number >= 0 (0 = default), got {value}")


def validate_policy(policy: control_pb2.RolloutPolicy) -> JudgePolicy:
    """The effective policy (unset fields take the judge's defaults), or INVALID_ARGUMENT."""
    _finite_non_negative(policy.max_error_rate_increase, "policy.max_error_rate_increase")
    if policy.max_error_rate_increase > 1.0:
        raise invalid_argument(
            "policy.max_error_rate_increase",
            f"is an absolute error-rate difference in [0, 1], got {policy.max_error_rate_increase}",
        )
    for field in ("max_error_rate_ratio", "max_p95_ratio"):
        value = getattr(policy, field)
        _finite_non_negative(value, f"policy.{field}")
        if value > MAX_RATIO:
            raise invalid_argument(
                f"policy.{field}", f"at most {MAX_RATIO:g} (0 = default), got {value:g}"
            )
    _finite_non_negative(policy.false_alarm_rate, "policy.false_alarm_rate")
    return policy_from_pb(policy)


def parse_approval(value: int) -> ApprovalMode:
    """The approval mode a StartRollout asks for (unset: none), or INVALID_ARGUMENT."""
    stored = APPROVAL_FROM_PB.get(value)
    if stored is None:
        raise invalid_argument(
            "approval",
            f"unknown approval mode {value}: use APPROVAL_MODE_NONE, APPROVAL_MODE_PROMOTION or "
            "APPROVAL_MODE_EVERY_STEP",
        )
    return ApprovalMode(stored)


def parse_start(
    request: control_pb2.StartRolloutRequest, stable_version: str | None
) -> StartRequest:
    """The StartRequest a StartRollout asks for; INVALID_ARGUMENT naming the field otherwise.

    ``stable_version`` is the model's current stable version, if it has one.
    """
    validate_model(request.model)
    validate_name(request.canary_version, "canary_version")
    if stable_version is not None and request.canary_version == stable_version:
        raise invalid_argument(
            "canary_version",
            f"{echo(request.canary_version)!r} is already the stable version of "
            f"{echo(request.model)!r}",
        )
    steps = validate_steps(list(request.step_percents))
    policy = validate_policy(request.policy)
    gates = Gates(approval=parse_approval(request.approval), analysis_only=request.analysis_only)
    return StartRequest(
        model=request.model,
        canary_version=request.canary_version,
        step_percents=steps,
        policy=policy,
        gates=gates,
    )
