"""FleetRegistry: membership by lease, sessions, and the generation gateways follow."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from common.clock import ManualClock
from controller.registry import (
    FleetRegistry,
    InvalidDescriptor,
    LeaseExpired,
    ReplicaIdInUse,
    UnknownMember,
    validate_descriptor,
)
from halcyon.v1 import fleet_pb2

TTL = 1.0


def desc(replica_id: str = "r1", **kw: object) -> fleet_pb2.ReplicaDescriptor:
    fields: dict[str, object] = {
        "replica_id": replica_id,
        "address": f"127.0.0.1:{5000 + len(replica_id)}",
        "model": "resnet",
        "version": "v1",
        "hardware": "a10g",
        "slots": 2,
        "speed": 1.0,
    }
    fields.update(kw)
    return fleet_pb2.ReplicaDescriptor(**fields)  # type: ignore[arg-type]


def load(busy: int = 0, draining: bool = False) -> fleet_pb2.ReplicaLoad:
    return fleet_pb2.ReplicaLoad(busy_slots=busy, draining=draining)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def reg(clock: ManualClock) -> FleetRegistry:
    return FleetRegistry(clock, TTL)


def test_register_then_heartbeat_renews_lease(clock: ManualClock, reg: FleetRegistry) -> None:
    member, replaced = reg.register(desc())
    assert replaced is None
    assert member.lease_expires_at == pytest.approx(101.0)
    assert [m.replica_id for m in reg.members()] == ["r1"]
    clock.advance(0.9)
    renewed = reg.heartbeat("r1", load(busy=1), member.session)
    assert renewed.lease_expires_at == pytest.approx(101.9)
    assert renewed.load.busy_slots == 1
    clock.advance(0.9)  # 101.8: past the first lease, within the renewed one
    assert reg.expire() == []
    assert len(reg) == 1


def test_lease_lapses_without_heartbeat(clock: ManualClock, reg: FleetRegistry) -> None:
    reg.register(desc("a"))
    clock.advance(0.5)
    reg.register(desc("b"))
    clock.advance(0.5)  # a's lease ends exactly now: lapsed (expiry is "at or before now")
    assert [m.replica_id for m in reg.expire()] == ["a"]
    assert [m.replica_id for m in reg.members()] == ["b"]


def test_heartbeat_after_lapse_expires_instead_of_reviving(
    clock: ManualClock, reg: FleetRegistry
) -> None:
    member, _ = reg.register(desc())
    clock.advance(TTL + 0.01)
    gen = reg.generation
    with pytest.raises(LeaseExpired) as info:
        reg.heartbeat("r1", load(), member.session)
    assert info.value.member.replica_id == "r1"
    assert reg.members() == []
    assert reg.generation > gen
    with pytest.raises(UnknownMember):
        reg.heartbeat("r1", load(), member.session)


def test_a_live_replica_id_cannot_be_taken_over(clock: ManualClock, reg: FleetRegistry) -> None:
    live, _ = reg.register(desc(address="10.0.0.1:1"))
    clock.advance(0.4)
    gen = reg.generation
    with pytest.raises(ReplicaIdInUse) as info:
        reg.register(desc(address="127.0.0.1:1"))  # a rogue (or a twin) with the same id
    assert info.value.member == live
    assert info.value.retry_after_s == pytest.approx(0.6)  # what the live lease has left
    assert [m.descriptor.address for m in reg.members()] == ["10.0.0.1:1"]
    assert reg.generation == gen  # nothing gateways must see
    # Renewed by its heartbeats, the live session keeps its id for as long as it lives.
    reg.heartbeat("r1", load(), live.session)
    clock.advance(0.9)
    with pytest.raises(ReplicaIdInUse):
        reg.register(desc(address="127.0.0.1:1"))


def test_the_id_frees_when_the_session_ends(reg: FleetRegistry) -> None:
    old, _ = reg.register(desc(address="10.0.0.1:1"))
    assert reg.remove("r1", old.session) == old  # its stream ended
    new, lapsed = reg.register(desc(address="10.0.0.2:2"))
    assert lapsed is None and new.session != old.session


def test_the_id_frees_when_the_lease_lapses_and_the_old_session_cannot_touch_the_new(
    clock: ManualClock, reg: FleetRegistry
) -> None:
    old, _ = reg.register(desc(address="10.0.0.1:1"))
    clock.advance(TTL)  # lapsed, not yet swept
    new, lapsed = reg.register(desc(address="10.0.0.2:2"))
    assert lapsed == old
    assert new.session != old.session
    assert [m.descriptor.address for m in reg.members()] == ["10.0.0.2:2"]
    with pytest.raises(UnknownMember):
        reg.heartbeat("r1", load(), old.session)
    assert reg.remove("r1", old.session) is None  # the old stream closing late
    assert len(reg) == 1
    assert reg.remove("r1", new.session) == new
    assert len(reg) == 0


def test_registered_descriptor_is_a_copy(reg: FleetRegistry) -> None:
    d = desc()
    reg.register(d)
    d.address = "evil:1"
    assert reg.members()[0].descriptor.address != "evil:1"


@pytest.mark.parametrize(
    ("field", "override"),
    [
        ("replica_id", {"replica_id": ""}),
        ("replica_id", {"replica_id": "   "}),
        ("address", {"address": ""}),
        ("address", {"address": "host :1"}),
        ("model", {"model": ""}),
        ("version", {"version": ""}),
        ("slots", {"slots": 0}),
        ("speed", {"speed": 0.0}),
        ("speed", {"speed": float("nan")}),
    ],
)
def test_invalid_registrations_name_the_field(
    reg: FleetRegistry, field: str, override: dict[str, object]
) -> None:
    d = desc()
    for k, v in override.items():
        setattr(d, k, v)
    with pytest.raises(InvalidDescriptor) as info:
        reg.register(d)
    assert info.value.field == field
    assert len(reg) == 0
    assert reg.generation == 0


def test_valid_descriptor_passes() -> None:
    validate_descriptor(desc())


def test_generation_follows_draining_not_busy_slots(reg: FleetRegistry) -> None:
    reg.register(desc())
    gen = reg.generation
    reg.heartbeat("r1", load(busy=2))
    reg.heartbeat("r1", load(busy=0))
    assert reg.generation == gen  # counters ride along, no snapshot push
    reg.heartbeat("r1", load(draining=True))
    assert reg.generation == gen + 1
    assert reg.members()[0].draining


def test_operator_drain_is_sticky_until_reregistration(reg: FleetRegistry) -> None:
    reg.register(desc())
    gen = reg.generation
    reg.request_drain("r1")
    assert reg.generation == gen + 1
    reg.heartbeat("r1", load(draining=False))  # the worker has not seen the command yet
    assert reg.members()[0].draining
    assert reg.members()[0].effective_load().draining
    assert reg.generation == gen + 1
    reg.request_drain("r1")
    assert reg.generation == gen + 1
    member = reg.members()[0]
    reg.remove("r1", member.session)  # its session ended; it registers again
    reg.register(desc())
    assert not reg.members()[0].draining
    with pytest.raises(UnknownMember):
        reg.request_drain("nobody")


def test_undrain_waits_for_the_worker_to_say_it_takes_work(reg: FleetRegistry) -> None:
    reg.register(desc())
    reg.request_drain("r1")
    reg.heartbeat("r1", load(draining=True))  # the worker drained
    gen = reg.generation
    reg.cancel_drain("r1")
    # Still draining as gateways see it: the worker has not heard the undrain yet.
    assert reg.members()[0].draining and not reg.members()[0].drain_requested
    assert reg.generation == gen
    reg.heartbeat("r1", load(draining=False))
    assert not reg.members()[0].draining
    assert reg.generation == gen + 1
    reg.cancel_drain("r1")  # nothing to withdraw: no change
    assert reg.generation == gen + 1
    with pytest.raises(UnknownMember):
        reg.cancel_drain("nobody")


def test_undrain_of_a_drain_the_worker_never_saw_readmits_at_once(reg: FleetRegistry) -> None:
    reg.register(desc())
    gen = reg.generation
    reg.request_drain("r1")
    reg.cancel_drain("r1")
    assert not reg.members()[0].draining
    assert reg.generation == gen + 2


def test_versions_by_model(reg: FleetRegistry) -> None:
    reg.register(desc("a", version="v1"))
    reg.register(desc("b", version="v2"))
    reg.register(desc("c", model="bert", version="v7"))
    assert reg.versions_by_model() == {"resnet": {"v1", "v2"}, "bert": {"v7"}}


def test_rejects_bad_ttl(clock: ManualClock) -> None:
    with pytest.raises(ValueError):
        FleetRegistry(clock, 0.0)


IDS = st.sampled_from(["a", "b", "c"])


class RegistryMachine(RuleBasedStateMachine):
    """The registry against a model: lease expiry times per id, and a gateway-visible view."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(0.0)
        self.reg = FleetRegistry(self.clock, TTL)
        self.model: dict[str, float] = {}  # id -> lease expiry
        self.last_view = self.view()
        self.last_gen = self.reg.generation

    def view(self) -> dict[str, tuple[int, bool]]:
        return {m.replica_id: (m.session, m.draining) for m in self.reg.members()}

    @rule(replica_id=IDS)
    def register(self, replica_id: str) -> None:
        now = self.clock.now()
        expiry = self.model.get(replica_id)
        if expiry is not None and expiry > now:  # a live session holds the id
            with pytest.raises(ReplicaIdInUse) as info:
                self.reg.register(desc(replica_id))
            assert info.value.retry_after_s == pytest.approx(expiry - now)
            return
        self.reg.register(desc(replica_id))
        self.model[replica_id] = now + TTL

    @rule(replica_id=IDS, draining=st.booleans(), busy=st.integers(0, 3))
    def heartbeat(self, replica_id: str, draining: bool, busy: int) -> None:
        expiry = self.model.get(replica_id)
        if expiry is None:
            with pytest.raises(UnknownMember):
                self.reg.heartbeat(replica_id, load(busy, draining))
        elif expiry <= self.clock.now():
            with pytest.raises(LeaseExpired):
                self.reg.heartbeat(replica_id, load(busy, draining))
            del self.model[replica_id]
        else:
            self.reg.heartbeat(replica_id, load(busy, draining))
            self.model[replica_id] = self.clock.now() + TTL

    @rule(replica_id=IDS)
    def remove(self, replica_id: str) -> None:
        removed = self.reg.remove(replica_id)
        assert (removed is not None) == (replica_id in self.model)
        self.model.pop(replica_id, None)

    @rule(replica_id=IDS)
    def drain(self, replica_id: str) -> None:
        if replica_id in self.model:
            self.reg.request_drain(replica_id)
        else:
            with pytest.raises(UnknownMember):
                self.reg.request_drain(replica_id)

    @rule(replica_id=IDS)
    def undrain(self, replica_id: str) -> None:
        if replica_id in self.model:
            self.reg.cancel_drain(replica_id)
        else:
            with pytest.raises(UnknownMember):
                self.reg.cancel_drain(replica_id)

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 0.99, 1.0, 2.5]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def expire(self) -> None:
        now = self.clock.now()
        gone = {m.replica_id for m in self.reg.expire(now)}
        assert gone == {r for r, e in self.model.items() if e <= now}
        self.model = {r: e for r, e in self.model.items() if e > now}
        # After a sweep: present iff the lease is fresh and the member was not removed.
        assert all(m.lease_expires_at > now for m in self.reg.members())

    @invariant()
    def members_match_model(self) -> None:
        assert {m.replica_id for m in self.reg.members()} == set(self.model)

    @invariant()
    def generation_moves_exactly_with_the_view(self) -> None:
        view, gen = self.view(), self.reg.generation
        assert gen >= self.last_gen
        if view != self.last_view:
            assert gen > self.last_gen, "a visible change without a new generation"
        else:
            assert gen == self.last_gen, "a new generation without a visible change"
        self.last_view, self.last_gen = view, gen


