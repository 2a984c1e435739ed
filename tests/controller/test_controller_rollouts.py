"""RolloutManager, the shell around the judge: an injected clock, a real SQLite store, seeded
traffic fed through the same tap the outcome reports use. No sleeps, no servers."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from common.clock import ManualClock
from controller.canary import JudgePolicy
from controller.convert import WallClock
from controller.fleet_view import FleetView
from controller.metrics import ControllerMetrics
from controller.registry import FleetRegistry
from controller.rollout_evidence import RolloutEvidence
from controller.rollouts import (
    NoActiveRollout,
    NoCanaryReplica,
    NoStableVersion,
    RolloutBusy,
    RolloutManager,
    StartRequest,
    UnknownModel,
)
from controller.routing_table import RoutingTable
from controller.stable_versions import StableSource
from controller.store import ControllerStore, DecisionAction, DecisionRecord, RolloutStatus
from halcyon.v1 import control_pb2, fleet_pb2

K = control_pb2.RequestOutcomeKind
WALL_START = 1_800_000_000.0
# Short windows so a whole rollout is a few simulated minutes.
POLICY = JudgePolicy(window_s=5.0, min_requests=30, healthy_windows_to_advance=1)


@dataclass
class World:
    """A manager wired as the controller wires it, on a manual clock."""

    path: Path
    clock: ManualClock = field(default_factory=lambda: ManualClock(100.0))
    stable: dict[str, str] = field(default_factory=lambda: {"resnet": "v1"})

    def __post_init__(self) -> None:
        self.store = ControllerStore(self.path)
        self.registry = FleetRegistry(self.clock, lease_ttl_s=1e9)
        self.routing = RoutingTable(self.stable)
        self.wall = WallClock(self.clock, wall_now=lambda: WALL_START + self.clock.now())
        self.view = FleetView(self.registry, self.routing, self.wall)
        self.evidence = RolloutEvidence()
        self.published = 0
        self.manager = RolloutManager(
            store=self.store,
            routing=self.routing,
            registry=self.registry,
            view=self.view,
            publish=self._publish,
            evidence=self.evidence,
            metrics=ControllerMetrics(),
            clock=self.clock,
            wall=self.wall,
            configured_stable=self.stable,
        )

    def _publish(self) -> None:
        self.published += 1

    def replica(self, replica_id: str, version: str, model: str = "resnet") -> None:
        self.registry.register(
            fleet_pb2.ReplicaDescriptor(
                replica_id=replica_id,
                address=f"127.0.0.1:{7000 + zlib.crc32(replica_id.encode()) % 1000}",
                model=model,
                version=version,
                hardware="a10g",
                slots=1,
                speed=1.0,
            )
        )

    def route(self, model: str = "resnet") -> control_pb2.ModelRouting:
        found = self.view.resolution().for_model(model)
        assert found is not None
        return found

    async def start(self, canary: str = "v2", steps: tuple[float, ...] = (10.0, 50.0)) -> int:
        record = await self.manager.start_rollout(
            StartRequest(model="resnet", canary_version=canary, step_percents=steps, policy=POLICY)
        )
        return record.id

    def decisions(self) -> list[DecisionRecord]:
        return self.store.list_decisions("resnet", limit=1000)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "c.sqlite")
    w.replica("a", "v1")
    w.replica("c", "v2")
    yield w
    w.store.close()


async def drive(
    world: World,
    *,
    seconds: float,
    rate: float = 200.0,
    canary_errors: float = 0.0,
    canary_failed_batches: float = 0.0,
    canary_median_s: float = 0.05,
    seed: int = 7,
    until: DecisionAction | None = None,
) -> list[DecisionRecord]:
    """One second of seeded traffic per tick, split by the current weight, reported through
    the tap; returns the decisions taken, stopping when the rollout ends (or ``until``)."""
    rng = np.random.default_rng(seed)
    taken: list[DecisionRecord] = []
    for _ in range(int(seconds)):
        active = world.manager.active("resnet")
        if active is None:
            break
        share = active.canary_weight_bp / 10_000
        for version, n, errors, median in (
            (active.baseline_version, rng.poisson(rate * (1 - share)), 0.0, 0.05),
            (active.canary_version, rng.poisson(rate * share), canary_errors, canary_median_s),
        ):
            for _ in range(int(n)):
                if rng.random() < errors:
                    world.evidence.record("resnet", version, K.REQUEST_OUTCOME_KIND_ERROR, 0.0)
                else:
                    latency = float(median * np.exp(rng.normal(0.0, 0.3)))
                    world.evidence.record("resnet", version, K.REQUEST_OUTCOME_KIND_OK, latency)
                    if version == active.canary_version and rng.random() < canary_failed_batches:
                        # Failed on its first batch, answered by the gateway's retry.
                        world.evidence.record_batch("resnet", version, 1, False)
        world.clock.advance(1.0)
        taken += await world.manager.tick()
        if until is not None and taken and taken[-1].action == until:
            break
    return taken


# -- start ------------------------------------------------------------------------------------


async def test_start_routes_the_first_step_and_stores_the_start(world: World) -> None:
    feed = world.manager.feed.subscribe("resnet")
    rollout_id = await world.start()
    route = world.route()
    assert (route.stable_version, route.canary_version, route.canary_weight_bp) == (
        "v1",
        "v2",
        1000,
    )
    assert world.published == 1
    [start] = world.decisions()
    assert (start.rollout_id, start.action, start.to_percent) == (
        rollout_id,
        DecisionAction.START,
        10.0,
    )
    assert "v2 against v1" in start.detail
    assert await feed.next() == start
    [stored] = world.store.list_rollouts("resnet")
    assert (stored.state, stored.canary_weight_bp, stored.step_percents) == (
        RolloutStatus.PROGRESSING,
        1000,
        (10.0, 50.0),
    )
    assert stored.policy["window_s"] == 5.0  # the effective policy, every field


async def test_a_final_100_means_promote(world: World) -> None:
    await world.start(steps=(5.0, 50.0, 100.0))
    [stored] = world.store.list_rollouts("resnet")
    assert stored.step_percents == (5.0, 50.0)


async def test_start_preconditions(world: World) -> None:
    with pytest.raises(UnknownModel) as unknown:
        await world.manager.start_rollout(
            StartRequest(model="bert", canary_version="v2", step_percents=(), policy=POLICY)
        )
    assert unknown.value.precondition
    with pytest.raises(NoCanaryReplica, match="v3"):
        await world.start(canary="v3")
    world.replica("x", "v1", model="bert")
    world.replica("y", "v2", model="bert")
    world.replica("z", "v3", model="bert")
    with pytest.raises(NoStableVersion, match="v1, v2, v3"):
        await world.manager.start_rollout(
            StartRequest(model="bert", canary_version="v3", step_percents=(), policy=POLICY)
        )
    await world.start()
    with pytest.raises(RolloutBusy, match="already has a running rollout"):
        await world.start()
    assert len(world.store.list_rollouts()) == 1


async def test_a_draining_canary_replica_does_not_count(world: World) -> None:
    world.registry.request_drain("c")
    with pytest.raises(NoCanaryReplica):
        await world.start()


# -- the judge's decisions, applied ---------------------------------------------------------


async def test_a_healthy_canary_walks_the_steps_and_is_promoted(world: World) -> None:
    watched = world.manager.feed.subscribe()
    await world.start()
    taken = await drive(world, seconds=300)
    actions = [d.action for d in taken]
    assert actions.count(DecisionAction.ADVANCE) == 1
    assert actions[-1] == DecisionAction.PROMOTE, [(d.action, d.reason) for d in taken]
    promote = taken[-1]
    assert promote.canary is not None and promote.canary.version == "v2"
    assert promote.baseline is not None and promote.baseline.requests > 0
    route = world.route()
    assert (route.stable_version, route.canary_version, route.canary_weight_bp) == ("v2", "", 0)
    [stored] = world.store.list_rollouts("resnet")
    assert (stored.state, stored.canary_weight_bp) == (RolloutStatus.PROMOTED, 10_000)
    record = world.store.stable_versions()["resnet"]
    assert (record.version, record.source, record.config_version) == (
        "v2",
        StableSource.PROMOTION,
        "v1",
    )
    assert world.manager.active("resnet") is None
    assert world.evidence.watching("resnet") is None
    # Every stored decision reached the watcher, in order.
    streamed = []
    while len(streamed) < len(world.decisions()):
        decision = await watched.next()
        assert decision is not None
        streamed.append(decision)
    assert streamed == world.decisions()


async def test_an_erroring_canary_is_rolled_back_on_error_rate(world: World) -> None:
    await world.start()
    taken = await drive(world, seconds=120, canary_errors=0.05)
    last = taken[-1]
    assert (last.action, last.reason) == (DecisionAction.ROLLBACK, "error_rate")
    assert last.canary is not None and last.canary.errors > 0
    assert last.statistics  # the test statistics behind it are stored
    route = world.route()
    assert (route.stable_version, route.canary_version, route.canary_weight_bp) == ("v1", "", 0)
    [stored] = world.store.list_rollouts("resnet")
    assert (stored.state, stored.canary_weight_bp) == (RolloutStatus.ROLLED_BACK, 0)
    assert "resnet" not in world.store.stable_versions()  # nothing promoted


async def test_faults_hidden_by_retries_still_count_against_the_canary(world: World) -> None:
    await world.start()
    taken = await drive(world, seconds=120, canary_failed_batches=0.05)
    last = taken[-1]
    assert (last.action, last.reason) == (DecisionAction.ROLLBACK, "error_rate")


async def test_a_slow_canary_is_rolled_back_on_latency(world: World) -> None:
    await world.start()
    taken = await drive(world, seconds=120, canary_median_s=0.075)
    last = taken[-1]
    assert last.action == DecisionAction.ROLLBACK
    assert last.reason in {"latency", "latency_rank"}  # whichever sequential test proves it
    assert last.canary is not None and last.baseline is not None
    assert last.canary.p95_s > 1.2 * last.baseline.p95_s


async def test_pre_rollout_traffic_is_never_judged(world: World) -> None:
    # A canary that failed everything before the rollout started must not be judged on it.
    for _ in range(500):
        world.evidence.record("resnet", "v2", K.REQUEST_OUTCOME_KIND_ERROR, 0.0)
    await world.start()
    taken = await drive(world, seconds=300)
    assert taken[-1].action == DecisionAction.PROMOTE


# -- operators --------------------------------------------------------------------------------


async def test_operator_promote_makes_the_canary_stable_at_once(world: World) -> None:
    await world.start()
    promoted = await world.manager.promote("resnet")
    assert (promoted.state, promoted.canary_weight_bp) == (RolloutStatus.PROMOTED, 10_000)
    last = world.decisions()[-1]
    assert (last.action, last.reason, last.from_percent, last.to_percent) == (
        DecisionAction.PROMOTE,
        "operator",
        10.0,
        100.0,
    )
    assert world.route().stable_version == "v2"
    assert world.store.stable_versions()["resnet"].source == StableSource.PROMOTION
    with pytest.raises(NoActiveRollout):
        await world.manager.promote("resnet")
    with pytest.raises(UnknownModel):
        await world.manager.abort("bert", "")


async def test_operator_abort_sends_traffic_back(world: World) -> None:
    await world.start()
    aborted = await world.manager.abort("resnet", "saw bad logs")
    assert (aborted.state, aborted.canary_weight_bp) == (RolloutStatus.ABORTED, 0)
    last = world.decisions()[-1]
    assert (last.action, last.reason) == (DecisionAction.ABORT, "operator")
    assert "saw bad logs" in last.detail
    route = world.route()
    assert (route.stable_version, route.canary_version) == ("v1", "")
    assert await world.manager.tick() == []  # nothing left to judge


async def test_a_failed_store_write_routes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.start()

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(world.store, "commit_decision", broken)
    taken = await drive(world, seconds=120, canary_errors=0.3)
    assert taken == []
    route = world.route()
    assert (route.canary_version, route.canary_weight_bp) == ("v2", 1000)
    assert world.store.list_rollouts()[0].state == RolloutStatus.PROGRESSING
    monkeypatch.undo()
    taken = await drive(world, seconds=120, canary_errors=0.3)
    assert taken[-1].action == DecisionAction.ROLLBACK


# -- restart ----------------------------------------------------------------------------------


async def test_a_restarted_controller_resumes_where_the_rollout_stood(tmp_path: Path) -> None:
    first = World(tmp_path / "c.sqlite")
    first.replica("a", "v1")
    first.replica("c", "v2")
    await first.start()
    taken = await drive(first, seconds=300, seed=3, until=DecisionAction.ADVANCE)
    assert taken[-1].action == DecisionAction.ADVANCE
    assert first.route().canary_weight_bp == 5000
    first.store.close()  # the process dies: nothing else is saved

    second = World(tmp_path / "c.sqlite", clock=ManualClock(5.0))  # a new monotonic timeline
    resumed = await second.manager.resume()
    assert [r.canary_weight_bp for r in resumed] == [5000]
    # Routed before any replica is back, so the first snapshot a gateway sees keeps the weight.
    route = second.route()
    assert (route.canary_version, route.canary_weight_bp) == ("v2", 5000)
    last = second.decisions()[-1]
    assert (last.action, last.reason) == (DecisionAction.HOLD, "resumed")
    second.replica("a", "v1")
    second.replica("c", "v2")
    taken = await drive(second, seconds=300)
    assert taken[-1].action == DecisionAction.PROMOTE
    assert second.route().stable_version == "v2"
    second.store.close()

    third = World(tmp_path / "c.sqlite")
    assert await third.manager.resume() == []
    # The configured stable is still v1, so the persisted promotion stands (reconciled at
    # open by controller.app, not by the manager).
    assert third.store.stable_versions()["resnet"].version == "v2"
    third.store.close()


async def test_a_rollout_whose_baseline_changed_is_aborted_on_resume(tmp_path: Path) -> None:
    first = World(tmp_path / "c.sqlite")
    first.replica("c", "v2")
    await first.start()
    first.store.close()
    second = World(tmp_path / "c.sqlite", stable={"resnet": "v0"})
    assert await second.manager.resume() == []
    last = second.decisions()[-1]
    assert (last.action, last.reason) == (DecisionAction.ABORT, "baseline_changed")
    assert second.store.list_rollouts()[0].state == RolloutStatus.ABORTED
    assert second.route().canary_version == ""
    second.store.close()
