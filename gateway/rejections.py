"""What a ``DEADLINE_UNREACHABLE`` answer says: the deadline, the prediction and its parts.

What it decides: the wording of the refusal a caller gets when the batcher proves at
admission that a request cannot finish in time. The caller must be able to act on it, so the
message says how much time was left, what the prediction was and what it was made of — the
batch already on the device, the batches queued ahead, the requests sharing its batch, its own
work and the safety margin — and, when nothing was queued, says so: then the request is too
large for its deadline on its own and retrying unchanged cannot help. The same figures travel
as ``ErrorInfo`` metadata (``deadline_ms``, ``predicted_completion_ms``, ``<part>_ms``).
"""

from __future__ import annotations

from common.errors import RichError, deadline_unreachable
from gateway.batching import PredictionParts

__all__ = ["unreachable_error"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000.0:.1f} ms"


def _requests(n: int) -> str:
    return f"{n} request{'' if n == 1 else 's'}"


def unreachable_error(parts: PredictionParts | None, predicted_in_s: float | None) -> RichError:
    """The DEADLINE_EXCEEDED / DEADLINE_UNREACHABLE error for a refused request.

    ``parts`` is the batcher's breakdown (None from a path that has none: the message then
    gives what is known); ``predicted_in_s`` the predicted time to completion from now.
    """
    if parts is None:
        return deadline_unreachable(
            "the deadline cannot be met: the work queued ahead, the work sharing its batch and "
            "the work on the device finish too late"
            + ("" if predicted_in_s is None else f" (predicted in {_ms(predicted_in_s)})")
            + "; allow more time or retry when the gateway is less busy",
            predicted_in_s,
        )
    left = parts.deadline_in
    if left <= 0.0:
        return deadline_unreachable(
            f"the deadline had already passed when the request arrived ({_ms(-left)} ago); "
            "send it with a later deadline or a longer timeout",
            0.0,
            deadline_s=left,
        )
    total = parts.total
    figures = {
        "on_device": parts.on_device,
        "queued_ahead": parts.queued_ahead,
        "sharing_batch": parts.sharing_batch,
        "own": parts.own,
        "margin": parts.margin,
    }
    idle = parts.queued_requests == 0 and parts.on_device == 0.0 and parts.batch_mates == 0
    if idle:
        margin = f" + {_ms(parts.margin)} safety margin" if parts.margin >= 0.00005 else ""
        return deadline_unreachable(
            f"the deadline cannot be met: {_ms(left)} were left, and with nothing queued and "
            f"no replica busy the request alone is predicted to take {_ms(total)} "
            f"({_ms(parts.own)} of its own work{margin}); allow more time or ask for fewer "
            "max_output_tokens (retrying unchanged cannot help)",
            total,
            deadline_s=left,
            parts_s=figures,
        )
    if not parts.queued_requests:
        queued = "nothing queued"
    elif parts.queued_ahead < 0.00005:
        queued = (
            "nothing queued ahead of it on that replica "
            f"({_requests(parts.queued_requests)} waiting in all)"
        )
    else:
        queued = (
            f"{_ms(parts.queued_ahead)} for the batches queued ahead of it "
            f"({_requests(parts.queued_requests)} waiting in all)"
        )
    sharing = (
        f"{_ms(parts.sharing_batch)} for the {_requests(parts.batch_mates)} ahead of it in "
        "its batch"
        if parts.batch_mates
        else "no one ahead of it in its batch"
    )
    return deadline_unreachable(
        f"the deadline cannot be met: {_ms(left)} were left and the request is predicted to "
        f"finish in {_ms(total)}: {_ms(parts.on_device)} until the replica finishes the batch "
        f"on its device, {queued}, {sharing}, {_ms(parts.own)} of its own work and "
        f"{_ms(parts.margin)} safety margin (cost uncertainty, more urgent arrivals); allow "
        "more time or retry when the queue is shorter",
        total,
        deadline_s=left,
        parts_s=figures,
    )
