"""How one Infer call ended, as one value: what :meth:`gateway.infer_path.InferPath` records.

What it decides: the shape of a request's end — which of four ways it ended (:class:`Ending`)
and the facts about it that anything downstream counts: its metrics series, the error it got,
its effective priority, its admission ticket, when it ended and how long it took. Every exit of
``admit`` and every end in ``settle`` / ``settle_cancelled`` builds exactly one
:class:`RequestEnd`, and one method (``InferPath._record_end``) turns it into the outcome
counters, the latency histogram and goodput, the shed counters, the admission feedback and the
controller's canary evidence. Why a value: the exits then only say what happened, and what is
counted for it is decided in one place, so no exit can count twice or forget a counter.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from common.errors import RichError
from gateway.admission import AdmissionTicket, Priority
from gateway.metrics import RequestSeries

__all__ = ["Ending", "RequestEnd"]


class Ending(Enum):
    """The four ways an Infer call ends."""

    REFUSED = "refused"  # an exit of admit before the request was admitted: no ticket
    ANSWERED = "answered"  # admitted and answered OK (on time or late)
    FAILED = "failed"  # admitted, then answered with an error
    CANCELLED = "cancelled"  # admitted; the client went away before the answer


@dataclass(slots=True)
class RequestEnd:
    """One Infer call's end. Treated as immutable (not frozen: a frozen dataclass costs about
    a microsecond more to build, and an answered request builds one).

    ``model`` and ``version`` are what the controller is told (``version`` is ``""`` before
    one was chosen); ``series`` carries the metric labels, which keep client input out.
    """

    ending: Ending
    series: RequestSeries
    model: str
    version: str = ""
    # The error it was answered with: set for REFUSED and FAILED, None otherwise.
    error: RichError | None = None
    # The priority admission applied (the request's, capped at its tenant's) once known:
    # sheds are counted by it. None before the request was authenticated and validated.
    priority: Priority | None = None
    # The admission ticket to finish: set for every end but REFUSED.
    ticket: AdmissionTicket | None = None
    at: float = 0.0  # when it ended, on the gateway's clock (admission feedback)
    latency_s: float = 0.0  # receipt to answer (0 for a refusal)
    on_time: bool = True  # ANSWERED within its deadline (goodput; LATE evidence otherwise)
    replica: str = ""  # the replica that answered (ANSWERED)
    budget_s: float = 0.0  # receipt to deadline (FAILED: evidence of the queue ahead)
