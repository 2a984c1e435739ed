"""The world of the quota benchmark: tenants, clients, gateways coming and going, arrivals.

What it decides: who sends how many requests to which gateway at every tick, the same for
every strategy (the strategies only decide what is admitted, ``bench.quota_sim``).

The model, and why:

* **Clients stick to a gateway.** Each tenant has a few dozen clients with Zipf-like rates
  (client of rank ``k`` sends in proportion to ``1 / k**s``), so a tenant's demand is skewed
  across gateways by whichever gateway its heavy clients happen to be connected to.
* **Arrivals are Poisson per client**; a (gateway, tenant) pair receives the sum of its
  clients' streams, which is Poisson with the summed rate, drawn once per 0.1 s tick, each
  arrival at a uniform instant inside the tick. Every request costs one unit of work, so a
  contract is in requests per second.
* **The hot spot moves**: at set times the tenants' clients are re-ranked (a different client
  becomes the heavy one), each client's rate crossfading to its new one over 20 s.
* **A tenant's total offered rate** follows its profile over time: steadily over its contract,
  steadily under it, or swinging across it.
* **The load balancer re-spreads clients**: a connection lasts an exponential time (mean
  120 s), then the client reconnects to a uniformly chosen live gateway, so a gateway that
  joins gets clients over time, not at once. A gateway that leaves (crashes: it says nothing)
  sends its clients to reconnect at once.

Times in a :class:`Scenario` are for the full 600 s run; ``--quick`` scales them all with the
duration. Seeded (numpy PCG64): the same seed gives the same trace.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

__all__ = ["Arrivals", "Scenario", "TenantSpec", "Tick", "default_scenario", "generate"]


@dataclass(frozen=True)
class TenantSpec:
    """A tenant's contract and its offered load over time."""

    name: str
    rate: float
    """Contracted requests per second, fleet-wide."""
    burst_s: float
    """Contracted burst, in seconds of the rate."""
    level: float
    """Offered rate as a multiple of the contract, on average."""
    swing: float = 0.0
    """Amplitude of a sinusoidal swing of that multiple."""
    period_s: float = 200.0
    clients: int = 24
    zipf_s: float = 1.2

    @property
    def burst(self) -> float:
        return self.rate * self.burst_s

    def offered(self, t: float, scale: float) -> float:
        """The tenant's fleet-wide offered rate (requests per second) at ``t``."""
        phase = 2.0 * math.pi * t / (self.period_s * scale)
        return self.rate * max(0.0, self.level + self.swing * math.sin(phase))


@dataclass(frozen=True)
class Scenario:
    """Everything that happens in a run, in seconds of the full-length run."""

    duration_s: float = 600.0
    tick_s: float = 0.1
    tenants: tuple[TenantSpec, ...] = (
        TenantSpec("acme", 120.0, 2.0, level=1.5),
        TenantSpec("globex", 80.0, 2.0, level=0.6),
        TenantSpec("initech", 100.0, 2.0, level=1.0, swing=0.45, period_s=200.0),
        TenantSpec("umbrella", 40.0, 2.0, level=0.85, clients=12, zipf_s=1.6),
    )
    initial_gateways: int = 8
    joins: tuple[float, ...] = (120.0, 150.0, 450.0)
    leaves: tuple[float, ...] = (240.0, 270.0, 500.0)
    leave_order: tuple[int, ...] = (2, 5, 0)
    """The gateway ids that crash at ``leaves``, in order (they say nothing first)."""
    hot_spot_moves: tuple[float, ...] = (200.0, 400.0)
    crossfade_s: float = 20.0
    connection_mean_s: float = 120.0
    outage: tuple[float, float] = (330.0, 390.0)
    """The controller is down in ``[start, end)`` and comes back with no memory."""
    settle_s: float = 30.0
    """After start, a churn event or the outage: not steady state."""

    def scaled(self, duration_s: float) -> Scenario:
        """The same story compressed (or stretched) into ``duration_s``."""
        k = duration_s / self.duration_s
        return replace(
            self,
            duration_s=duration_s,
            joins=tuple(t * k for t in self.joins),
            leaves=tuple(t * k for t in self.leaves),
            hot_spot_moves=tuple(t * k for t in self.hot_spot_moves),
            crossfade_s=self.crossfade_s * k,
            connection_mean_s=self.connection_mean_s * k,
            outage=(self.outage[0] * k, self.outage[1] * k),
            settle_s=self.settle_s * k,
        )

    @property
    def scale(self) -> float:
        return self.duration_s / 600.0

    @property
    def ticks(self) -> int:
        return round(self.duration_s / self.tick_s)

    @property
    def gateway_count(self) -> int:
        """Gateways that ever exist (initial ones, then one per join)."""
        return self.initial_gateways + len(self.joins)

    def churn_times(self) -> tuple[float, ...]:
        return tuple(sorted((*self.joins, *self.leaves)))


