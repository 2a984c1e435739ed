"""Fleet simulations for ``halcyon bench``: routing under a straggler and a black hole, and herds.

What it decides: nothing in production. It measures the routing policy objects
(:mod:`gateway.routing`) against the usual alternatives on a seeded discrete-event model, so
claims about them are reproducible figures rather than adjectives.

**Fleet scenario** (:func:`run_fleet`, ``--scenario fleet``). Three replicas with
``slots`` each: ``fast`` (speed 1.0), ``straggler`` (speed 0.6) and ``blackhole`` (advertises
speed 1.0 but fails every request in 2 ms). Open-loop Poisson arrivals at ``load`` (default
80 %) of the healthy replicas' capacity; sizes, deadlines and service times from
:mod:`bench.fleet_workload`. Requests wait in an earliest-deadline-first gateway queue until a
strategy places them; a request still unanswered at its deadline is cancelled (the worker
frees its slot) and counts as missed. A fault fails the request unless a hedge is still out.
Every strategy sees the same arrival trace and the same service-time stream.

**Herd scenario** (:func:`run_herd`, ``--scenario herd``): see :mod:`bench.fleet_herd`.

Entry points for the CLI: :func:`fleet_main` and :func:`herd_main` (a table, or one JSON
object per row with ``--json``).
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TextIO

from bench.fleet_events import EventLoop, Timer
from bench.fleet_herd import HERD_POLICIES, HerdConfig, HerdResult, run_herd, run_herd_policy
from bench.fleet_policies import (
    Attempt,
    HalcyonStrategy,
    LeastOutstanding,
    RoundRobin,
    Strategy,
)
from bench.fleet_workload import DeviceModel, Request, poisson_trace
from common.clock import Clock
from common.histogram import exact_quantile
from common.rng import Rng, SeededRng
from gateway.routing import HedgeRace, Outcome, RaceVerdict, ReplicaSpec

__all__ = [
    "FleetConfig",
    "FleetResult",
    "HerdConfig",
    "HerdResult",
    "fleet_main",
    "herd_main",
    "run_fleet",
    "run_herd",
]

BLACKHOLE = "blackhole"


@dataclass(frozen=True)
class FleetReplica:
    replica_id: str
    speed: float
    advertised_speed: float
    fails_in_s: float | None = None
    """If set, every request fails after this long (a black hole)."""


DEFAULT_REPLICAS = (
    FleetReplica("fast", 1.0, 1.0),
    FleetReplica("straggler", 0.6, 0.6),
    FleetReplica(BLACKHOLE, 1.0, 1.0, fails_in_s=0.002),
)


@dataclass(frozen=True)
class FleetConfig:
    duration_s: float = 120.0
    load: float = 0.8
    """Offered load as a share of the healthy replicas' capacity."""
    slots: int = 1
    replicas: tuple[FleetReplica, ...] = DEFAULT_REPLICAS
    device: DeviceModel = field(default_factory=DeviceModel)
    fault_retries: int = 0
    """Re-dispatches of a request whose every attempt faulted (excluding replicas tried)."""

    def capacity_rps(self) -> float:
        """Requests per second the healthy replicas can serve."""
        return sum(
            self.slots / self.device.mean_s(r.speed) for r in self.replicas if r.fails_in_s is None
        )

    def arrival_rate(self) -> float:
        return self.load * self.capacity_rps()


@dataclass(frozen=True)
class FleetResult:
    strategy: str
    offered: int
    goodput_per_s: float
    """Requests answered successfully by their deadline, per second of offered load."""
    on_time_pct: float
    failed: int
    missed: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    """Latency quantiles over every offered request. A request that failed or missed its
    deadline was never answered: it counts as infinitely slow, and a quantile that falls on
    such requests is None (shown as a dash). Quantiles of the answered requests alone would
    flatter a strategy that fails much of its traffic fast."""
    fault_retries: int
    blackhole_pct: float
    """Attempts sent to the black hole, as a share of requests."""
    hedge_pct: float
    """Hedges, as a share of primary dispatches."""
    dispatches: int
    hedges: int


