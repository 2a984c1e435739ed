"""FleetView numbering and ChangeFeed fan-out (one-slot mailboxes, no queues)."""

from __future__ import annotations

import asyncio

from common.clock import ManualClock
from controller.convert import WallClock
from controller.feed import ChangeFeed
from controller.fleet_view import FleetView
from controller.registry import FleetRegistry
from controller.routing_table import RoutingTable
from halcyon.v1 import fleet_pb2


def make() -> tuple[FleetRegistry, RoutingTable, FleetView]:
    clock = ManualClock(10.0)
    registry = FleetRegistry(clock, 3.0)
    routing = RoutingTable({"m": "v1"})
    view = FleetView(registry, routing, WallClock(clock, wall_now=lambda: 1_000.0), epoch=500)
    return registry, routing, view


def desc(replica_id: str) -> fleet_pb2.ReplicaDescriptor:
    return fleet_pb2.ReplicaDescriptor(
        replica_id=replica_id, address="h:1", model="m", version="v1", slots=1, speed=1.0
    )


def test_generation_starts_at_epoch_and_moves_on_either_source() -> None:
    registry, routing, view = make()
    first = view.snapshot()
    assert first.generation == view.generation == 500
    assert view.snapshot() is first  # built once per generation, shared by subscribers
    registry.register(desc("a"))
    assert view.generation == 501
    routing.set_canary("m", "v2", 100)
    snap = view.snapshot()
    assert snap.generation == 502
    assert [r.canary_weight_bp for r in snap.routing] == [100]
    assert [m.replica.replica_id for m in snap.replicas] == ["a"]
    # Wall time = reading + (1000 - 10): registered at reading 10 -> 1000 s after the epoch.
    assert snap.replicas[0].registered_at.seconds == 1_000
    registry.heartbeat("a", fleet_pb2.ReplicaLoad(busy_slots=1))
    assert view.generation == 502  # nothing gateways must see


def test_burst_of_changes_is_one_new_generation_for_a_late_reader() -> None:
    registry, _, view = make()
    g = view.generation
    for i in range(10):
        registry.register(desc(f"r{i}"))
    assert view.generation == g + 1
    assert len(view.snapshot().replicas) == 10


async def test_feed_coalesces_and_never_queues() -> None:
    feed = ChangeFeed()
    fast, slow = feed.subscribe(), feed.subscribe()
    for _ in range(1000):
        feed.publish()
    assert await fast.wait() is True
    # One wake-up for the whole burst: nothing is pending afterwards.
    pending = asyncio.ensure_future(fast.wait())
    await asyncio.sleep(0)
    assert not pending.done()
    feed.publish()
    assert await asyncio.wait_for(pending, 1.0) is True
    assert await slow.wait() is True  # the slow one was never behind by more than one flag
    slow.close()
    assert len(feed) == 1
    feed.close()
    assert await fast.wait() is False
    assert await feed.subscribe().wait() is False


def test_warm_up_is_in_every_snapshot_until_its_time_and_its_end_is_a_new_generation() -> None:
    clock = ManualClock(10.0)
    registry = FleetRegistry(clock, 3.0)
    view = FleetView(
        registry,
        RoutingTable({"m": "v1"}),
        WallClock(clock, wall_now=lambda: 1_000.0),
        epoch=500,
        warm_up_until=13.0,
    )
    assert view.warming_up and view.snapshot().warming_up
    assert view.warm_up_remaining(clock.now()) == 3.0
    registry.register(desc("a"))
    assert view.snapshot().warming_up and view.generation == 501
    clock.advance(2.9)
    assert not view.end_warm_up(clock.now())  # not yet
    clock.advance(0.1)
    assert view.end_warm_up(clock.now())
    snap = view.snapshot()
    assert not snap.warming_up and snap.generation == 502
    assert [m.replica.replica_id for m in snap.replicas] == ["a"]
    assert not view.end_warm_up(clock.now())  # once
    assert view.warm_up_remaining(clock.now()) == 0.0


def test_without_warm_up_snapshots_are_the_whole_fleet_from_the_start() -> None:
    _, _, view = make()
    assert not view.warming_up and not view.snapshot().warming_up
