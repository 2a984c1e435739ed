"""The judge's policy as the API, the store and an operator see it.

What it decides: how a ``RolloutPolicy`` message becomes a :class:`controller.canary.JudgePolicy`
(an unset or zero field takes the judge's default; the judge validates the result and a bad
value is ``INVALID_ARGUMENT`` naming ``policy.<field>``), and how the *effective* policy is
stored with the rollout — every field, defaults included, so a rollout resumed after an upgrade
that changed a default is still judged by the guards it started with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from common.durations import to_duration, to_seconds
from common.errors import RichError, invalid_argument
from controller.canary import JudgePolicy
from halcyon.v1 import control_pb2

__all__ = ["policy_from_dict", "policy_from_pb", "policy_to_dict", "policy_to_pb"]

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
        if value:
            values[judge_field] = value
    for message_field, judge_field in _DURATIONS.items():
        if policy.HasField(message_field):
            seconds = to_seconds(getattr(policy, message_field))
            if seconds <= 0.0:
                raise invalid_argument(
                    f"policy.{message_field}", f"must be positive when set, got {seconds:g}s"
                )
            values[judge_field] = seconds
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
