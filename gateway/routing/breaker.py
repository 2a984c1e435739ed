"""Per-replica circuit breaker: whether a replica may be sent work, judged on outcomes.

What it decides: CLOSED (send normally), OPEN (send nothing until a computed re-open time),
HALF_OPEN (send at most ``half_open_max_probes`` probes at a time; close after
``half_open_successes`` probe successes, re-open on any probe failure).

Why outcomes and not latency: a replica that fails every request in 2 ms looks like the best
replica in the fleet to a latency-scored balancer, which then sends it more traffic (the
"black hole"). Only the failure ratio exposes it.

Rules, each pinned by a test:

* Trips when, over the last ``window_s`` seconds, at least ``min_requests`` outcomes were
  judged and the failure share is at least ``failure_ratio``. A time window (not "the last N
  outcomes") so that a failure from an hour ago cannot tip a quiet replica over.
* Also trips after ``consecutive_timeouts`` timeouts in a row (attempts that got no answer at
  all within their attempt timeout, :meth:`CircuitBreaker.on_timeout`), whatever the window
  holds: a replica that stopped answering (frozen, partitioned) is gone, not degraded, and the
  ratio rule would wait for as many timeouts as it had successes in the last ten seconds — on
  a busy replica, longer than its lease. Fast errors do not count here (a replica with a real
  30 % error rate must stay in rotation, see ADR 0002); any success resets the count.
* Opens for an exponentially growing backoff: ``base_backoff_s * multiplier ** (trips - 1)``
  capped at ``max_backoff_s``; ``trips`` counts consecutive openings and resets when the
  breaker closes.
* Half-open probe slots are taken in :meth:`CircuitBreaker.on_dispatch`, which the router
  calls only for the replica it actually chose. :meth:`CircuitBreaker.allows` is a pure
  query, so using it as an eligibility filter over many candidates takes nothing (the original
  leaked probe slots to replicas that were considered but not chosen, so they never recovered).
* Only SUCCESS, FAULT and TIMEOUT judge (see :mod:`gateway.routing.outcome`); BUSY and
  CANCELLED just hand back a probe slot.
* Outcomes of requests dispatched in an earlier state are ignored once the state moved on: a
  non-probe result arriving while OPEN or HALF_OPEN, or a probe from an earlier half-open
  episode, says nothing about the replica now.

All times are explicit ``now`` arguments (seconds, monotonic). No clock, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["BreakerConfig", "BreakerState", "CircuitBreaker", "Probe"]


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    """Thresholds for :class:`CircuitBreaker` (defaults suit 10-100 ms inference batches)."""

    failure_ratio: float = 0.5
    """Trip when at least this share of judged outcomes in the window failed."""
    min_requests: int = 5
    """...and at least this many outcomes were judged (no verdict on two samples)."""
    window_s: float = 10.0
    """How far back outcomes count."""
    window_buckets: int = 10
    """Resolution of the window (outcomes expire a bucket at a time)."""
    base_backoff_s: float = 1.0
    """How long the first opening lasts."""
    backoff_multiplier: float = 2.0
    """Each consecutive re-opening lasts this much longer..."""
    max_backoff_s: float = 30.0
    """...up to this ceiling."""
    half_open_max_probes: int = 1
    """Probes allowed in flight at once while half-open."""
    half_open_successes: int = 3
    """Probe successes needed to close."""
    consecutive_timeouts: int = 2
    """Timeouts in a row that open the breaker at once (ADR 0011)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.failure_ratio <= 1.0:
            raise ValueError(f"failure_ratio must be in (0, 1], got {self.failure_ratio}")
        if self.min_requests < 1:
            raise ValueError("min_requests must be at least 1")
        if not (math.isfinite(self.window_s) and self.window_s > 0.0):
            raise ValueError("window_s must be positive")
        if self.window_buckets < 1:
            raise ValueError("window_buckets must be at least 1")
        if not 0.0 < self.base_backoff_s <= self.max_backoff_s:
            raise ValueError("need 0 < base_backoff_s <= max_backoff_s")
        if self.backoff_multiplier < 1.0:
            raise ValueError("backoff_multiplier must be >= 1")
        if self.half_open_max_probes < 1 or self.half_open_successes < 1:
            raise ValueError("half-open probe counts must be at least 1")
        if self.consecutive_timeouts < 1:
            raise ValueError("consecutive_timeouts must be at least 1")


@dataclass(frozen=True)
class Probe:
    """Proof that a dispatch holds a half-open probe slot of a given episode."""

    episode: int


class _OutcomeWindow:
    """Success/failure counts over the last ``window_s`` seconds, in time buckets."""

    __slots__ = ("_epochs", "_failures", "_successes", "_width")

    def __init__(self, window_s: float, buckets: int) -> None:
        self._width = window_s / buckets
        self._epochs: list[int | None] = [None] * buckets
        self._successes = [0] * buckets
        self._failures = [0] * buckets

    def _slot(self, now: float) -> int:
        epoch = math.floor(now / self._width)
        i = epoch % len(self._epochs)
        if self._epochs[i] != epoch:
            self._epochs[i] = epoch
            self._successes[i] = 0
            self._failures[i] = 0
        return i

    def add(self, ok: bool, now: float) -> None:
        i = self._slot(now)
        if ok:
            self._successes[i] += 1
        else:
            self._failures[i] += 1

    def counts(self, now: float) -> tuple[int, int]:
        """``(successes, failures)`` within the window ending at ``now``."""
        epoch = math.floor(now / self._width)
        oldest = epoch - len(self._epochs) + 1
        s = f = 0
        for i, e in enumerate(self._epochs):
            if e is not None and oldest <= e <= epoch:
                s += self._successes[i]
                f += self._failures[i]
        return s, f

    def clear(self) -> None:
        n = len(self._epochs)
        self._epochs = [None] * n
        self._successes = [0] * n
        self._failures = [0] * n


