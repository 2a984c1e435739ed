"""Reconnect backoff: how long to wait before trying the controller again.

What it decides: the delay after the n-th consecutive failure — exponential from ``initial_s``
by ``multiplier``, capped at ``max_s``, with jitter that only shortens it (``* (1 - jitter * U)``)
so the cap is a real ceiling and a fleet restarted together does not reconnect in lockstep.
The caller resets the attempt count once a session is established.

The backoff is for *refusals* (a wrong credential, a controller shutting down). A controller
that is merely unreachable is waited for by the channel itself (``wait_for_ready`` calls on a
channel with :func:`controller_channel_options`), which retries the connection at most every
``CONTROLLER_RECONNECT_MAX_S``: a restarted controller is re-joined within about a second of
listening again, however long it was gone (ADR 0011).
"""

from __future__ import annotations

from dataclasses import dataclass

from common import keepalive

__all__ = ["CONTROLLER_RECONNECT_MAX_S", "Backoff", "controller_channel_options"]

# Longest wait between two connection attempts to an unreachable controller.
CONTROLLER_RECONNECT_MAX_S = 1.0


def controller_channel_options() -> list[tuple[str, int]]:
    """gRPC channel options for a channel to the controller: connection attempts start after
    100 ms and back off to at most ``CONTROLLER_RECONNECT_MAX_S`` (gRPC's default is 120 s).
    A refused TCP connection costs next to nothing, so trying every second is cheap. Plus the
    fleet's keepalive (:mod:`common.keepalive`): a controller that vanished without closing
    its connections is noticed within a ping interval, not when the stream is next used."""
    return [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", int(CONTROLLER_RECONNECT_MAX_S * 1000)),
        *keepalive.client_options(),
    ]


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with downward jitter."""

    initial_s: float = 0.2
    max_s: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError("need 0 < initial_s <= max_s")
        if self.multiplier < 1:
            raise ValueError("multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")

    def delay(self, attempt: int, u: float) -> float:
        """Delay before retry number ``attempt`` (0-based), given a uniform draw ``u``."""
        base = min(self.max_s, self.initial_s * self.multiplier ** min(attempt, 64))
        return base * (1.0 - self.jitter * u)
