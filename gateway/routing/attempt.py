"""How long one attempt on a replica may take, and when a waiting request is answered anyway.

What it decides, for every batch the gateway sends:

* **The attempt timeout** — the ``ExecuteBatch`` call's own deadline — from the conservative
  prediction for *this* batch on *this* replica, never from the requests' deadlines alone:
  ``max(min_timeout_s, timeout_multiplier x predicted)``, and never past the moment the last
  request in the batch must be answered. A replica with no prediction at all — one that has
  neither reported a warm-up nor answered yet — is *not* timed out by a constant: its
  attempt may run until the batch's requests must be answered (a prior is a guess, and a
  device whose batches really take 30 s must be able to answer once). Workers measure
  warm-up batches before they register (ADR 0011), so a replica normally has a prediction of
  its real cost before its first request.
  The timeout is *not* raised by the plain count of timeouts a replica had: what raises it
  is what they proved. A call that ran ``elapsed`` seconds without an answer shows that
  batch costs more than ``elapsed`` there; the prediction is never less than that proven
  lower bound (:class:`CostFloor`) until a faster answer refutes it, so a replica that is
  really slower than its model gets a longer timeout and answers, instead of being timed out
  forever by a model that a cancelled attempt teaches nothing. The next attempt may take
  ``proven_multiplier`` (2) times the proven bound. A frozen replica still costs a batch at
  most one attempt timeout; its second timeout is twice its first, and two in a row open its
  breaker. A half-open probe is timed like any attempt — it was ``cold_timeout_s`` (1 s)
  before: what the timeouts that opened the breaker proved already gives it twice as long,
  and each probe that times out doubles the next one's, so a replica that became slower than
  its model answers a probe after a few, while a frozen one costs each probe batch one
  bounded wait, not its requests' whole deadline.
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
  call was cut short by the requests' deadlines before the replica was late. Either way the
  batch's cost there is more than the call's ``elapsed`` (:class:`CostFloor`).

Pure policy: numbers in, numbers out; no clock, no I/O. The costs are in ADR 0011.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from gateway.routing.outcome import Outcome

__all__ = ["AttemptConfig", "AttemptPolicy", "CostFloor"]

# No call gets a timeout shorter than this: below it the call's own machinery dominates.
_MIN_CALL_S = 0.001


@dataclass(frozen=True)
class AttemptConfig:
    timeout_multiplier: float = 4.0
    """An attempt may take this many times the conservative prediction for its batch..."""
    min_timeout_s: float = 0.25
    """...but never less than this (a prediction of ~0 for a near-free device must not turn a
    scheduling hiccup of a few milliseconds into a timeout, a retry and a breaker failure).
    With no prediction at all there is no attempt timeout: only the requests' answer-by."""
    tail_multiplier: float = 2.0
    """...and never less than this many times the fleet's recent p95 of successful calls."""
    proven_multiplier: float = 2.0
    """...nor than this many times what earlier calls out of time proved the batch costs
    there (:class:`CostFloor`): twice the last wait, so a replica slower than its model
    answers after a few timeouts while a frozen one's waits grow slowly."""
    answer_reserve_s: float = 0.01
    """Answer a request still waiting on a replica this long before its deadline..."""
    max_reserve_share: float = 0.1
    """...or this share of its whole timeout, whichever is less."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_multiplier) and self.timeout_multiplier >= 1.0):
            raise ValueError("timeout_multiplier must be at least 1")
        if not (math.isfinite(self.min_timeout_s) and self.min_timeout_s > 0.0):
            raise ValueError("min_timeout_s must be positive")
        if not (math.isfinite(self.tail_multiplier) and self.tail_multiplier >= 0.0):
            raise ValueError("tail_multiplier must be non-negative")
        if not (math.isfinite(self.proven_multiplier) and self.proven_multiplier > 1.0):
            raise ValueError("proven_multiplier must be more than 1")
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

    def attempt_timeout(
        self, predicted_s: float | None, tail_s: float | None = None, proven_s: float = 0.0
    ) -> float:
        """How long one attempt may run, given the batch's conservative predicted duration
        from the replica's cost model (None: it has none yet), the fleet's recent p95 of
        successful calls (None: not known yet) and what calls out of time proved the batch
        costs there (0: nothing).

        With no prediction and nothing proven: ``math.inf`` — no constant may time out a
        replica's first answer; :meth:`call_timeout` cuts it at the batch's last answer-by. A
        number that is not a non-negative duration (a cost model gone wrong) is ignored: the
        timeout is then finite and positive.
        """
        cfg = self._config
        floor = cfg.min_timeout_s
        if tail_s is not None and tail_s >= 0.0 and math.isfinite(tail_s):
            floor = max(floor, cfg.tail_multiplier * tail_s)
        if proven_s > 0.0 and math.isfinite(proven_s):
            floor = max(floor, cfg.proven_multiplier * proven_s)
        elif predicted_s is None:
            return math.inf
        if predicted_s is None or not (predicted_s >= 0.0 and math.isfinite(predicted_s)):
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
        proven_s: float = 0.0,
    ) -> float:
        """The ``ExecuteBatch`` deadline (seconds from ``now``): the attempt timeout, cut at
        the moment the batch's last request must be answered anyway (always finite when that
        moment is)."""
        timeout = min(self.attempt_timeout(predicted_s, tail_s, proven_s), last_answer_by - now)
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


class CostFloor:
    """Lower bounds on one replica's batch cost, proven by calls that ran out of time.

    A call for a batch of ``tokens`` work tokens that ended after ``elapsed`` seconds without
    an answer (its attempt timeout, or cut at its requests' answer-by) proves that such a
    batch costs more than ``elapsed`` on that replica — and so does every larger batch (cost
    does not fall as work grows). :meth:`at` is the largest bound proven for a batch of
    ``tokens``; the dispatcher never predicts less, so the next attempt's timeout is at least
    ``timeout_multiplier`` times what the last one waited, and a replica slower than its model
    answers after a timeout or two instead of never. The cost model itself is not fed these
    numbers (a censored time is not a batch time: a frozen replica's timeouts would teach the
    batcher it is slow for long after it thaws); it learns from the answers that follow.

    A call that answered faster than a bound, for a batch at least that bound's size, refutes
    it (the replica recovered, or the bound came from a stall), and the bound is dropped.
    At most ``max_bounds`` bounds are kept; the weakest goes first. Pure: numbers in, numbers
    out.
    """

    __slots__ = ("_max", "_seconds", "_tokens")

    def __init__(self, max_bounds: int = 16) -> None:
        if max_bounds < 1:
            raise ValueError("max_bounds must be at least 1")
        self._max = max_bounds
        # The Pareto frontier: tokens ascending, seconds strictly ascending.
        self._tokens: list[float] = []
        self._seconds: list[float] = []

    def at(self, tokens: float) -> float:
        """The proven lower bound on a batch of ``tokens`` (0.0 if none)."""
        i = bisect.bisect_right(self._tokens, tokens)
        return self._seconds[i - 1] if i else 0.0

    def ran_out(self, tokens: float, elapsed_s: float) -> None:
        """A call for ``tokens`` ended after ``elapsed_s`` seconds without an answer."""
        if not (math.isfinite(elapsed_s) and elapsed_s > 0.0) or elapsed_s <= self.at(tokens):
            return
        i = bisect.bisect_left(self._tokens, tokens)
        # Bounds at this size or above that this one exceeds say nothing more.
        j = i
        while j < len(self._tokens) and self._seconds[j] <= elapsed_s:
            j += 1
        self._tokens[i:j] = [tokens]
        self._seconds[i:j] = [elapsed_s]
        if len(self._tokens) > self._max:
            del self._tokens[0], self._seconds[0]

    def answered(self, tokens: float, seconds: float) -> None:
        """A call for ``tokens`` answered after ``seconds``: drop the bounds it refutes."""
        if not (math.isfinite(seconds) and seconds >= 0.0):
            return
        i = bisect.bisect_right(self._tokens, tokens)
        keep = [k for k in range(len(self._tokens)) if k >= i or self._seconds[k] <= seconds]
        if len(keep) != len(self._tokens):
            self._tokens = [self._tokens[k] for k in keep]
            self._seconds = [self._seconds[k] for k in keep]

    @property
    def bounds(self) -> list[tuple[float, float]]:
        """``(tokens, seconds)`` pairs, tokens ascending."""
        return list(zip(self._tokens, self._seconds, strict=True))
