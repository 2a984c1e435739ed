"""The judge's policy as the API, the store and an operator see it.

What it decides: how a ``RolloutPolicy`` message becomes a :class:`controller.canary.JudgePolicy`
(an unset or zero field takes the judge's default; the judge validates the result and a bad
value is ``INVALID_ARGUMENT`` naming ``policy.<field>``), and how the *effective* policy is
stored with the rollout — every field, defaults included, so a rollout resumed after an upgrade
that changed a default is still judged by the guards it started with.

Every field is bounded, so a stored policy is always one the API can show again and a rollout
can actually finish: ``window`` is at most :data:`MAX_WINDOW_S` and ``max_duration`` at most
:data:`MAX_ROLLOUT_DURATION_S` (both checked by :func:`common.durations.checked_seconds`: a
malformed, negative or zero Duration is refused the same way), and the window may not be longer
than the rollout's maximum duration (no window could ever be judged); the counts are at most
:data:`MAX_MIN_REQUESTS` and :data:`MAX_WINDOWS`. The doubles are checked by
:mod:`controller.rollout_requests` (finite, in range).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common.durations import DurationOutOfRange, checked_seconds, to_duration
from common.errors import RichError, invalid_argument
from controller.canary import JudgePolicy
from halcyon.v1 import control_pb2

__all__ = [
    "MAX_MIN_REQUESTS",
    "MAX_ROLLOUT_DURATION_S",
    "MAX_WINDOWS",
    "MAX_WINDOW_S",
    "policy_from_dict",
    "policy_from_pb",
    "policy_to_dict",
    "policy_to_pb",
]

# The longest analysis window an operator may set.
MAX_WINDOW_S = 3600.0
# The longest a rollout may be allowed to run before it is rolled back (7 days).
MAX_ROLLOUT_DURATION_S = 7 * 24 * 3600.0
# min_requests per arm per window, at most.
MAX_MIN_REQUESTS = 1_000_000
# healthy_windows_to_advance and unhealthy_windows_to_rollback, at most.
MAX_WINDOWS = 1000
# Message integer field -> its maximum (0 still means "the default").
_COUNT_LIMITS = {
    "min_requests": MAX_MIN_REQUESTS,
    "healthy_windows_to_advance": MAX_WINDOWS,
    "unhealthy_windows_to_rollback": MAX_WINDOWS,
}

_FIELDS = frozenset(f.name for f in dataclasses.fields(JudgePolicy))
# Message field -> JudgePolicy field, for the plain numbers (0 means "the default").
_NUMBERS = {
    "min_requests": "min_requests",
    "max_error_rate_increase": "max_error_rate_increase",
    "max_error_rate_ratio": "max_error_rate_ratio",
    "max_p95_ratio": "max_p95_ratio",
    "healthy_windows_to_advance": "healthy_windows_to_advance",
    "unhealthy_windows_to_rollback": "unhealthy_windows_to_rollback",
    "false_alarm_rate": "false_alarm_rate",
}
# Message Duration field -> JudgePolicy seconds field (unset means "the default").
_DURATIONS = {"window": "window_s", "max_duration": "max_duration_s"}
_DURATION_LIMITS = {"window": MAX_WINDOW_S, "max_duration": MAX_ROLLOUT_DURATION_S}
_MESSAGE_FIELD = {v: k for k, v in {**_NUMBERS, **_DURATIONS}.items()}


def _judge_policy(values: Mapping[str, Any]) -> JudgePolicy:
    """A JudgePolicy, its ValueError turned into INVALID_ARGUMENT naming the message field."""
    try:
        return JudgePolicy(**values)
    except ValueError as exc:
        # The judge says "policy.<judge field> must be ..."; name the message's field.
        text = str(exc)
        name = text.split(" ", 1)[0].removeprefix("policy.")
        field = f"policy.{_MESSAGE_FIELD.get(name, name)}" if name in _FIELDS else "policy"
        raise invalid_argument(field, text) from None


def policy_from_pb(
    policy: control_pb2.RolloutPolicy, defaults: JudgePolicy | None = None
) -> JudgePolicy:
    """The effective policy of a request; raises INVALID_ARGUMENT (a RichError)."""
    values = dataclasses.asdict(defaults or JudgePolicy())
    for message_field, judge_field in _NUMBERS.items():
        value = getattr(policy, message_field)
        limit = _COUNT_LIMITS.get(message_field)
        if limit is not None and value > limit:
            raise invalid_argument(
                f"policy.{message_field}", f"at most {limit:,} (0 = default), got {value:,}"
            )
        if value:
            values[judge_field] = value
    for message_field, judge_field in _DURATIONS.items():
        if policy.HasField(message_field):
            try:
                values[judge_field] = checked_seconds(
                    getattr(policy, message_field),
                    f"policy.{message_field}",
                    maximum_s=_DURATION_LIMITS[message_field],
                    positive=True,
                )
            except DurationOutOfRange as exc:
                raise invalid_argument(exc.field, exc.description) from None
    if values["window_s"] > values["max_duration_s"]:
        field = "policy.window" if policy.HasField("window") else "policy.max_duration"
        raise invalid_argument(
            field,
            f"the window ({values['window_s']:g} s) is longer than the rollout's maximum "
            f"duration ({values['max_duration_s']:g} s): no window could ever be judged",
        )
    return _judge_policy(values)


def policy_to_pb(policy: JudgePolicy) -> control_pb2.RolloutPolicy:
    out = control_pb2.RolloutPolicy()
    for message_field, judge_field in _NUMBERS.items():
        setattr(out, message_field, getattr(policy, judge_field))
    for message_field, judge_field in _DURATIONS.items():
        getattr(out, message_field).CopyFrom(to_duration(getattr(policy, judge_field)))
    return out


def policy_to_dict(policy: JudgePolicy) -> dict[str, Any]:
    """Every field of the policy, for the store."""
    return dataclasses.asdict(policy)


def policy_from_dict(stored: Mapping[str, Any]) -> JudgePolicy:
    """A stored policy; fields this version does not know are ignored, missing ones default."""
    try:
        return _judge_policy({k: v for k, v in stored.items() if k in _FIELDS})
    except RichError as exc:
        raise ValueError(f"stored rollout policy is unusable: {exc.message}") from None
