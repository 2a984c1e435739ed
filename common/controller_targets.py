"""Which controller a client talks to when it knows several: the next one, or the named leader.

What it decides: how workers, gateways and the operator CLI follow a controller failover
(issue #22). They take ``--controller a,b`` (one address behaves as it always did) and keep one
current address; a call refused ``UNAVAILABLE`` — a standby's ``NOT_LEADER``, a connection
refused, a controller that died — moves them on: to the leader a ``NOT_LEADER`` refusal names
(ErrorInfo metadata ``leader``; added to the list when it is not in it, e.g. behind one Service
address), else to the next address in turn. The caller keeps its own backoff.
"""

from __future__ import annotations

import argparse

import grpc

from common.argtypes import hostport
from common.errors import Reason, RichError
from common.leader_gate import LEADER_KEY

__all__ = ["ControllerTargets", "controller_addresses", "parse_controller_targets"]


def parse_controller_targets(text: str) -> list[str]:
    """``a,b`` -> ``["a", "b"]`` (blanks dropped); raises ValueError for an empty list."""
    targets = [part.strip() for part in text.split(",") if part.strip()]
    if not targets:
        raise ValueError(f"no controller address in {text!r}")
    return targets


def controller_addresses(text: str) -> str:
    """argparse type of ``--controller HOST:PORT[,HOST:PORT…]``: checked, kept as given."""
    try:
        for target in parse_controller_targets(text):
            hostport(target)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


class ControllerTargets:
    """The known controller addresses and the one in use."""

    def __init__(self, text: str) -> None:
        self.addresses = parse_controller_targets(text)
        self._index = 0

    @property
    def current(self) -> str:
        return self.addresses[self._index]

    @property
    def several(self) -> bool:
        return len(self.addresses) > 1

    def move_on(self, err: RichError) -> bool:
        """After a refusal ``err``: switch to the leader it names or the next address; True
        when the current address changed."""
        if err.code is not grpc.StatusCode.UNAVAILABLE:
            return False
        leader = err.metadata.get(LEADER_KEY) if err.reason == Reason.NOT_LEADER else None
        before = self._index
        if leader:
            if leader not in self.addresses:
                self.addresses.append(leader)
            self._index = self.addresses.index(leader)
        else:
            self._index = (self._index + 1) % len(self.addresses)
        return self._index != before
