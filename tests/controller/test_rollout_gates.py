"""The rollout gates in the shell (issue #20): pause / resume, approval, analysis-only — applied,
stored and re-armed after a restart. RolloutManager on an injected clock, a real SQLite store and
seeded traffic through the evidence tap; no sleeps, no servers."""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from common.clock import ManualClock
from controller.canary import ApprovalMode, Gates, JudgePolicy
from controller.convert import WallClock
from controller.fleet_view import FleetView
from controller.metrics import ControllerMetrics
from controller.registry import FleetRegistry
from controller.rollout_evidence import RolloutEvidence
from controller.rollouts import (
    AnalysisOnlyRollout,
    NoActiveRollout,
    NotAwaitingApproval,
    RolloutAlreadyPaused,
    RolloutManager,
    RolloutNotPaused,
    StartRequest,
    UnknownModel,
)
from controller.routing_table import RoutingTable
from controller.store import (
    ControllerStore,
    DecisionAction,
    DecisionRecord,
    RolloutRecord,
    RolloutStatus,
)
from halcyon.v1 import control_pb2, fleet_pb2

K = control_pb2.RequestOutcomeKind
WALL_START = 1_800_000_000.0
POLICY = JudgePolicy(window_s=5.0, min_requests=30, healthy_windows_to_advance=1)
A = DecisionAction


@dataclass
class World:
    """A manager wired as the controller wires it, on a manual clock."""

    path: Path
    clock: ManualClock = field(default_factory=lambda: ManualClock(100.0))

    def __post_init__(self) -> None:
        self.store = ControllerStore(self.path)
        self.registry = FleetRegistry(self.clock, lease_ttl_s=1e9)
        self.routing = RoutingTable({"resnet": "v1"})
        self.wall = WallClock(self.clock, wall_now=lambda: WALL_START + self.clock.now())
        self.view = FleetView(self.registry, self.routing, self.wall)
        self.evidence = RolloutEvidence()
        self.manager = RolloutManager(
            store=self.store,
            routing=self.routing,
            registry=self.registry,
            view=self.view,
            publish=lambda: None,
            evidence=self.evidence,
            metrics=ControllerMetrics(),
            clock=self.clock,
            wall=self.wall,
            configured_stable={"resnet": "v1"},
        )
        for rid, version in (("a", "v1"), ("c", "v2")):
            self.registry.register(
                fleet_pb2.ReplicaDescriptor(
                    replica_id=rid,
                    address=f"127.0.0.1:{7000 + zlib.crc32(rid.encode()) % 1000}",
                    model="resnet",
                    version=version,
                    hardware="a10g",
                    slots=1,
                    speed=1.0,
                )
            )

    async def start(self, **gates: object) -> RolloutRecord:
        return await self.manager.start_rollout(
            StartRequest(
                model="resnet",
                canary_version="v2",
                step_percents=(10.0, 50.0),
                policy=POLICY,
                gates=Gates(**gates),  # type: ignore[arg-type]
            )
        )

    def weight(self) -> int:
        route = self.view.resolution().for_model("resnet")
        assert route is not None
        return route.canary_weight_bp if route.canary_version else 0

    def stored(self) -> RolloutRecord:
        return self.store.list_rollouts("resnet")[-1]

    def decisions(self) -> list[DecisionRecord]:
        return self.store.list_decisions("resnet", limit=1000)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path / "c.sqlite")
    yield w
    w.store.close()


async def drive(
    world: World,
    seconds: float,
    *,
    canary_errors: float = 0.0,
    seed: int = 7,
    until: tuple[DecisionAction, str] | None = None,
) -> list[DecisionRecord]:
    """Seeded traffic (200 req/s split by the routed weight), one tick per simulated second;
    stops when the rollout ends or at the first decision matching ``until`` (action, reason)."""
    rng = np.random.default_rng(seed)
    taken: list[DecisionRecord] = []
    for _ in range(int(seconds)):
        active = world.manager.active("resnet")
        if active is None:
            break
        share = active.canary_weight_bp / 10_000
        for version, n, errors in (
            ("v1", rng.poisson(200 * (1 - share)), 0.0),
            ("v2", rng.poisson(200 * share), canary_errors),
        ):
            for _ in range(int(n)):
                if rng.random() < errors:
                    world.evidence.record("resnet", version, K.REQUEST_OUTCOME_KIND_ERROR, 0.0)
                else:
                    latency = float(0.05 * np.exp(rng.normal(0.0, 0.3)))
                    world.evidence.record("resnet", version, K.REQUEST_OUTCOME_KIND_OK, latency)
        world.clock.advance(1.0)
        taken += await world.manager.tick()
        if until is not None and any((d.action, d.reason) == until for d in taken):
            break
    return taken


def trail(decisions: list[DecisionRecord]) -> list[tuple[str, str]]:
    return [(str(d.action), d.reason) for d in decisions]


# -- pause / resume ---------------------------------------------------------------------------


