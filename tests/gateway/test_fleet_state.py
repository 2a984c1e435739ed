"""The gateway's fleet view across a controller restart (ADR 0011): a warming-up controller's
snapshots are merged into what the gateway knew, not taken as the whole fleet."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.fleet_state import FleetState
from gateway.replicas import Change, Insert
from halcyon.v1 import control_pb2, fleet_pb2


def snapshot(
    *ids: str,
    generation: int = 1,
    warming_up: bool = False,
    routing: dict[str, str] | None = None,
    address: str = "h:1",
) -> control_pb2.WatchFleetResponse:
    routes = routing if routing is not None else {"m": "v1"}
    return control_pb2.WatchFleetResponse(
        generation=generation,
        warming_up=warming_up,
        replicas=[
            control_pb2.FleetMember(
                replica=fleet_pb2.ReplicaDescriptor(
                    replica_id=rid, address=f"{address}-{rid}", model="m", version="v1", slots=1
                )
            )
            for rid in ids
        ],
        routing=[control_pb2.ModelRouting(model=m, stable_version=v) for m, v in routes.items()],
    )


def test_an_authoritative_snapshot_replaces_the_fleet() -> None:
    fleet = FleetState()
    fleet.apply(snapshot("a", "b"), new_stream=True)
    diff = fleet.apply(snapshot("b", generation=2))
    assert [r.replica_id for r in diff.removed] == ["a"]
    assert set(fleet.replicas) == {"b"}


def test_a_restarted_controller_s_empty_first_snapshot_removes_nothing() -> None:
    fleet = FleetState()
    fleet.apply(snapshot("a", "b"), new_stream=True)
    # The controller restarts: a new stream, and it knows no one yet.
    diff = fleet.apply(snapshot(generation=7, warming_up=True, routing={}), new_stream=True)
    assert diff.removed == [] and not diff.splits_changed
    assert set(fleet.replicas) == {"a", "b"} and fleet.carried == {"a", "b"}
    assert fleet.splits["m"].stable_version == "v1"  # routing it has not restated is kept too
    # Workers re-register one by one: merged in, nothing lost meanwhile.
    fleet.apply(snapshot("a", generation=8, warming_up=True))
    assert set(fleet.replicas) == {"a", "b"} and fleet.carried == {"b"}
    # Warm-up over: the snapshot is the whole fleet again, and "b" never came back.
    diff = fleet.apply(snapshot("a", generation=9))
    assert [r.replica_id for r in diff.removed] == ["b"]
    assert set(fleet.replicas) == {"a"} and fleet.carried == set()


def test_a_replica_that_leaves_during_the_warm_up_is_removed_at_once() -> None:
    fleet = FleetState()
    fleet.apply(snapshot("a", "b"), new_stream=True)
    fleet.apply(snapshot("a", "b", generation=5, warming_up=True), new_stream=True)
    # The new controller listed "b", then "b" left: that is news, not a gap in its knowledge.
    diff = fleet.apply(snapshot("a", generation=6, warming_up=True))
    assert [r.replica_id for r in diff.removed] == ["b"]
    assert set(fleet.replicas) == {"a"}


def test_a_resubscription_forgets_what_the_previous_stream_listed() -> None:
    fleet = FleetState()
    fleet.apply(snapshot("a", "b", warming_up=True), new_stream=True)
    # Another restart before the warm-up ended: "b" was listed by the *previous* stream, so
    # its absence from the new controller's first snapshot is not a departure.
    fleet.apply(snapshot("a", generation=3, warming_up=True), new_stream=True)
    assert set(fleet.replicas) == {"a", "b"}


def test_a_carried_replica_that_re_registers_elsewhere_is_replaced() -> None:
    fleet = FleetState()
    fleet.apply(snapshot("a"), new_stream=True)
    diff = fleet.apply(snapshot("a", generation=2, warming_up=True, address="new"), new_stream=True)
    assert [r.address for r in diff.removed] == ["h:1-a"]
    assert [r.address for r in diff.added] == ["new-a"]


def test_a_snapshot_s_changes_reach_the_subscribers_departures_first() -> None:
    fleet = FleetState()
    heard: list[tuple[str, str, str]] = []

    def hear(change: Change) -> None:
        kind = "insert" if isinstance(change, Insert) else "remove"
        heard.append((kind, change.replica.replica_id, change.replica.address))

    fleet.replicas.subscribe(hear)
    fleet.apply(snapshot("a", "b"), new_stream=True)
    fleet.apply(snapshot("a", generation=2))  # "b" left
    fleet.apply(snapshot("a", generation=3))  # nothing changed: nothing heard
    fleet.apply(snapshot("a", generation=4, address="new"))  # moved: another replica
    assert heard == [
        ("insert", "a", "h:1-a"),
        ("insert", "b", "h:1-b"),
        ("remove", "b", "h:1-b"),
        ("remove", "a", "h:1-a"),
        ("insert", "a", "new-a"),
    ]
    assert fleet.replicas["a"].address == "new-a"


def test_warming_up_routing_is_merged_per_model() -> None:
    fleet = FleetState()
    fleet.apply(snapshot("a", routing={"m": "v1", "n": "v3"}), new_stream=True)
    fleet.apply(snapshot(routing={"m": "v2"}, warming_up=True, generation=2), new_stream=True)
    assert {m: s.stable_version for m, s in fleet.splits.items()} == {"m": "v2", "n": "v3"}
    fleet.apply(snapshot(routing={"m": "v2"}, generation=3))
    assert {m: s.stable_version for m, s in fleet.splits.items()} == {"m": "v2"}


@given(
    st.lists(
        st.tuples(
            st.sets(st.sampled_from("abcde")), st.booleans(), st.booleans()
        ),  # (listed, warming_up, new_stream)
        min_size=1,
        max_size=20,
    )
)
def test_only_an_established_snapshot_or_a_listed_departure_removes_a_replica(
    steps: list[tuple[set[str], bool, bool]],
) -> None:
    fleet = FleetState()
    on_stream: set[str] = set()
    for n, (listed, warming_up, new_stream) in enumerate(steps):
        before = set(fleet.replicas)
        if new_stream or n == 0:
            on_stream = set()
        diff = fleet.apply(
            snapshot(*sorted(listed), generation=n + 1, warming_up=warming_up),
            new_stream=new_stream or n == 0,
        )
        on_stream |= listed
        removed = {r.replica_id for r in diff.removed}
        assert listed <= set(fleet.replicas)
        if warming_up:
            assert removed == (before - listed) & on_stream
            assert set(fleet.replicas) == listed | (before - on_stream)
        else:
            assert set(fleet.replicas) == listed