class CircuitBreaker:
    """One replica's breaker. See the module docstring for the rules.

    Typical use (the router does this for you)::

        if breaker.allows(now):              # pure: safe to ask of every candidate
            probe = breaker.on_dispatch(now)  # only for the replica actually chosen
            ...
            breaker.on_success(now, probe)    # or on_failure / on_timeout / on_release
    """

    __slots__ = (
        "_config",
        "_episode",
        "_opened_at",
        "_probe_successes",
        "_probes_inflight",
        "_reopen_at",
        "_state",
        "_timeouts_in_row",
        "_trips",
        "_window",
    )

    def __init__(self, config: BreakerConfig | None = None) -> None:
        self._config = config or BreakerConfig()
        self._window = _OutcomeWindow(self._config.window_s, self._config.window_buckets)
        self._state = BreakerState.CLOSED
        self._trips = 0
        self._opened_at = 0.0
        self._reopen_at = 0.0
        self._episode = 0
        self._probes_inflight = 0
        self._probe_successes = 0
        self._timeouts_in_row = 0

    @property
    def config(self) -> BreakerConfig:
        return self._config

    @property
    def trips(self) -> int:
        """Consecutive openings since the breaker last closed."""
        return self._trips

    @property
    def probes_inflight(self) -> int:
        return self._probes_inflight

    def state(self, now: float) -> BreakerState:
        """The state at ``now``; an OPEN breaker whose backoff has passed becomes HALF_OPEN."""
        if self._state is BreakerState.OPEN and now >= self._reopen_at:
            self._state = BreakerState.HALF_OPEN
            self._episode += 1
            self._probes_inflight = 0
            self._probe_successes = 0
        return self._state

    def allows(self, now: float) -> bool:
        """Whether a dispatch could be made now. Takes nothing: ask it of every candidate."""
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN:
            return self._probes_inflight < self._config.half_open_max_probes
        return False

    def reopen_at(self, now: float) -> float | None:
        """When an OPEN breaker will admit probes again (None unless OPEN)."""
        if self.state(now) is BreakerState.OPEN:
            return self._reopen_at
        return None

    def on_dispatch(self, now: float) -> Probe | None:
        """Record that the router chose this replica; returns the probe slot taken, if any.

        Raises if the breaker does not allow a dispatch: the caller skipped :meth:`allows`.
        """
        if not self.allows(now):
            raise RuntimeError("dispatch to a replica whose breaker does not allow it")
        if self._state is BreakerState.HALF_OPEN:
            self._probes_inflight += 1
            return Probe(self._episode)
        return None

    def _live_probe(self, probe: Probe | None) -> bool:
        """Whether ``probe`` belongs to the current half-open episode (and return its slot)."""
        if probe is None or self._state is not BreakerState.HALF_OPEN:
            return False
        if probe.episode != self._episode:
            return False
        self._probes_inflight = max(0, self._probes_inflight - 1)
        return True

    def on_success(self, now: float, probe: Probe | None) -> None:
        self.state(now)
        if probe is not None:
            if self._live_probe(probe):
                self._probe_successes += 1
                if self._probe_successes >= self._config.half_open_successes:
                    self._close()
            return
        if self._state is BreakerState.CLOSED:
            self._timeouts_in_row = 0
            self._window.add(True, now)

    def on_failure(self, now: float, probe: Probe | None) -> None:
        self._judge_failure(now, probe, timed_out=False)

    def on_timeout(self, now: float, probe: Probe | None) -> None:
        """A failure of the worst kind: the attempt got no answer within its timeout."""
        self._judge_failure(now, probe, timed_out=True)

    def _judge_failure(self, now: float, probe: Probe | None, *, timed_out: bool) -> None:
        self.state(now)
        if probe is not None:
            if self._live_probe(probe):
                self._open(now)
            return
        if self._state is not BreakerState.CLOSED:
            return
        self._window.add(False, now)
        if timed_out:
            self._timeouts_in_row += 1
            if self._timeouts_in_row >= self._config.consecutive_timeouts:
                self._open(now)
                return
        successes, failures = self._window.counts(now)
        judged = successes + failures
        if judged >= self._config.min_requests and failures >= self._config.failure_ratio * judged:
            self._open(now)

    def on_release(self, now: float, probe: Probe | None) -> None:
        """A BUSY or CANCELLED attempt: no verdict; hand back the probe slot it held."""
        self.state(now)
        self._live_probe(probe)

    def _open(self, now: float) -> None:
        cfg = self._config
        self._trips += 1
        # The exponent is capped so that a replica failing for days cannot overflow a float.
        backoff = cfg.base_backoff_s * cfg.backoff_multiplier ** min(self._trips - 1, 64)
        self._state = BreakerState.OPEN
        self._opened_at = now
        self._reopen_at = now + min(cfg.max_backoff_s, backoff)
        self._probes_inflight = 0
        self._probe_successes = 0
        self._timeouts_in_row = 0
        self._window.clear()

    def _close(self) -> None:
        self._state = BreakerState.CLOSED
        self._trips = 0
        self._probes_inflight = 0
        self._probe_successes = 0
        self._timeouts_in_row = 0
        self._window.clear()

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self._state.value}, trips={self._trips})"
