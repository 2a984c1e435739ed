"""Stable versions from flags, config file and the store, reconciled at start."""

from __future__ import annotations

import pytest

from controller.stable_versions import (
    StableRecord,
    StableSource,
    merge_configured,
    parse_stable_assignment,
    reconcile,
    stable_map_from_config,
)


def test_parse_assignment() -> None:
    assert parse_stable_assignment("resnet=v1") == ("resnet", "v1")
    assert parse_stable_assignment(" bert = v3 ") == ("bert", "v3")
    for bad in ["resnet", "=v1", "resnet=", "a=b=c", ""]:
        with pytest.raises(ValueError, match="MODEL=VERSION"):
            parse_stable_assignment(bad)


def test_config_document() -> None:
    assert stable_map_from_config(None) == {}
    assert stable_map_from_config({"stable": {"a": "v1", "b": 2}}) == {"a": "v1", "b": "2"}
    for bad in [["x"], {"stable": ["a"]}, {"stabel": {}}, {"stable": {"a": None}}]:
        with pytest.raises(ValueError):
            stable_map_from_config(bad)


def test_flags_win_over_file_and_conflicting_flags_fail() -> None:
    assert merge_configured({"a": "v1", "b": "v1"}, [("a", "v2")]) == {"a": "v2", "b": "v1"}
    assert merge_configured({}, [("a", "v2"), ("a", "v2")]) == {"a": "v2"}
    with pytest.raises(ValueError, match="twice"):
        merge_configured({}, [("a", "v1"), ("a", "v2")])


def rec(model: str, version: str, source: StableSource, config: str | None) -> StableRecord:
    return StableRecord(model, version, source, config, 1.0)


def test_first_start_records_the_configuration() -> None:
    r = reconcile({"a": "v1"}, {}, now=5.0)
    assert r.effective == {"a": "v1"}
    assert r.upserts == [StableRecord("a", "v1", StableSource.CONFIG, "v1", 5.0)]
    assert r.deletes == [] and r.notes == []


def test_unchanged_configuration_writes_nothing() -> None:
    stored = {"a": rec("a", "v1", StableSource.CONFIG, "v1")}
    r = reconcile({"a": "v1"}, stored, now=5.0)
    assert r.effective == {"a": "v1"} and r.upserts == [] and r.deletes == []


def test_promotion_survives_restart_while_configuration_is_unchanged() -> None:
    stored = {"a": rec("a", "v2", StableSource.PROMOTION, "v1")}
    r = reconcile({"a": "v1"}, stored, now=5.0)
    assert r.effective == {"a": "v2"}
    assert r.upserts == [] and r.deletes == []
    assert any("overrides" in n for n in r.notes)


def test_changed_configuration_supersedes_an_old_promotion() -> None:
    stored = {"a": rec("a", "v2", StableSource.PROMOTION, "v1")}
    r = reconcile({"a": "v3"}, stored, now=5.0)
    assert r.effective == {"a": "v3"}
    assert r.upserts == [StableRecord("a", "v3", StableSource.CONFIG, "v3", 5.0)]
    assert any("superseded" in n for n in r.notes)


def test_dropped_configuration_row_is_deleted_but_overrides_stay() -> None:
    stored = {
        "a": rec("a", "v1", StableSource.CONFIG, "v1"),
        "b": rec("b", "v5", StableSource.OPERATOR, None),
    }
    r = reconcile({}, stored, now=5.0)
    assert r.effective == {"b": "v5"}
    assert r.deletes == ["a"]
