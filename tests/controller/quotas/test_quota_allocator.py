"""The quota allocator: max-min fair on demand, equal headroom, burst in proportion."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.quotas import allocate

EPS = 1e-9

demand = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
demands = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), demand, max_size=12)
capacity = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)


def tol(scale: float) -> float:
    return EPS * max(1.0, scale)


@given(capacity, demands, st.floats(min_value=0.0, max_value=1e4))
def test_shares_never_add_up_to_more_than_the_capacity_or_the_burst(
    cap: float, asked: dict[str, float], burst: float
) -> None:
    shares = allocate(cap, asked, burst)
    assert set(shares) == set(asked)
    assert math.fsum(s.rate for s in shares.values()) <= cap + tol(cap)
    assert math.fsum(s.burst for s in shares.values()) <= burst + tol(burst)


@given(capacity, demands)
def test_no_gateway_gets_more_than_it_asked_plus_the_common_headroom(
    cap: float, asked: dict[str, float]
) -> None:
    shares = allocate(cap, asked)
    headrooms = {s.headroom for s in shares.values()}
    assert len(headrooms) <= 1
    for gateway, share in shares.items():
        assert share.fair <= asked[gateway] + tol(asked[gateway])
        assert share.rate == pytest.approx(share.fair + share.headroom)
        assert share.rate <= asked[gateway] + share.headroom + tol(cap)


@given(capacity, demands)
def test_the_fair_part_is_max_min_fair(cap: float, asked: dict[str, float]) -> None:
    """A gateway cut below its demand holds the largest fair share: raising any smaller one
    would need taking from one that is smaller or equal."""
    shares = allocate(cap, asked)
    largest = max((s.fair for s in shares.values()), default=0.0)
    for gateway, share in shares.items():
        if share.fair < asked[gateway] - tol(cap):
            assert share.fair >= largest - tol(cap)
    if math.fsum(asked.values()) > cap:
        # Contended: the whole capacity is handed out, none of it as headroom.
        assert math.fsum(s.fair for s in shares.values()) == pytest.approx(cap, abs=tol(cap))
        assert all(s.headroom == 0.0 for s in shares.values())


@given(capacity, demands)
def test_demand_below_capacity_is_granted_in_full_and_the_rest_spread_equally(
    cap: float, asked: dict[str, float]
) -> None:
    if math.fsum(asked.values()) > cap or not asked:
        return
    shares = allocate(cap, asked)
    for gateway, share in shares.items():
        assert share.fair == asked[gateway]
    assert math.fsum(s.rate for s in shares.values()) == pytest.approx(cap, abs=tol(cap))


def test_water_filling_by_hand() -> None:
    shares = allocate(100.0, {"a": 10.0, "b": 50.0, "c": 80.0}, burst=200.0)
    assert shares["a"].rate == pytest.approx(10.0)
    assert shares["b"].rate == pytest.approx(45.0)
    assert shares["c"].rate == pytest.approx(45.0)
    assert shares["c"].burst == pytest.approx(90.0)


def test_an_idle_gateway_gets_headroom_when_there_is_some() -> None:
    shares = allocate(100.0, {"busy": 60.0, "idle": 0.0})
    assert shares["busy"].rate == pytest.approx(80.0)
    assert shares["idle"].rate == pytest.approx(20.0)
    assert shares["idle"].headroom == pytest.approx(20.0)


def test_a_zero_contract_splits_its_burst_equally_and_no_rate() -> None:
    shares = allocate(0.0, {"a": 5.0, "b": 0.0}, burst=10.0)
    assert [s.rate for s in shares.values()] == [0.0, 0.0]
    assert [s.burst for s in shares.values()] == [5.0, 5.0]


def test_nothing_to_split_among_no_gateways() -> None:
    assert allocate(100.0, {}) == {}


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_rejects_nonsense(bad: float) -> None:
    with pytest.raises(ValueError):
        allocate(bad, {"a": 1.0})
    with pytest.raises(ValueError):
        allocate(1.0, {"a": bad})
