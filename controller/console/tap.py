"""How the console sees every outcome report without a hook of its own in the aggregator.

What it decides: the order in which the taps of :class:`controller.outcomes.OutcomeAggregator`
see an outcome. The aggregator has one public ``tap`` (the rollouts' evidence); the console
chains itself behind it — the tap that was there first sees each outcome first and exactly as
before, then the console's history. The console only reads: a failure in it is logged once
and never reaches the report stream (a broken chart must not cost the rollouts their evidence).
"""

from __future__ import annotations

import logging

from controller.outcomes import OutcomeAggregator, OutcomeTap

__all__ = ["ChainedTap", "chain_tap"]

_log = logging.getLogger("halcyon.controller.console")


class ChainedTap:
    """``first`` (may be None), then ``then``; exceptions from ``then`` are logged, not raised."""

    def __init__(self, first: OutcomeTap | None, then: OutcomeTap) -> None:
        self.first = first
        self.then = then
        self._warned = False

    def _failed(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            _log.exception("console traffic history failed; charts may be incomplete", exc_info=exc)

    def record(self, model: str, version: str, kind: int, latency_s: float) -> None:
        if self.first is not None:
            self.first.record(model, version, kind, latency_s)
        try:
            self.then.record(model, version, kind, latency_s)
        except Exception as exc:
            self._failed(exc)

    def record_batch(self, model: str, version: str, size: int, ok: bool) -> None:
        if self.first is not None:
            self.first.record_batch(model, version, size, ok)
        try:
            self.then.record_batch(model, version, size, ok)
        except Exception as exc:
            self._failed(exc)


def chain_tap(outcomes: OutcomeAggregator, then: OutcomeTap) -> ChainedTap:
    """Install ``then`` behind the aggregator's current tap; returns the chain installed."""
    chained = ChainedTap(outcomes.tap, then)
    outcomes.tap = chained
    return chained