TestRegistryMachine = RegistryMachine.TestCase
TestRegistryMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def _warm(*samples: tuple[int, int, int, int, int]) -> fleet_pb2.ReplicaDescriptor:
    """A descriptor with warm-up samples (items, tokens, longest, seconds, nanos)."""
    d = desc(runtime="simulated")
    for items, tokens, longest, seconds, nanos in samples:
        d.warmup.add(
            items=items,
            batch_tokens=tokens,
            longest_output_tokens=longest,
            device_time=duration_pb2.Duration(seconds=seconds, nanos=nanos),
        )
    return d


def test_warm_up_samples_are_accepted_and_stored_whole(reg: FleetRegistry) -> None:
    d = _warm((1, 16, 8, 5, 0), (8, 2048, 224, 5, 12_000_000), (1, 1, 0, 3600, 0))
    validate_descriptor(d)
    member, _ = reg.register(d)
    assert member.descriptor.runtime == "simulated"
    assert list(member.descriptor.warmup) == list(d.warmup)  # relayed to gateways as sent


@pytest.mark.parametrize(
    ("field", "descriptor"),
    [
        ("warmup", _warm(*[(1, 16, 8, 0, 1000)] * 9)),
        ("warmup[0].items", _warm((0, 16, 8, 1, 0))),
        ("warmup[1].device_time", _warm((1, 16, 8, 1, 0), (1, 16, 8, -1, 0))),
        ("warmup[0].device_time", _warm((1, 16, 8, 0, -5))),
        ("warmup[0].device_time", _warm((1, 16, 8, 3601, 0))),
        ("warmup[0].device_time", _warm((1, 16, 8, 3600, 1))),
        ("warmup[0].device_time", _warm((1, 16, 8, 0, 1_000_000_000))),
        ("warmup[0].longest_output_tokens", _warm((1, 16, 17, 1, 0))),
        ("runtime", desc(runtime="sim ulated")),
        ("runtime", desc(runtime="x" * 33)),
    ],
)
def test_invalid_warm_up_names_the_field(
    reg: FleetRegistry, field: str, descriptor: fleet_pb2.ReplicaDescriptor
) -> None:
    with pytest.raises(InvalidDescriptor) as info:
        reg.register(descriptor)
    assert info.value.field == field
    assert len(reg) == 0


def test_a_missing_device_time_is_refused() -> None:
    d = desc()
    d.warmup.add(items=1, batch_tokens=16, longest_output_tokens=8)
    with pytest.raises(InvalidDescriptor) as info:
        validate_descriptor(d)
    assert info.value.field == "warmup[0].device_time"
