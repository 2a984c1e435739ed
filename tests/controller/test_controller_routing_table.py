"""RoutingTable: configured stable versions, never registration order; canaries; generations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.routing_table import RoutingTable


def route(table: RoutingTable, registered: dict[str, set[str]], model: str) -> tuple[str, str, int]:
    r = table.resolve(registered).for_model(model)
    assert r is not None
    return r.stable_version, r.canary_version, r.canary_weight_bp


def test_configured_stable_wins_whatever_registered_first() -> None:
    table = RoutingTable({"resnet": "v1"})
    # v2 "registered first" means nothing: the input is a set, and config decides.
    assert route(table, {"resnet": {"v2", "v1"}}, "resnet") == ("v1", "", 0)
    assert route(table, {"resnet": {"v2"}}, "resnet") == ("v1", "", 0)


def test_configured_model_with_no_replicas_is_still_routed() -> None:
    res = RoutingTable({"bert": "v3"}).resolve({})
    assert [(r.model, r.stable_version) for r in res.routes] == [("bert", "v3")]


def test_single_registered_version_is_stable_when_nothing_configured() -> None:
    assert route(RoutingTable(), {"resnet": {"v1"}}, "resnet") == ("v1", "", 0)


def test_several_versions_and_none_configured_means_no_stable() -> None:
    res = RoutingTable().resolve({"resnet": {"v2", "v1"}, "bert": {"v1"}})
    resnet = res.for_model("resnet")
    assert resnet is not None and resnet.stable_version == ""
    assert res.unresolved == {"resnet": ("v1", "v2")}
    bert = res.for_model("bert")
    assert bert is not None and bert.stable_version == "v1"


@given(st.sets(st.sampled_from(["v1", "v2", "v3", "v4"]), min_size=2))
def test_no_guessing_among_several_versions(versions: set[str]) -> None:
    res = RoutingTable().resolve({"m": versions})
    r = res.for_model("m")
    assert r is not None and r.stable_version == ""
    assert set(res.unresolved["m"]) == versions


def test_canary_does_not_make_the_model_ambiguous() -> None:
    table = RoutingTable()
    table.set_canary("resnet", "v2", 100)
    assert route(table, {"resnet": {"v1", "v2"}}, "resnet") == ("v1", "v2", 100)


def test_canary_is_only_published_beside_a_stable_version() -> None:
    table = RoutingTable()
    table.set_canary("resnet", "v3", 500)
    assert route(table, {"resnet": {"v1", "v2", "v3"}}, "resnet") == ("", "", 0)


def test_set_canary_validates_and_bumps_generation_only_on_change() -> None:
    table = RoutingTable({"m": "v1"})
    g0 = table.generation
    table.set_canary("m", "v2", 100)
    assert table.generation == g0 + 1
    table.set_canary("m", "v2", 100)
    assert table.generation == g0 + 1
    table.set_canary("m", "v2", 500)
    assert table.generation == g0 + 2
    assert table.canary("m") is not None
    for bad in [("m", "v2", -1), ("m", "v2", 10_001), ("m", "", 5), ("m", "v1", 5), ("", "v2", 1)]:
        with pytest.raises(ValueError):
            table.set_canary(*bad)
    assert table.generation == g0 + 2
    table.clear_canary("m")
    assert table.canary("m") is None
    assert table.generation == g0 + 3
    table.clear_canary("m")
    assert table.generation == g0 + 3


def test_promotion_makes_canary_stable_and_clears_it() -> None:
    table = RoutingTable({"m": "v1"})
    table.set_canary("m", "v2", 5000)
    g = table.generation
    table.set_stable("m", "v2")
    assert table.generation == g + 1
    assert table.canary("m") is None
    assert route(table, {"m": {"v1", "v2"}}, "m") == ("v2", "", 0)
    table.set_stable("m", "v2")
    assert table.generation == g + 1


def test_empty_names_rejected() -> None:
    with pytest.raises(ValueError):
        RoutingTable({"m": ""})
    with pytest.raises(ValueError):
        RoutingTable().set_stable("", "v1")


def test_routes_are_sorted_and_cover_every_source() -> None:
    table = RoutingTable({"c": "v1"})
    table.set_canary("b", "v9", 0)
    res = table.resolve({"a": {"v1"}, "b": {"v1", "v9"}})
    assert [r.model for r in res.routes] == ["a", "b", "c"]
    b = res.for_model("b")
    assert b is not None and (b.stable_version, b.canary_version, b.canary_weight_bp) == (
        "v1",
        "v9",
        0,
    )
