"""Seconds on the inside, ``google.protobuf.Duration`` on the wire.

Policy code measures time in float seconds; every proto carries durations as ``Duration``
(ADR 0004). This is the one conversion, exact to the nanosecond both ways (a negative value
stays negative, so a receiver can still refuse it as malformed).
"""

from __future__ import annotations

from google.protobuf import duration_pb2

__all__ = ["set_duration", "to_duration", "to_seconds"]


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