async def test_a_paused_rollout_holds_its_weight_and_keeps_judging(world: World) -> None:
    await world.start()
    paused = await world.manager.pause("resnet", why="change freeze")
    assert (paused.paused, paused.auto_rollback, paused.canary_weight_bp) == (True, True, 1000)
    last = world.decisions()[-1]
    assert (last.action, last.reason, last.from_percent, last.to_percent) == (
        A.HOLD,
        "paused",
        10.0,
        10.0,
    )
    assert "change freeze" in last.detail and last.applied
    assert world.stored().paused  # durable at once

    taken = await drive(world, 60)
    assert taken, "judging continues while paused"
    assert A.ADVANCE not in [d.action for d in taken] and world.weight() == 1000
    assert ("hold", "paused") in trail(taken)  # a healthy step, held
    with pytest.raises(RolloutAlreadyPaused, match="already paused"):
        await world.manager.pause("resnet")

    resumed = await world.manager.resume_rollout("resnet")
    assert not resumed.paused and not world.stored().paused
    assert trail(world.decisions()[-1:]) == [("hold", "resumed")]
    with pytest.raises(RolloutNotPaused, match="not paused"):
        await world.manager.resume_rollout("resnet")
    taken = await drive(world, 300)
    assert [d.action for d in taken if d.action != A.HOLD] == [A.ADVANCE, A.PROMOTE]
    assert world.stored().state is RolloutStatus.PROMOTED


async def test_pause_resume_and_approve_need_a_running_rollout(world: World) -> None:
    for action in (
        world.manager.pause("resnet"),
        world.manager.resume_rollout("resnet"),
        world.manager.approve("resnet"),
    ):
        with pytest.raises(NoActiveRollout):
            await action
    with pytest.raises(UnknownModel):
        await world.manager.pause("bert")


async def test_a_regression_still_rolls_back_while_paused(world: World) -> None:
    await world.start()
    await world.manager.pause("resnet")
    taken = await drive(world, 120, canary_errors=0.1)
    assert (taken[-1].action, taken[-1].reason) == (A.ROLLBACK, "error_rate")
    assert (world.stored().state, world.weight()) == (RolloutStatus.ROLLED_BACK, 0)


async def test_with_auto_rollback_off_a_regression_is_held_for_the_operator(world: World) -> None:
    await world.start()
    paused = await world.manager.pause("resnet", auto_rollback=False)
    assert (paused.paused, paused.auto_rollback) == (True, False)
    assert "auto-rollback is off" in world.decisions()[-1].detail
    taken = await drive(world, 120, canary_errors=0.1)
    assert A.ROLLBACK not in [d.action for d in taken]
    assert trail(taken).count(("hold", "rollback_held")) == 1  # held once, not every tick
    assert (world.stored().state, world.weight()) == (RolloutStatus.PROGRESSING, 1000)
    await world.manager.abort("resnet", "regression seen while paused")
    assert (world.stored().state, world.weight()) == (RolloutStatus.ABORTED, 0)


# -- approval ---------------------------------------------------------------------------------


async def test_promotion_waits_for_an_approval(world: World) -> None:
    started = await world.start(approval=ApprovalMode.PROMOTION)
    assert started.approval == "promotion"
    assert "approve" in world.decisions()[0].detail
    with pytest.raises(NotAwaitingApproval, match="not awaiting approval"):
        await world.manager.approve("resnet")
    taken = await drive(world, 300, until=(A.HOLD, "awaiting_approval"))
    assert [d.action for d in taken if d.action != A.HOLD] == [A.ADVANCE]  # steps need none
    assert world.stored().awaiting_approval and world.weight() == 5000
    waited = await drive(world, 60)
    assert all(d.action == A.HOLD for d in waited)  # waits, and says so only once
    assert trail(waited).count(("hold", "awaiting_approval")) == 0

    record, decision = await world.manager.approve("resnet")
    assert (decision.action, decision.reason, decision.applied) == (A.PROMOTE, "approved", True)
    assert (record.state, record.awaiting_approval) == (RolloutStatus.PROMOTED, False)
    assert world.view.resolution().for_model("resnet").stable_version == "v2"  # type: ignore[union-attr]
    assert world.decisions()[-1] == decision
    with pytest.raises(NoActiveRollout):
        await world.manager.approve("resnet")


async def test_every_step_waits_for_an_approval(world: World) -> None:
    await world.start(approval=ApprovalMode.EVERY_STEP)
    await drive(world, 300, until=(A.HOLD, "awaiting_approval"))
    assert world.weight() == 1000 and world.stored().awaiting_approval
    record, decision = await world.manager.approve("resnet")
    assert (decision.action, decision.to_percent) == (A.ADVANCE, 50.0)
    assert (record.step_index, record.canary_weight_bp, record.awaiting_approval) == (
        1,
        5000,
        False,
    )
    assert world.weight() == 5000
    await drive(world, 300, until=(A.HOLD, "awaiting_approval"))
    _, decision = await world.manager.approve("resnet")
    assert decision.action == A.PROMOTE


# -- analysis only ----------------------------------------------------------------------------