class _Req:
    __slots__ = ("deadline_timer", "exclude", "race", "request", "retries", "state", "tried")

    def __init__(self, request: Request, retries: int) -> None:
        self.request = request
        self.state = "queued"
        self.race: HedgeRace[Attempt] | None = None
        self.exclude: set[str] = set()
        self.tried: list[str] = []
        self.retries = retries
        self.deadline_timer: Timer | None = None


class _FleetSim:
    def __init__(self, config: FleetConfig, strategy: Strategy, loop: EventLoop, seed: int):
        self.cfg = config
        self.strategy = strategy
        self.loop = loop
        self.replicas = {r.replica_id: r for r in config.replicas}
        self.service_rng: Rng = SeededRng(seed * 7919 + 1)
        self.queue: list[tuple[float, int, _Req]] = []
        self.queued = 0
        self.wake: Timer | None = None
        self.timers: dict[int, Timer] = {}  # id(attempt) -> completion timer
        self.latencies: list[float] = []
        self.failed = 0
        self.missed = 0
        self.dispatches = 0
        self.hedges = 0
        self.per_replica = dict.fromkeys(self.replicas, 0)

    # -- arrivals and the gateway queue ---------------------------------------------------------

    def arrive(self, request: Request) -> None:
        r = _Req(request, self.cfg.fault_retries)
        r.deadline_timer = self.loop.at(request.deadline, lambda: self.deadline(r))
        self.enqueue(r)
        self.pump()

    def enqueue(self, r: _Req) -> None:
        r.state = "queued"
        heapq.heappush(self.queue, (r.request.deadline, r.request.rid, r))
        self.queued += 1

    def pump(self) -> None:
        now = self.loop.now()
        while self.queue:
            _, _, r = self.queue[0]
            if r.state != "queued":
                heapq.heappop(self.queue)
                continue
            choice = self.strategy.pick(now, r.exclude)
            if not isinstance(choice, Attempt):
                if math.isfinite(choice) and (self.wake is None or self.wake.when > now + choice):
                    if self.wake is not None:
                        self.wake.cancel()
                    self.wake = self.loop.after(choice, self._woken)
                return
            heapq.heappop(self.queue)
            self.queued -= 1
            r.state = "running"
            r.race = HedgeRace(choice)
            self.dispatches += 1
            self.launch(r, choice)
            delay = self.strategy.hedge_delay(now)
            if delay is not None:
                primary = choice
                self.loop.after(delay, lambda r=r, p=primary: self.hedge_check(r, p))  # type: ignore[misc]

    def _woken(self) -> None:
        self.wake = None
        self.pump()

    # -- attempts -------------------------------------------------------------------------------

    def launch(self, r: _Req, attempt: Attempt) -> None:
        replica = self.replicas[attempt.replica_id]
        self.per_replica[replica.replica_id] += 1
        r.tried.append(replica.replica_id)
        if replica.fails_in_s is not None:
            took, outcome = replica.fails_in_s, Outcome.FAULT
        else:
            took = self.cfg.device.sample_s(self.service_rng, r.request.tokens, replica.speed)
            outcome = Outcome.SUCCESS
        self.timers[id(attempt)] = self.loop.after(
            took, lambda: self.finish(r, attempt, outcome, took)
        )

    def finish(self, r: _Req, attempt: Attempt, outcome: Outcome, took: float) -> None:
        now = self.loop.now()
        self.timers.pop(id(attempt), None)
        self.strategy.complete(attempt, outcome, took, now)
        assert r.race is not None
        result = r.race.settle(attempt, outcome is Outcome.SUCCESS)
        if result.verdict is RaceVerdict.WON and r.state == "running":
            r.state = "done"
            self.latencies.append(now - r.request.arrival)
            if r.deadline_timer is not None:
                r.deadline_timer.cancel()
            for loser in result.cancel:
                self.cancel(loser)
        elif result.verdict is RaceVerdict.LOST and r.state == "running":
            if r.retries > 0:
                r.retries -= 1
                r.exclude.update(r.tried)
                self.enqueue(r)
            else:
                r.state = "failed"
                self.failed += 1
                if r.deadline_timer is not None:
                    r.deadline_timer.cancel()
        self.pump()

    def cancel(self, attempt: Attempt) -> None:
        timer = self.timers.pop(id(attempt), None)
        if timer is None:
            return
        timer.cancel()
        now = self.loop.now()
        self.strategy.complete(attempt, Outcome.CANCELLED, now - attempt.started, now)

    def hedge_check(self, r: _Req, primary: Attempt) -> None:
        if r.state != "running" or r.race is None or r.race.hedged:
            return
        if not any(a is primary for a in r.race.outstanding):
            return
        hedge = self.strategy.try_hedge(self.loop.now(), primary, r.request.deadline, self.queued)
        if hedge is None:
            return
        if not isinstance(hedge, Attempt):
            # Never re-arm closer than a timer tick: no busy loop on a shrinking wait.
            self.loop.after(max(hedge, 0.001), lambda: self.hedge_check(r, primary))
            return
        self.hedges += 1
        r.race.add_hedge(hedge)
        self.launch(r, hedge)

    def deadline(self, r: _Req) -> None:
        if r.state == "queued":
            self.queued -= 1
        elif r.state == "running":
            assert r.race is not None
            for attempt in r.race.outstanding:
                self.cancel(attempt)
        else:
            return
        r.state = "missed"
        self.missed += 1
        self.pump()


