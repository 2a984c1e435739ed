"""Herd scenario: many gateways with no shared state, one fleet — who stampedes a replica?

What it decides: nothing in production. It measures how evenly independent gateways spread
work, by the longest queue any replica ever holds.

Model: ``gateways`` gateways, each with its own Poisson arrivals (together ``load`` of the
fleet's capacity), and ``replicas`` identical replicas, each serving one request at a time
from its own FIFO queue. Gateways never talk to each other. Three policies:

* ``global-least-loaded`` — every gateway sends to the replica with the smallest load in its
  view: the fleet-wide load report (queue lengths, published to all gateways every
  ``report_interval_s``, as heartbeats relayed by a controller would be) plus the requests this
  gateway itself sent since. Every gateway sees the same minimum, so they all pile onto it
  until the next report: the herd.
* ``p2c (same report)`` — the same view, but the lesser of two random replicas.
* ``halcyon p2c peak-ewma`` — :class:`~gateway.routing.PeakEwmaRouter`, one per gateway, on
  local state only: its own inflight counts and the latencies it observed (which include the
  replicas' queueing).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from bench.fleet_events import EventLoop
from bench.fleet_workload import DeviceModel, Request, poisson_trace
from common.histogram import exact_quantile
from common.rng import Rng, SeededRng
from gateway.routing import Lease, NoCapacity, Outcome, PeakEwmaRouter, ReplicaSpec

__all__ = ["HERD_POLICIES", "HerdConfig", "HerdResult", "run_herd", "run_herd_policy"]

HERD_POLICIES = ("global-least-loaded", "p2c (same report)", "halcyon p2c peak-ewma")


@dataclass(frozen=True)
class HerdConfig:
    gateways: int = 8
    replicas: int = 64
    load: float = 0.85
    duration_s: float = 5.0
    report_interval_s: float = 1.0
    """How stale the shared load report gets: 1 s is the worker's default heartbeat."""
    device: DeviceModel = field(default_factory=lambda: DeviceModel(stall_p=0.0))

    def arrival_rate(self) -> float:
        return self.load * self.replicas / self.device.mean_s(1.0)


@dataclass(frozen=True)
class HerdResult:
    policy: str
    report_interval_s: float | None
    """The load-report interval the policy routed on (None: it reads no report)."""
    requests: int
    max_queue: int
    """Longest queue (waiting + in service) any replica held at any moment."""
    p99_queue: int
    """99th percentile of the queue length each request joined (itself included)."""
    p50_ms: float
    p99_ms: float


class _Replica:
    __slots__ = ("busy", "queue")

    def __init__(self) -> None:
        self.queue: deque[tuple[Request, int, Lease | None]] = deque()
        self.busy = False

    def load(self) -> int:
        return len(self.queue) + (1 if self.busy else 0)


class _Herd:
    def __init__(self, config: HerdConfig, policy: str, seed: int) -> None:
        self.cfg = config
        self.policy = policy
        self.loop = EventLoop()
        self.rng: Rng = SeededRng(seed * 31 + 7)
        self.service_rng: Rng = SeededRng(seed * 7919 + 3)
        self.replicas = [_Replica() for _ in range(config.replicas)]
        self.report = [0] * config.replicas
        self.sent_since = [[0] * config.replicas for _ in range(config.gateways)]
        prior = config.device.mean_s(1.0)
        self.routers: list[PeakEwmaRouter] = []
        if policy == HERD_POLICIES[2]:
            for g in range(config.gateways):
                router = PeakEwmaRouter(SeededRng(seed * 1009 + g))
                for i in range(config.replicas):
                    # Replica queues are unbounded here: no slot ceiling to speak of.
                    router.upsert(ReplicaSpec(f"r{i}", slots=1 << 30, prior_latency_s=prior), 0.0)
                self.routers.append(router)
        self.max_queue = 0
        self.joined: list[float] = []
        self.latencies: list[float] = []

    def publish(self) -> None:
        self.report = [r.load() for r in self.replicas]
        for row in self.sent_since:
            for i in range(len(row)):
                row[i] = 0
        if self.loop.now() + self.cfg.report_interval_s < self.cfg.duration_s:
            self.loop.after(self.cfg.report_interval_s, self.publish)

    def choose(self, gateway: int) -> tuple[int, Lease | None]:
        n = self.cfg.replicas
        sent = self.sent_since[gateway]
        if self.policy == HERD_POLICIES[0]:
            view = [self.report[i] + sent[i] for i in range(n)]
            lowest = min(view)
            ties = [i for i in range(n) if view[i] == lowest]
            return ties[self.rng.randrange(len(ties))], None
        if self.policy == HERD_POLICIES[1]:
            a = self.rng.randrange(n)
            b = self.rng.randrange(n - 1)
            if b >= a:
                b += 1
            va, vb = self.report[a] + sent[a], self.report[b] + sent[b]
            return (b if vb < va else a), None
        lease = self.routers[gateway].pick(self.loop.now())
        assert not isinstance(lease, NoCapacity)
        return int(lease.replica_id[1:]), lease

    def arrive(self, request: Request, gateway: int) -> None:
        index, lease = self.choose(gateway)
        self.sent_since[gateway][index] += 1
        replica = self.replicas[index]
        replica.queue.append((request, gateway, lease))
        depth = replica.load()
        self.joined.append(float(depth))
        self.max_queue = max(self.max_queue, depth)
        if not replica.busy:
            self.start(index)

    def start(self, index: int) -> None:
        replica = self.replicas[index]
        request, gateway, lease = replica.queue.popleft()
        replica.busy = True
        took = self.cfg.device.sample_s(self.service_rng, request.tokens, 1.0)
        self.loop.after(took, lambda: self.done(index, request, gateway, lease))

    def done(self, index: int, request: Request, gateway: int, lease: Lease | None) -> None:
        now = self.loop.now()
        latency = now - request.arrival
        self.latencies.append(latency)
        if lease is not None:
            self.routers[gateway].complete(lease, Outcome.SUCCESS, latency, now)
        replica = self.replicas[index]
        replica.busy = False
        if replica.queue:
            self.start(index)

    def run(self, seed: int) -> HerdResult:
        cfg = self.cfg
        per_gateway = cfg.arrival_rate() / cfg.gateways
        total = 0
        for g in range(cfg.gateways):
            for request in poisson_trace(SeededRng(seed * 101 + g), per_gateway, cfg.duration_s):
                self.loop.at(
                    request.arrival,
                    lambda q=request, gw=g: self.arrive(q, gw),  # type: ignore[misc]
                )
                total += 1
        self.loop.at(0.0, self.publish)
        self.loop.run()
        return HerdResult(
            policy=self.policy,
            report_interval_s=None if self.routers else cfg.report_interval_s,
            requests=total,
            max_queue=self.max_queue,
            p99_queue=round(exact_quantile(self.joined, 0.99)),
            p50_ms=1000.0 * exact_quantile(self.latencies, 0.50),
            p99_ms=1000.0 * exact_quantile(self.latencies, 0.99),
        )


def run_herd_policy(config: HerdConfig, policy: str, seed: int) -> HerdResult:
    if policy not in HERD_POLICIES:
        raise ValueError(f"unknown herd policy {policy!r}")
    return _Herd(config, policy, seed).run(seed)


def run_herd(config: HerdConfig, seed: int) -> list[HerdResult]:
    """Every herd policy on the same arrivals and service-time stream."""
    return [run_herd_policy(config, policy, seed) for policy in HERD_POLICIES]
