"""Seconds on the inside, ``google.protobuf.Duration`` on the wire.

Policy code measures time in float seconds; every proto carries durations as ``Duration``
(ADR 0004). This is the one conversion, exact to the nanosecond both ways (a negative value
stays negative, so a receiver can still refuse it as malformed).
"""

from __future__ import annotations

from google.protobuf import duration_pb2

__all__ = ["to_duration", "to_seconds"]


def to_duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def to_seconds(d: duration_pb2.Duration) -> float:
    return d.ToNanoseconds() / 1e9
