"""Sticky version assignment: deterministic, proportional, and monotone in the weight."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.versioning import BUCKETS, VersionSplit, session_bucket


def test_bucket_is_stable_and_in_range() -> None:
    b = session_bucket("llama-3-8b", "user-42")
    assert 0 <= b < BUCKETS
    assert session_bucket("llama-3-8b", "user-42") == b


def test_no_canary_means_stable_for_everyone() -> None:
    split = VersionSplit("m", "v1")
    assert {split.version_for(f"s{i}") for i in range(500)} == {"v1"}


def test_weight_is_a_share_of_sessions() -> None:
    split = VersionSplit("m", "v1", "v2", 2_500)
    canary = sum(split.version_for(f"session-{i}") == "v2" for i in range(20_000))
    assert 0.23 < canary / 20_000 < 0.27


def test_rejects_weight_outside_hash_space() -> None:
    with pytest.raises(ValueError):
        VersionSplit("m", "v1", "v2", BUCKETS + 1)


@given(
    st.text(max_size=20),
    st.integers(0, BUCKETS),
    st.integers(0, BUCKETS),
)
def test_raising_weight_only_moves_sessions_to_canary(key: str, w1: int, w2: int) -> None:
    low, high = sorted((w1, w2))
    before = VersionSplit("m", "v1", "v2", low).version_for(key)
    after = VersionSplit("m", "v1", "v2", high).version_for(key)
    assert not (before == "v2" and after == "v1")


@given(st.text(max_size=20))
def test_full_weight_sends_everyone_to_canary(key: str) -> None:
    assert VersionSplit("m", "v1", "v2", BUCKETS).version_for(key) == "v2"