def _specs(config: FleetConfig) -> list[ReplicaSpec]:
    return [
        ReplicaSpec(
            r.replica_id,
            slots=config.slots,
            prior_latency_s=config.device.mean_s(r.advertised_speed),
        )
        for r in config.replicas
    ]


StrategyFactory = Callable[[Sequence[ReplicaSpec], Clock, int], Strategy]

STRATEGIES: dict[str, StrategyFactory] = {
    "round-robin": lambda specs, clock, seed: RoundRobin(specs),
    "least-outstanding": lambda specs, clock, seed: LeastOutstanding(specs),
    "halcyon": lambda specs, clock, seed: HalcyonStrategy(specs, clock, SeededRng(seed)),
}


def run_fleet(config: FleetConfig, strategy: str, seed: int) -> FleetResult:
    """Run one strategy through the fleet scenario; same seed, same trace for every strategy."""
    trace = poisson_trace(SeededRng(seed), config.arrival_rate(), config.duration_s)
    loop = EventLoop()
    strat = STRATEGIES[strategy](_specs(config), loop.clock, seed + 1)
    sim = _FleetSim(config, strat, loop, seed)
    for request in trace:
        loop.at(request.arrival, lambda q=request: sim.arrive(q))  # type: ignore[misc]
    loop.run()
    offered = len(trace)
    ok = len(sim.latencies)

    def q_ms(q: float) -> float | None:
        # Unanswered requests sort after every answered one.
        padded = sorted(sim.latencies) + [math.inf] * (offered - ok)
        value = exact_quantile(padded, q) if padded else math.inf
        return 1000.0 * value if math.isfinite(value) else None

    return FleetResult(
        strategy=strat.name,
        offered=offered,
        goodput_per_s=ok / config.duration_s,
        on_time_pct=100.0 * ok / offered if offered else 0.0,
        failed=sim.failed,
        missed=sim.missed,
        p50_ms=q_ms(0.50),
        p95_ms=q_ms(0.95),
        p99_ms=q_ms(0.99),
        fault_retries=config.fault_retries,
        blackhole_pct=100.0 * sim.per_replica.get(BLACKHOLE, 0) / offered if offered else 0.0,
        hedge_pct=100.0 * sim.hedges / sim.dispatches if sim.dispatches else 0.0,
        dispatches=sim.dispatches,
        hedges=sim.hedges,
    )


# -- output -------------------------------------------------------------------------------------


def _print_table(
    out: TextIO, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]
) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out.write(title + "\n")
    out.write(line(header) + "\n")
    for row in rows:
        out.write(line(row) + "\n")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


FAULT_MODES = (
    (0, "faults returned to the client"),
    (1, "gateway retries a fault once on another replica"),
)


