"""What happened to one dispatch, as the router and its breakers must understand it.

What it decides: the four kinds of result a replica attempt can have, and which estimators
each one may touch. Keeping them distinct is the fix for defect 5 of the original, where busy
replies and cancelled hedges were recorded as fast successes (feeding the latency EWMA and the
hedge histogram, and closing half-open breakers).

==========  ===================  ================  ==============================
outcome     latency estimate     breaker           what the caller does next
==========  ===================  ================  ==============================
SUCCESS     fed (peak EWMA)      success           deliver the result
FAULT       untouched            failure           fail / let a hedge finish
TIMEOUT     fed (a lower bound)  timeout           retry elsewhere if time allows
BUSY        untouched            untouched         retry on another replica
CANCELLED   untouched            untouched         nothing (a hedge lost the race)
==========  ===================  ================  ==============================

TIMEOUT is the attempt that got no answer within its attempt timeout (ADR 0011). The time it
waited is a real observation — the replica takes at least that long now — so the peak EWMA
takes it at once and power-of-two-choices steers away from a frozen replica before its breaker
has opened; the breaker counts it as a failure and, in a row, as a reason to open at once.

BUSY and CANCELLED still release the inflight slot and any half-open probe slot the attempt
held: the probe never produced a verdict, so the next caller may probe instead.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Outcome"]


class Outcome(StrEnum):
    """How a dispatch to one replica ended."""

    SUCCESS = "success"
    """The replica executed the batch and answered; its latency is evidence of its speed."""
    FAULT = "fault"
    """The replica failed the batch (error, crash): evidence against its health."""
    TIMEOUT = "timeout"
    """The replica did not answer within the attempt timeout: evidence against its health and
    a lower bound on its latency."""
    BUSY = "busy"
    """The replica refused for lack of a free slot (backpressure): evidence of nothing."""
    CANCELLED = "cancelled"
    """We withdrew the attempt (hedge loser, client gone): evidence of nothing."""

    @property
    def feeds_latency(self) -> bool:
        return self in (Outcome.SUCCESS, Outcome.TIMEOUT)

    @property
    def judges_health(self) -> bool:
        return self in (Outcome.SUCCESS, Outcome.FAULT, Outcome.TIMEOUT)
