"""How long one attempt on a replica may take, and when a waiting request is answered anyway.

What it decides, for every batch the gateway sends:

* **The attempt timeout** — the ``ExecuteBatch`` call's own deadline — from the conservative
  prediction for *this* batch on *this* replica, never from the requests' deadlines alone:
  ``max(min_timeout_s, timeout_multiplier x predicted)``, and never past the moment the last
  request in the batch must be answered. A replica whose cost model has not learned anything
  yet gets ``cold_timeout_s`` (a prior is a guess, and a slow device must not be timed out
  before it has answered once), and so does a half-open probe (a replica that became slower
  than its model must be able to answer once, and re-teach the model, to come back at all).
  The timeout is deliberately *not* raised by the timeouts a replica already had: a frozen
  replica must cost every batch sent to it the same short wait, not a longer one each time.
  It is raised by the fleet's *successful* tail: never less than ``tail_multiplier`` x the
  recent p95 of successful batch latencies (the hedge policy's window). On a starved host
  every call is slow, and timing attempts out against a device-time prediction there turned
  slowness into "errors", retries and more load (measured: half of a healthy baseline's
  attempts counted as failures while a faulty canary was promoted). A frozen replica never
  succeeds, so it cannot raise that tail.

  A replica that freezes (SIGSTOP, a wedged driver, a partition that keeps the TCP connection
  up) then costs a request one attempt timeout, after which it is retried elsewhere while its
  deadline still allows. Before, a batch waited on the frozen replica until its latest
  deadline, and every request in it ended in the client's own DEADLINE_EXCEEDED with no
  reason and no second chance.
* **The answer-by time** of each request: ``answer_reserve_s`` before its deadline (at most
  ``max_reserve_share`` of its whole timeout). A request still waiting on a replica then gets
  a typed ``DEADLINE_EXCEEDED / DEADLINE_MISSED`` from the gateway, which reaches the client
  before the client's own deadline fires — otherwise the client sees a bare
  DEADLINE_EXCEEDED and cannot tell a slow fleet from a broken one.
* **What a call that ran out of time says about the replica**: a TIMEOUT (breaker failure,
  latency lower bound) when it was overdue by the replica's own prediction, nothing when the
  call was cut short by the requests' deadlines before the replica was late.

Pure policy: numbers in, numbers out; no clock, no I/O. The costs are in ADR 0011.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.routing.outcome import Outcome

__all__ = ["AttemptConfig", "AttemptPolicy"]

# No call gets a timeout shorter than this: below it the call's own machinery dominates.
_MIN_CALL_S = 0.001


@dataclass(frozen=True)
class AttemptConfig:
    timeout_multiplier: float = 4.0
    """An attempt may take this many times the conservative prediction for its batch..."""
    min_timeout_s: float = 0.25
    """...but never less than this (a prediction of ~0 for a near-free device must not turn a
    scheduling hiccup of a few milliseconds into a timeout, a retry and a breaker failure)."""
    cold_timeout_s: float = 1.0
    """The attempt timeout on a replica that has not completed a batch yet (no prediction)."""
    tail_multiplier: float = 2.0
    """...and never less than this many times the fleet's recent p95 of successful calls."""
    answer_reserve_s: float = 0.01
    """Answer a request still waiting on a replica this long before its deadline..."""
    max_reserve_share: float = 0.1
    """...or this share of its whole timeout, whichever is less."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_multiplier) and self.timeout_multiplier >= 1.0):
            raise ValueError("timeout_multiplier must be at least 1")
        if not (math.isfinite(self.min_timeout_s) and self.min_timeout_s > 0.0):
            raise ValueError("min_timeout_s must be positive")
        if not (math.isfinite(self.cold_timeout_s) and self.cold_timeout_s > 0.0):
            raise ValueError("cold_timeout_s must be positive")
        if not (math.isfinite(self.tail_multiplier) and self.tail_multiplier >= 0.0):
            raise ValueError("tail_multiplier must be non-negative")
        if not (math.isfinite(self.answer_reserve_s) and self.answer_reserve_s >= 0.0):
            raise ValueError("answer_reserve_s must be non-negative")
        if not 0.0 <= self.max_reserve_share < 1.0:
            raise ValueError("max_reserve_share must be in [0, 1)")


class AttemptPolicy:
    """Attempt timeouts and answer-by times. See the module docstring."""

    def __init__(self, config: AttemptConfig | None = None) -> None:
        self._config = config or AttemptConfig()

    @property
    def config(self) -> AttemptConfig:
        return self._config

    def attempt_timeout(self, predicted_s: float | None, tail_s: float | None = None) -> float:
        """How long one attempt may run, given the batch's conservative predicted duration
        (None: the replica has no prediction yet) and the fleet's recent p95 of successful
        calls (None: not known yet).

        A prediction or tail that is not a non-negative number (a cost model gone wrong) is
        ignored: the timeout is always finite and positive.
        """
        cfg = self._config
        floor = cfg.min_timeout_s
        if tail_s is not None and tail_s >= 0.0 and math.isfinite(tail_s):
            floor = max(floor, cfg.tail_multiplier * tail_s)
        if predicted_s is None:
            return max(floor, cfg.cold_timeout_s)
        if not (predicted_s >= 0.0 and math.isfinite(predicted_s)):
            return floor
        return max(floor, cfg.timeout_multiplier * predicted_s)

    def answer_by(self, received_at: float, deadline: float) -> float:
        """When a request still waiting on a replica is answered by the gateway itself."""
        cfg = self._config
        reserve = min(cfg.answer_reserve_s, cfg.max_reserve_share * (deadline - received_at))
        return deadline - max(0.0, reserve)

    def call_timeout(
        self,
        now: float,
        predicted_s: float | None,
        last_answer_by: float,
        tail_s: float | None = None,
    ) -> float:
        """The ``ExecuteBatch`` deadline (seconds from ``now``): the attempt timeout, cut at
        the moment the batch's last request must be answered anyway."""
        timeout = min(self.attempt_timeout(predicted_s, tail_s), last_answer_by - now)
        return timeout if timeout > _MIN_CALL_S else _MIN_CALL_S

    def judge_expiry(self, elapsed_s: float, predicted_s: float | None) -> Outcome:
        """What a call that ran out of time says about its replica.

        TIMEOUT when the replica was overdue by its own conservative prediction (with none
        yet: by the floor); CANCELLED (no verdict) when the call ended first because the
        requests' deadlines came — the replica was not late yet, the batch was merely tight.
        """
        if predicted_s is None:
            predicted_s = self._config.min_timeout_s
        if not (predicted_s >= 0.0 and math.isfinite(predicted_s)) or elapsed_s >= predicted_s:
            return Outcome.TIMEOUT
        return Outcome.CANCELLED