def fleet_main(seed: int, duration_s: float | None, as_json: bool, out: TextIO) -> int:
    """``halcyon bench --scenario fleet``: every strategy on the same seeded fleet, twice.

    Once with faults returned to the client, once with the gateway retrying a fault on
    another replica (which hides the black hole from goodput but not from latency and waste).
    """
    base = FleetConfig() if duration_s is None else FleetConfig(duration_s=duration_s)
    for retries, label in FAULT_MODES:
        config = replace(base, fault_retries=retries)
        results = [run_fleet(config, name, seed) for name in STRATEGIES]
        if as_json:
            for r in results:
                row: dict[str, object] = {
                    "scenario": "fleet",
                    "seed": seed,
                    "duration_s": config.duration_s,
                    "load": config.load,
                    "arrival_rate": config.arrival_rate(),
                }
                row.update(asdict(r))
                out.write(json.dumps(row) + "\n")
            continue
        title = (
            f"fleet ({label}): fast 1.0x + straggler 0.6x + black hole (fails in 2 ms), "
            f"{config.slots} slot each; Poisson {config.arrival_rate():.1f} req/s = "
            f"{config.load:.0%} of healthy capacity; {config.duration_s:g} s, seed {seed}"
        )
        header = [
            "strategy",
            "goodput/s",
            "on time",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "sent to black hole",
            "hedges",
        ]
        rows = [
            [
                r.strategy,
                f"{r.goodput_per_s:.1f}",
                f"{r.on_time_pct:.1f}%",
                _ms(r.p50_ms),
                _ms(r.p95_ms),
                _ms(r.p99_ms),
                f"{r.blackhole_pct:.2f}%",
                f"{r.hedge_pct:.2f}%",
            ]
            for r in results
        ]
        _print_table(out, title, header, rows)
        out.write("\n")
    if not as_json:
        out.write(
            "latency quantiles are over every offered request; '-' = the quantile falls on "
            "requests never answered in time\n"
        )
    return 0


HERD_REPORT_INTERVALS_S = (1.0, 0.25, 0.1)
"""Load-report staleness to run the herd at; the first is the worker's default heartbeat."""


def herd_main(seed: int, as_json: bool, out: TextIO) -> int:
    """``halcyon bench --scenario herd``: many gateways, no shared state, who stampedes.

    Runs at each load-report interval in :data:`HERD_REPORT_INTERVALS_S`; the local-state
    Halcyon policy does not read reports, so it runs once.
    """
    base = HerdConfig()
    results: list[HerdResult] = []
    for i, interval in enumerate(HERD_REPORT_INTERVALS_S):
        config = replace(base, report_interval_s=interval)
        policies = HERD_POLICIES if i == 0 else HERD_POLICIES[:2]
        results.extend(run_herd_policy(config, policy, seed) for policy in policies)
    if as_json:
        for r in results:
            row: dict[str, object] = {
                "scenario": "herd",
                "seed": seed,
                "gateways": base.gateways,
                "replicas": base.replicas,
                "load": base.load,
                "duration_s": base.duration_s,
            }
            row.update(asdict(r))
            out.write(json.dumps(row) + "\n")
        return 0
    title = (
        f"herd: {base.gateways} gateways x {base.replicas} replicas (1 slot + FIFO queue each), "
        f"no shared state; Poisson {base.arrival_rate():.0f} req/s = {base.load:.0%} of "
        f"capacity; {base.duration_s:g} s, seed {seed}"
    )
    header = ["policy", "load report every", "max queue", "p99 queue", "p50 ms", "p99 ms"]
    rows = [
        [
            r.policy,
            "unused" if r.report_interval_s is None else f"{r.report_interval_s * 1000:g} ms",
            str(r.max_queue),
            str(r.p99_queue),
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
        ]
        for r in results
    ]
    _print_table(out, title, header, rows)
    return 0


if __name__ == "__main__":  # pragma: no cover - manual runs until the CLI wires this in
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Halcyon fleet simulations")
    parser.add_argument("--scenario", choices=["fleet", "herd"], default="fleet")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.scenario == "fleet":
        sys.exit(fleet_main(args.seed, args.duration, args.json, sys.stdout))
    sys.exit(herd_main(args.seed, args.json, sys.stdout))
