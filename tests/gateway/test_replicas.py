"""The owner of replica membership (gateway.replicas): whatever sequence of joins, new records,
drains and departures it is told, every consumer — the worker pool, and per (model, version)
the router and the batcher — holds exactly the owner's records, and nothing of its own that
could disagree with them."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.clock import ManualClock
from common.rng import SeededRng
from gateway.batching import BatcherConfig, DeadlineBatcher
from gateway.batching.fixed import BatchPolicy, FixedBatcher
from gateway.dispatcher import PendingRequest, VersionDispatcher
from gateway.replicas import Change, Insert, ReplicaInfo, Replicas, Subscriber
from gateway.routing import HedgePolicy, PeakEwmaRouter
from gateway.worker_pool import WorkerPool

GROUPS = (("m", "v1"), ("m", "v2"))
IDS = ("a", "b", "c", "d")


def record(
    rid: str, group: int = 0, slots: int = 1, draining: bool = False, port: int = 1
) -> ReplicaInfo:
    model, version = GROUPS[group]
    return ReplicaInfo(rid, f"{rid}:{port}", model, version, "cpu", slots, 1.0, draining)


def dispatcher(clock: ManualClock, version: str, pool: WorkerPool) -> VersionDispatcher:
    # One version on Halcyon's batcher, the other on the fixed baseline: both follow the owner.
    batcher: BatchPolicy[PendingRequest] = (
        DeadlineBatcher(clock, BatcherConfig()) if version == "v1" else FixedBatcher(clock)
    )
    return VersionDispatcher(
        "m",
        version,
        clock=clock,
        batcher=batcher,
        router=PeakEwmaRouter(SeededRng(1)),
        hedging=HedgePolicy(clock),
        pool=pool,
        fleet_metadata=(),
        on_batch=lambda *_: None,
        on_flush=lambda _reason: None,
        on_hedge=lambda _result: None,
        on_busy=lambda: None,
    )


def assert_agree(
    owner: Replicas, pool: WorkerPool, ds: dict[tuple[str, str], VersionDispatcher]
) -> None:
    now = 0.0
    # The pool: one channel per member, dialed for the owner's very record.
    assert pool.members().keys() == owner.keys()
    assert all(pool.members()[rid] is owner[rid] for rid in owner)
    for key, d in ds.items():
        members = [r for r in owner.values() if (r.model, r.version) == key]
        # The router: exactly the members of its version, in the order they joined, each
        # read from the owner's record (slots and draining included).
        assert d.replicas == [r.replica_id for r in members]
        assert all(d.router.member(r.replica_id) is r for r in members)
        views = {v.replica_id: v for v in d.router.views(now)}
        assert all(views[r.replica_id].slots == r.slots for r in members)
        assert all(views[r.replica_id].draining == r.draining for r in members)
        # The batcher: plans onto the members that do not drain, with their slots (nothing
        # is in flight here, so every slot is free).
        serving = [r for r in members if not r.draining]
        assert sorted(d.batcher.free_replicas()) == sorted(r.replica_id for r in serving)
        planned = d.batcher._replicas  # type: ignore[attr-defined]
        assert all(planned[r.replica_id].seat is r for r in serving)
        if isinstance(d.batcher, DeadlineBatcher):
            assert d.batcher._slots_total == sum(r.slots for r in serving)
        assert d.has_replicas == bool(members)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["insert", "drain", "undrain", "remove"]),
        st.sampled_from(IDS),
        st.integers(0, len(GROUPS) - 1),
        st.integers(1, 4),
        st.integers(1, 2),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_every_consumer_holds_the_owner_s_records(
    ops: list[tuple[str, str, int, int, int]],
) -> None:
    async def run() -> None:
        clock = ManualClock(0.0)
        owner = Replicas()
        pool = WorkerPool()
        ds = {key: dispatcher(clock, key[1], pool) for key in GROUPS}

        def to_dispatcher(change: Change) -> None:
            ds[(change.replica.model, change.replica.version)].changed(change)

        owner.subscribe(pool.changed)
        owner.subscribe(to_dispatcher)
        for op, rid, group, slots, port in ops:
            old = owner.get(rid)
            if op == "insert":
                new = record(rid, group, slots, old.draining if old else False, port)
                if old is not None and (old.model, old.version, old.address) != (
                    new.model,
                    new.version,
                    new.address,
                ):
                    owner.remove(rid)  # another identity: another replica (as FleetState does)
                owner.insert(new)
            elif op in ("drain", "undrain") and old is not None:
                owner.insert(
                    ReplicaInfo(
                        rid,
                        old.address,
                        old.model,
                        old.version,
                        old.hardware,
                        old.slots,
                        old.speed,
                        op == "drain",
                    )
                )
            elif op == "remove":
                owner.remove(rid)
            assert_agree(owner, pool, ds)
        await pool.close_all()

    asyncio.run(run())


def test_subscribers_hear_an_insert_in_order_and_a_remove_in_reverse() -> None:
    owner = Replicas()
    heard: list[tuple[str, str]] = []

    def listener(name: str) -> Subscriber:
        def hear(change: Change) -> None:
            heard.append((name, "insert" if isinstance(change, Insert) else "remove"))

        return hear

    owner.subscribe(listener("pool"))
    owner.subscribe(listener("dispatcher"))
    owner.insert(record("a"))
    owner.remove("a")
    owner.remove("a")  # not a member: nobody hears anything
    assert heard == [
        ("pool", "insert"),
        ("dispatcher", "insert"),
        ("dispatcher", "remove"),
        ("pool", "remove"),
    ]


def test_a_replica_that_changed_identity_must_leave_first() -> None:
    owner = Replicas()
    owner.insert(record("a"))
    with pytest.raises(ValueError, match="changed identity"):
        owner.insert(record("a", port=2))
    owner.remove("a")
    owner.insert(record("a", port=2))
    assert owner["a"].address == "a:2"
