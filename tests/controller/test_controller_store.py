"""ControllerStore on a real SQLite file and a real PostgreSQL server: schema, migrations,
reopen, every table's methods. The tests of behaviour take ``location`` and run on both
backends; the ones that look inside the file (WAL, ``sqlite_master``) are SQLite's.
:mod:`tests.controller.test_store_postgres` has PostgreSQL's own."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from controller.event_writer import FleetEventWriter
from controller.stable_versions import Reconciliation, StableRecord, StableSource
from controller.store import (
    SCHEMA_VERSION,
    ArmSnapshot,
    ControllerStore,
    DecisionAction,
    DecisionRecord,
    FleetEvent,
    FleetEventKind,
    RolloutRecord,
    RolloutStatus,
    StoreError,
)
from tests.support.postgres import PostgresCluster, postgres_cluster
from tests.support.tools import require_tool

TABLES = {
    "schema_version", "rollouts", "rollout_decisions", "stable_versions", "fleet_events",
    "controller_leader",
}  # fmt: skip


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PostgresCluster]:
    """One PostgreSQL server for the module (starting one costs a second or two)."""
    with postgres_cluster(require_tool("initdb"), require_tool("pg_ctl")) as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store location no test used before: a new SQLite file or a new database."""
    if request.param == "sqlite":
        return str(tmp_path / "c.sqlite")
    cluster: PostgresCluster = request.getfixturevalue("pg_cluster")
    return cluster.create_database()


def rollout(model: str = "resnet", **kw: object) -> RolloutRecord:
    fields: dict[str, object] = {
        "model": model,
        "baseline_version": "v1",
        "canary_version": "v2",
        "step_percents": (1.0, 5.0, 25.0, 50.0),
        "state": RolloutStatus.PROGRESSING,
        "started_at": 1_700_000_000.0,
        "updated_at": 1_700_000_000.0,
        "policy": {"min_requests": 50, "max_p95_ratio": 1.2},
    }
    fields.update(kw)
    return RolloutRecord(**fields)  # type: ignore[arg-type]


def test_fresh_file_gets_the_whole_schema_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    with ControllerStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.tables() == TABLES
    assert path.exists()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    db.close()


def test_every_backend_gets_the_whole_schema(location: str) -> None:
    with ControllerStore(location) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.tables() == TABLES


def test_reopen_keeps_data_and_migrating_again_changes_nothing(location: str) -> None:
    path = location
    with ControllerStore(path) as store:
        stored = store.insert_rollout(rollout())
        store.record_fleet_events(
            [FleetEvent(at=1.0, kind=FleetEventKind.REGISTERED, replica_id="a")]
        )
    for _ in range(2):
        with ControllerStore(path) as store:
            assert store.schema_version == SCHEMA_VERSION
            assert store.get_rollout(stored.id) == stored
            assert [e.replica_id for e in store.list_fleet_events()] == ["a"]


