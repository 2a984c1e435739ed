"""Validation of operator rollout requests, before any rollout logic runs.

What it decides: which rollout requests are malformed — INVALID_ARGUMENT naming the offending
field, never an internal error (defect 13 of the original) — and the honest answer for the
rollout RPCs until the rollout controller exists: UNIMPLEMENTED with ErrorInfo reason
NOT_IMPLEMENTED. Nothing here fakes success.

Steps are canary traffic percentages, each strictly between 0 and 100 and strictly increasing:
100 % is not a step (promotion follows the last step, so a baseline always exists to compare
against — defect 2 of the original).
"""

from __future__ import annotations

import math

import grpc

from common.errors import Reason, RichError, invalid_argument
from halcyon.v1 import control_pb2

__all__ = [
    "DEFAULT_STEPS",
    "not_implemented",
    "validate_model",
    "validate_policy",
    "validate_start",
    "validate_steps",
]

DEFAULT_STEPS: tuple[float, ...] = (1.0, 5.0, 25.0, 50.0)
_ROLLOUTS_LATER = "rollouts arrive with the rollout controller"


def not_implemented(method: str) -> RichError:
    """UNIMPLEMENTED / NOT_IMPLEMENTED for a rollout RPC the controller cannot serve yet."""
    return RichError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{method} is not implemented yet: {_ROLLOUTS_LATER}",
        reason=Reason.NOT_IMPLEMENTED,
        metadata={"method": method},
    )


def validate_model(model: str) -> None:
    if not model.strip():
        raise invalid_argument("model", "is required")


def validate_steps(steps: list[float] | tuple[float, ...]) -> None:
    """Each step in (0, 100), strictly increasing. Empty means the defaults."""
    previous: float | None = None
    for i, p in enumerate(steps):
        if not (math.isfinite(p) and 0.0 < p < 100.0):
            raise invalid_argument(
                "step_percents",
                f"step {i} is {p}: every step must be strictly between 0 and 100 percent "
                "(promotion follows the last step)",
            )
        if previous is not None and p <= previous:
            raise invalid_argument(
                "step_percents",
                f"step {i} ({p}) does not exceed step {i - 1} ({previous}): "
                "steps must be strictly increasing",
            )
        previous = p


def _finite_non_negative(value: float, field: str) -> None:
    if not (math.isfinite(value) and value >= 0.0):
        raise invalid_argument(field, f"must be a finite number >= 0 (0 = default), got {value}")


def validate_policy(policy: control_pb2.RolloutPolicy) -> None:
    """Guards that cannot mean anything: negative or non-finite values, a window <= 0."""
    if policy.HasField("window"):
        seconds = policy.window.seconds + policy.window.nanos / 1e9
        if seconds <= 0.0:
            raise invalid_argument("policy.window", f"must be positive when set, got {seconds}s")
    _finite_non_negative(policy.max_error_rate_increase, "policy.max_error_rate_increase")
    if policy.max_error_rate_increase > 1.0:
        raise invalid_argument(
            "policy.max_error_rate_increase",
            f"is an absolute error-rate difference in [0, 1], got {policy.max_error_rate_increase}",
        )
    _finite_non_negative(policy.max_error_rate_ratio, "policy.max_error_rate_ratio")
    _finite_non_negative(policy.max_p95_ratio, "policy.max_p95_ratio")


def validate_start(request: control_pb2.StartRolloutRequest, stable_version: str | None) -> None:
    """Raise INVALID_ARGUMENT for a StartRollout request that no controller could accept.

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
    validate_steps(list(request.step_percents))
    if request.HasField("policy"):
        validate_policy(request.policy)
