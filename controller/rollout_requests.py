"""Validation of operator rollout requests, before any rollout logic runs.

What it decides: which rollout requests are malformed — INVALID_ARGUMENT naming the offending
field, never an internal error (defect 13 of the original) — and what a well-formed
``StartRollout`` means: the steps as the judge will run them and the effective policy.

Steps are canary traffic percentages (:func:`controller.canary.normalize_steps`): each strictly
between 0 and 100 and strictly increasing, empty for the default 1, 5, 25, 50; a final 100 is
accepted and means "then promote" (what users type first), because promotion always follows
the last step — a baseline always exists to compare against (defect 2 of the original).
Whether the model and its canary replicas exist is the rollout manager's question, not this
module's: that depends on the fleet, this only on the request.
"""

from __future__ import annotations

import math

from common.errors import invalid_argument
from controller.canary import InvalidSteps, JudgePolicy, normalize_steps
from controller.rollout_policy import policy_from_pb
from controller.rollouts import StartRequest
from halcyon.v1 import control_pb2

__all__ = ["parse_start", "validate_model", "validate_policy", "validate_steps"]


def validate_model(model: str) -> None:
    if not model.strip():
        raise invalid_argument("model", "is required")


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
    _finite_non_negative(policy.max_error_rate_ratio, "policy.max_error_rate_ratio")
    _finite_non_negative(policy.max_p95_ratio, "policy.max_p95_ratio")
    _finite_non_negative(policy.false_alarm_rate, "policy.false_alarm_rate")
    return policy_from_pb(policy)


def parse_start(
    request: control_pb2.StartRolloutRequest, stable_version: str | None
) -> StartRequest:
    """The StartRequest a StartRollout asks for; INVALID_ARGUMENT naming the field otherwise.

    ``stable_version`` is the model's current stable version, if it has one.
    """
    validate_model(request.model)
    if not request.canary_version.strip():
        raise invalid_argument("canary_version", "is required")
    if stable_version is not None and request.canary_version == stable_version:
        raise invalid_argument(
            "canary_version",
            f"{request.canary_version!r} is already the stable version of {request.model!r}",
        )
    steps = validate_steps(list(request.step_percents))
    policy = validate_policy(request.policy)
    return StartRequest(
        model=request.model,
        canary_version=request.canary_version,
        step_percents=steps,
        policy=policy,
    )