def test_forward_migration_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with ControllerStore(path, target_version=1) as old:
        assert old.schema_version == 1
        r = old.insert_rollout(rollout())
    db = sqlite3.connect(path)
    indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    db.close()
    assert "rollouts_by_model" not in indexes
    with ControllerStore(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.get_rollout(r.id) == r
    db = sqlite3.connect(path)
    indexes = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    db.close()
    assert {"rollouts_by_model", "fleet_events_by_replica"} <= indexes


def test_file_from_a_newer_halcyon_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    ControllerStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer"):
        ControllerStore(path)


def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        ControllerStore(path)


def test_rollouts_insert_update_list(location: str) -> None:
    with ControllerStore(location) as store:
        a = store.insert_rollout(rollout("resnet"))
        b = store.insert_rollout(rollout("bert", state=RolloutStatus.ABORTED))
        assert 0 < a.id < b.id
        moved = RolloutRecord(
            **{**a.__dict__, "step_index": 2, "canary_weight_bp": 2500, "updated_at": 9.0}
        )
        store.update_rollout(moved)
        assert store.get_rollout(a.id) == moved
        assert store.list_rollouts() == [moved, b]
        assert store.list_rollouts(model="bert") == [b]
        assert store.list_rollouts(states=[RolloutStatus.PROGRESSING]) == [moved]
        assert store.list_rollouts(states=[]) == []
        assert store.get_rollout(999) is None
        with pytest.raises(KeyError):
            store.update_rollout(rollout(id=999))


def test_decisions_keep_their_evidence_newest_window_oldest_first(location: str) -> None:
    with ControllerStore(location) as store:
        r = store.insert_rollout(rollout())
        base = ArmSnapshot(
            "v1", requests=500, errors=2, shed=1, error_rate=0.006, p50_s=0.02, p95_s=0.05
        )
        can = ArmSnapshot("v2", requests=20, errors=0, error_rate=0.0, p50_s=0.02, p95_s=0.04)
        saved = [
            store.insert_decision(
                DecisionRecord(
                    rollout_id=r.id,
                    model="resnet",
                    action=action,
                    reason=reason,
                    from_percent=1.0,
                    to_percent=to,
                    decided_at=float(i),
                    baseline=base,
                    canary=can,
                )
            )
            for i, (action, reason, to) in enumerate(
                [
                    (DecisionAction.START, "", 1.0),
                    (DecisionAction.HOLD, "insufficient_data", 1.0),
                    (DecisionAction.ADVANCE, "healthy", 5.0),
                ]
            )
        ]
        assert store.list_decisions() == saved
        assert store.list_decisions(limit=2) == saved[1:]
        assert store.list_decisions("bert") == []
        assert store.list_decisions(rollout_id=r.id, limit=1) == saved[2:]
        assert store.list_decisions(limit=0) == []
        assert saved[1].baseline == base and saved[1].canary == can
        # Decisions belong to a real rollout; the driver's own error says so.
        with pytest.raises((sqlite3.IntegrityError, psycopg.IntegrityError)):
            store.insert_decision(
                DecisionRecord(
                    rollout_id=424242,
                    model="x",
                    action=DecisionAction.HOLD,
                    reason="",
                    from_percent=0,
                    to_percent=0,
                    decided_at=0,
                )
            )


def test_stable_versions_roundtrip(location: str) -> None:
    path = location
    with ControllerStore(path) as store:
        store.put_stable(StableRecord("a", "v1", StableSource.CONFIG, "v1", 1.0))
        store.put_stable(StableRecord("a", "v2", StableSource.PROMOTION, "v1", 2.0))
        store.put_stable(StableRecord("b", "v1", StableSource.CONFIG, "v1", 1.0))
        store.apply_reconciliation(Reconciliation(effective={}, deletes=["b"]))
    with ControllerStore(path) as store:
        assert store.stable_versions() == {
            "a": StableRecord("a", "v2", StableSource.PROMOTION, "v1", 2.0)
        }


def test_fleet_events_list_and_prune(location: str) -> None:
    with ControllerStore(location) as store:
        kinds = list(FleetEventKind)
        n = store.record_fleet_events(
            FleetEvent(at=float(i), kind=kinds[i % 4], replica_id=f"r{i % 2}", model="m")
            for i in range(10)
        )
        assert n == 10 and store.record_fleet_events([]) == 0
        events = store.list_fleet_events(limit=3)
        assert [e.at for e in events] == [7.0, 8.0, 9.0]
        assert all(e.replica_id == "r1" for e in store.list_fleet_events(replica_id="r1"))
        assert store.prune_fleet_events(keep=4) == 6
        assert [e.at for e in store.list_fleet_events()] == [6.0, 7.0, 8.0, 9.0]
        assert store.prune_fleet_events(keep=4) == 0
        assert store.prune_fleet_events(keep=0) == 4


async def test_event_writer_writes_off_loop_and_flushes_on_close(location: str) -> None:
    store = ControllerStore(location)
    writer = FleetEventWriter(store, keep=5)
    writer.start()
    for i in range(12):
        writer.record(FleetEvent(at=float(i), kind=FleetEventKind.REGISTERED, replica_id=f"r{i}"))
        await asyncio.sleep(0)
    await writer.close()
    assert writer.written == 12
    # Pruned to the newest `keep` after writing.
    assert [e.replica_id for e in store.list_fleet_events(limit=100)] == [
        f"r{i}" for i in range(7, 12)
    ]
    store.close()


async def test_event_writer_bounds_its_buffer(location: str) -> None:
    store = ControllerStore(location)
    writer = FleetEventWriter(store, max_pending=3)  # not started: nothing drains meanwhile
    for i in range(5):
        writer.record(FleetEvent(at=float(i), kind=FleetEventKind.EXPIRED, replica_id=f"r{i}"))
    assert writer.dropped == 2
    await writer.close()
    assert [e.replica_id for e in store.list_fleet_events()] == ["r2", "r3", "r4"]
    store.close()