def default_scenario() -> Scenario:
    return Scenario()


@dataclass(frozen=True)
class Arrivals:
    """Requests arriving at one gateway for one tenant within one tick."""

    gateway: int
    tenant: int
    times: tuple[float, ...]


@dataclass(frozen=True)
class Tick:
    """One tick of the world: its start, the live gateways, the arrivals, the intensities."""

    index: int
    start: float
    live: tuple[int, ...]
    joined: tuple[int, ...]
    left: tuple[int, ...]
    arrivals: tuple[Arrivals, ...]
    offered_rate: tuple[float, ...]
    """Per tenant: the fleet-wide Poisson intensity (the model's truth, not a count)."""


def _zipf_rates(s: float, ranks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    weights: npt.NDArray[np.float64] = 1.0 / np.power(ranks + 1.0, s)
    normalised: npt.NDArray[np.float64] = weights / float(weights.sum())
    return normalised


def generate(scenario: Scenario, seed: int) -> Iterator[Tick]:
    """The world, tick by tick (deterministic in ``seed``)."""
    rng = np.random.default_rng(seed)
    dt = scenario.tick_s
    tenants = scenario.tenants
    live = list(range(scenario.initial_gateways))
    next_gateway = scenario.initial_gateways
    joins = sorted(scenario.joins)
    leaves = sorted(scenario.leaves)
    leave_order = list(scenario.leave_order)
    # Per tenant: which gateway each client is on, and its old and new Zipf weights.
    homes = [rng.choice(live, size=spec.clients) for spec in tenants]
    ranks = [rng.permutation(spec.clients) for spec in tenants]
    old_w = [_zipf_rates(spec.zipf_s, r) for spec, r in zip(tenants, ranks, strict=True)]
    new_w = list(old_w)
    move_at = -math.inf
    moves = sorted(scenario.hot_spot_moves)
    p_reconnect = 1.0 - math.exp(-dt / scenario.connection_mean_s)
    for index in range(scenario.ticks):
        t = index * dt
        joined: list[int] = []
        left: list[int] = []
        while joins and joins[0] <= t:
            joins.pop(0)
            live.append(next_gateway)
            joined.append(next_gateway)
            next_gateway += 1
        while leaves and leaves[0] <= t:
            leaves.pop(0)
            victim = leave_order.pop(0)
            live.remove(victim)
            left.append(victim)
        while moves and moves[0] <= t:
            moves.pop(0)
            old_w = [
                _blend(o, n, t, move_at, scenario.crossfade_s)
                for o, n in zip(old_w, new_w, strict=True)
            ]
            new_w = [_zipf_rates(spec.zipf_s, rng.permutation(spec.clients)) for spec in tenants]
            move_at = t
        live_arr = np.array(live)
        arrivals: list[Arrivals] = []
        offered: list[float] = []
        for k, spec in enumerate(tenants):
            home = homes[k]
            gone = ~np.isin(home, live_arr)
            moving = gone | (rng.random(spec.clients) < p_reconnect)
            if moving.any():
                home[moving] = rng.choice(live_arr, size=int(moving.sum()))
            total = spec.offered(t, scenario.scale)
            offered.append(total)
            weights = _blend(old_w[k], new_w[k], t, move_at, scenario.crossfade_s)
            per_gateway = np.bincount(home, weights=weights * total, minlength=next_gateway)
            counts = rng.poisson(per_gateway * dt)
            for gateway in np.flatnonzero(counts):
                times = np.sort(rng.random(int(counts[gateway])))
                arrivals.append(Arrivals(int(gateway), k, tuple(t + dt * times)))
        yield Tick(
            index, t, tuple(live), tuple(joined), tuple(left), tuple(arrivals), tuple(offered)
        )


def _blend(
    old: npt.NDArray[np.float64],
    new: npt.NDArray[np.float64],
    t: float,
    since: float,
    over: float,
) -> npt.NDArray[np.float64]:
    if t - since >= over:
        return new
    mix = max(0.0, (t - since) / over)
    return (1.0 - mix) * old + mix * new
