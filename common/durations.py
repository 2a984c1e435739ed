"""Seconds on the inside, ``google.protobuf.Duration`` on the wire — and which received
Durations are accepted.

Policy code measures time in float seconds; every proto carries durations as ``Duration``
(ADR 0004). This is the one conversion, exact to the nanosecond both ways (a negative value
stays negative, so a receiver can still refuse it as malformed).

What it also decides: the one check every Duration a peer sends must pass before it is used
(:func:`checked_seconds`). A Duration off the wire can be anything two varints can say —
seconds up to int64-max, nanos of the other sign or beyond a second — and a value no policy
could mean (a 292-billion-year analysis window) used to be stored, and then broke whatever
showed it. So each receiver names its field and its documented maximum, and gets either the
seconds or :class:`DurationOutOfRange` naming that field; the servicer turns that into
``INVALID_ARGUMENT`` (a request) or drops the one item (a report stream). The comparison is in
integer nanoseconds, so the maximum itself is accepted and one nanosecond more is not.
"""

from __future__ import annotations

from google.protobuf import duration_pb2

__all__ = [
    "PROTO_MAX_SECONDS",
    "DurationOutOfRange",
    "checked_seconds",
    "set_duration",
    "to_duration",
    "to_seconds",
]

# google.protobuf.Duration's own range: +/- 10,000 years (duration.proto).
PROTO_MAX_SECONDS = 315_576_000_000
_NANOS = 1_000_000_000


class DurationOutOfRange(ValueError):
    """A received Duration that is malformed, negative, zero where it must be positive, or
    beyond its field's maximum. ``field`` is the request's field path (``policy.window``)."""

    def __init__(self, field: str, description: str) -> None:
        super().__init__(f"{field}: {description}")
        self.field = field
        self.description = description


def set_duration(d: duration_pb2.Duration, seconds: float) -> None:
    """Fill ``d`` (e.g. a sub-message of a response being built) with ``seconds``.

    Field by field rather than through ``FromNanoseconds``: this runs several times per
    request on the gateway, and the protobuf helper costs about three times as much.
    """
    nanos = round(seconds * 1e9)
    whole, frac = divmod(abs(nanos), 1_000_000_000)
    if nanos < 0:  # Duration wants seconds and nanos with the same sign
        whole, frac = -whole, -frac
    d.seconds = whole
    d.nanos = frac


def to_duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    set_duration(d, seconds)
    return d


def to_seconds(d: duration_pb2.Duration) -> float:
    return d.ToNanoseconds() / 1e9


def _shown(seconds: float) -> str:
    return f"{seconds:g} s"


def checked_seconds(
    d: duration_pb2.Duration, field: str, *, maximum_s: float, positive: bool = False
) -> float:
    """The seconds of a received Duration, or :class:`DurationOutOfRange` naming ``field``.

    Accepted: a well-formed Duration (nanos within one second, with the sign of seconds)
    between 0 (exclusive when ``positive``) and ``maximum_s`` inclusive.
    """
    seconds, nanos = d.seconds, d.nanos
    if abs(nanos) >= _NANOS or (seconds > 0 and nanos < 0) or (seconds < 0 and nanos > 0):
        raise DurationOutOfRange(
            field,
            f"is not a valid Duration (seconds {seconds}, nanos {nanos}): nanos must be within "
            "one second and have the sign of seconds",
        )
    total = seconds * _NANOS + nanos  # exact: Python integers
    if total < 0:
        raise DurationOutOfRange(field, f"must not be negative, got {total / _NANOS:g} s")
    if positive and total == 0:
        raise DurationOutOfRange(field, "must be positive when set, got 0 s")
    if total > round(min(maximum_s, PROTO_MAX_SECONDS) * _NANOS):
        raise DurationOutOfRange(
            field, f"at most {_shown(maximum_s)}, got {_shown(total / _NANOS)}"
        )
    return total / _NANOS