async def test_analysis_only_records_every_move_and_routes_none(world: World) -> None:
    started = await world.start(analysis_only=True)
    assert started.analysis_only and started.canary_weight_bp == 1000
    assert "analysis only" in world.decisions()[0].detail
    with pytest.raises(AnalysisOnlyRollout, match="analysis-only"):
        await world.manager.promote("resnet")
    taken = await drive(world, 300)
    moves = [d for d in taken if d.action != A.HOLD]
    assert [(d.action, d.applied) for d in moves] == [(A.ADVANCE, False), (A.PROMOTE, False)]
    assert all(d.applied for d in taken if d.action == A.HOLD)
    stored = world.stored()
    assert (stored.state, stored.canary_weight_bp) == (RolloutStatus.ANALYZED, 0)
    route = world.view.resolution().for_model("resnet")
    assert route is not None and (route.stable_version, route.canary_version) == ("v1", "")
    assert "resnet" not in world.store.stable_versions()  # never made stable


async def test_analysis_only_weight_stays_at_the_first_step(world: World) -> None:
    await world.start(analysis_only=True)
    taken = await drive(world, 300, until=(A.ADVANCE, "healthy"))
    assert not taken[-1].applied and taken[-1].to_percent == 50.0  # the judge's own step
    assert (world.stored().step_index, world.weight()) == (1, 1000)  # what is routed


async def test_an_analysis_only_rollback_ends_analyzed(world: World) -> None:
    await world.start(analysis_only=True)
    taken = await drive(world, 120, canary_errors=0.1)
    assert (taken[-1].action, taken[-1].applied) == (A.ROLLBACK, False)
    assert (world.stored().state, world.weight()) == (RolloutStatus.ANALYZED, 0)


# -- a restart --------------------------------------------------------------------------------


async def test_a_paused_rollout_is_still_paused_after_a_restart(tmp_path: Path) -> None:
    first = World(tmp_path / "c.sqlite")
    await first.start()
    await first.manager.pause("resnet", auto_rollback=False)
    first.store.close()

    second = World(tmp_path / "c.sqlite", clock=ManualClock(5.0))
    [resumed] = await second.manager.resume()
    assert (resumed.paused, resumed.auto_rollback, resumed.resumes_in_step) == (True, False, 1)
    last = second.decisions()[-1]
    assert (last.action, last.reason) == (A.HOLD, "resumed")
    assert "still paused (auto-rollback off)" in last.detail
    assert second.stored().resumes_in_step == 1
    taken = await drive(second, 60)
    assert A.ADVANCE not in [d.action for d in taken] and second.weight() == 1000
    with pytest.raises(RolloutAlreadyPaused):
        await second.manager.pause("resnet")
    await second.manager.resume_rollout("resnet")
    taken = await drive(second, 300, until=(A.ADVANCE, "healthy"))
    assert second.stored().resumes_in_step == 0  # a new step: its budget is untouched
    second.store.close()


async def test_an_approval_still_waits_after_a_restart(tmp_path: Path) -> None:
    first = World(tmp_path / "c.sqlite")
    await first.start(approval=ApprovalMode.EVERY_STEP)
    await drive(first, 300, until=(A.HOLD, "awaiting_approval"))
    first.store.close()

    second = World(tmp_path / "c.sqlite", clock=ManualClock(5.0))
    [resumed] = await second.manager.resume()
    assert resumed.awaiting_approval and resumed.approval == "every_step"
    assert "still awaiting approval" in second.decisions()[-1].detail
    second.store.close()

    third = World(tmp_path / "c.sqlite", clock=ManualClock(9.0))  # a second restart
    [again] = await third.manager.resume()
    assert (again.awaiting_approval, again.resumes_in_step) == (True, 2)
    assert all(d.action == A.HOLD for d in await drive(third, 30))
    record, decision = await third.manager.approve("resnet")
    assert (decision.action, decision.reason) == (A.ADVANCE, "approved")
    assert (record.step_index, record.resumes_in_step, record.awaiting_approval) == (1, 0, False)
    assert third.stored() == record
    third.store.close()


# -- the store --------------------------------------------------------------------------------


def test_a_store_from_before_the_gates_reads_as_ungated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with ControllerStore(path, target_version=3) as old:
        old_columns = {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(rollouts)")}
        assert "paused" not in old_columns
        old._db.execute(
            "INSERT INTO rollouts (model, baseline_version, canary_version, step_percents, "
            "step_index, canary_weight_bp, state, policy, started_at, updated_at) VALUES "
            "('resnet', 'v1', 'v2', '[10.0, 50.0]', 0, 1000, 'progressing', '{}', 1.0, 1.0)"
        )
        old._db.execute(
            "INSERT INTO rollout_decisions (rollout_id, model, action, reason, from_percent, "
            "to_percent, decided_at) VALUES (1, 'resnet', 'start', 'started', 0, 10, 1.0)"
        )
    with ControllerStore(path) as store:
        [rollout] = store.list_rollouts()
        assert (rollout.paused, rollout.auto_rollback, rollout.approval) == (False, True, "none")
        assert (rollout.awaiting_approval, rollout.analysis_only, rollout.resumes_in_step) == (
            False,
            False,
            0,
        )
        [decision] = store.list_decisions()
        assert decision.applied
