"""The controller's durable state: an SQLite file (the default) or a PostgreSQL database.

What it keeps: rollouts (with their operator gates: paused, auto-rollback, the approval mode,
whether one awaits approval, analysis-only, and how often the current step was resumed after a
restart — so a paused rollout is still paused after one) and every rollout decision with the
evidence behind it — arm metrics, test statistics, the reason in words, whether it took effect
— (so "why did the canary roll back at 02:14?" has an answer after the fact, and rollouts
survive a restart),
the persisted stable versions (see :mod:`controller.stable_versions`), and the fleet's history
(replicas registered / expired / removed / drained, with wall-clock timestamps).

Where it lives: :func:`controller.store_url.parse_store_location` reads the ``--store`` URL (or
``--db`` path) and picks the connection — :mod:`controller.store_sqlite` or
:mod:`controller.store_postgres`. Both run the same queries and the same migrations
(:mod:`controller.store_sql`), spelled for each by :mod:`controller.store_dialect`.

How the schema evolves: :data:`MIGRATIONS` are applied forward to :data:`SCHEMA_VERSION`, each
with its version bump in one transaction. Opening a database at the current version changes
nothing; one written by a newer Halcyon (a version this code does not know) is refused rather
than misread. A PostgreSQL server that cannot be reached raises :class:`StoreUnavailable` (a
:class:`StoreError`) from the call that found it, and the next call reconnects.

A rollout's state change, the decision that caused it and (for a promotion) the new stable
version are written in one transaction (:meth:`ControllerStore.commit_decision`), so a crash
never leaves a rollout at a step no stored decision explains. At most one rollout per model is
``progressing``: a partial unique index enforces it, so two controllers sharing a file (or a
race in one) cannot start two.

Threading: every method is short and takes one lock, and the connection may be used from any
thread, so async callers run writes via ``asyncio.to_thread`` (see
:mod:`controller.event_writer`) and keep them off the event loop.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from controller.stable_versions import Reconciliation, StableRecord, StableSource
from controller.store_dialect import StoreConnection
from controller.store_records import (
    ArmSnapshot,
    DecisionAction,
    DecisionRecord,
    FleetEvent,
    FleetEventKind,
    RolloutConflict,
    RolloutRecord,
    RolloutStatus,
    StoreError,
    StoreUnavailable,
)
from controller.store_sql import (
    DECISION_FIELDS,
    GATE_FIELDS,
    GATES_VERSION,
    MIGRATIONS,
    ROLLOUT_FIELDS,
    SCHEMA_VERSION,
)
from controller.store_sqlite import SqliteConnection
from controller.store_url import Backend, StoreLocation, parse_store_location

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "ArmSnapshot",
    "ControllerStore",
    "DecisionAction",
    "DecisionRecord",
    "FleetEvent",
    "FleetEventKind",
    "RolloutConflict",
    "RolloutRecord",
    "RolloutStatus",
    "StoreError",
    "StoreUnavailable",
]


def _connect(location: StoreLocation) -> StoreConnection:
    if location.backend is Backend.POSTGRESQL:
        # Imported here: a controller on SQLite never loads the PostgreSQL driver.
        from controller.store_postgres import PostgresConnection

        return PostgresConnection(location)
    return SqliteConnection(location.target)


class ControllerStore:
    """The controller's store. Open with a path or URL; ``close()`` (or ``with``) when done."""

    def __init__(
        self, location: str | Path | StoreLocation, *, target_version: int = SCHEMA_VERSION
    ) -> None:
        """Open (creating an SQLite file if needed) and migrate forward to ``target_version``.

        ``location``: a path, ``sqlite:///…`` or ``postgresql://…`` (ValueError for anything
        else). ``target_version`` exists for migration tests; servers use the default.
        """
        if not 0 <= target_version <= SCHEMA_VERSION:
            raise ValueError(f"target_version must be in [0, {SCHEMA_VERSION}]")
        if not isinstance(location, StoreLocation):
            location = parse_store_location(location)
        self._location = location
        self._lock = threading.RLock()
        gated = target_version >= GATES_VERSION
        self._rollout_fields = ROLLOUT_FIELDS + (GATE_FIELDS if gated else ())
        self._rollout_columns = ", ".join(("id", *self._rollout_fields))
        self._decision_columns = ", ".join(DECISION_FIELDS + (("applied",) if gated else ()))
        self._db = _connect(location)
        try:
            self._migrate(target_version)
        except StoreError:
            self._db.close()
            raise
        except self._db.database_error as exc:
            self._db.close()
            raise StoreError(f"cannot use store {location}: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The SQLite file's path, or the PostgreSQL URL with its password masked."""
        return self._location.display

    @property
    def backend(self) -> Backend:
        return self._location.backend

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ControllerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[StoreConnection]:
        with self._lock, self._db.transaction():
            yield self._db

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).rows

    # -- schema -------------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        rows = self._query("SELECT version FROM schema_version")
        return int(rows[0][0])

    def _migrate(self, target: int) -> None:
        dialect = self._db.dialect
        with self._transaction() as db:
            if dialect.migration_lock:
                db.execute(dialect.migration_lock)
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            rows = db.execute("SELECT version FROM schema_version").rows
            if len(rows) > 1:
                raise StoreError(f"store {self.path}: schema_version has {len(rows)} rows")
            if not rows:
                db.execute("INSERT INTO schema_version (version) VALUES (0)")
            current = int(rows[0][0]) if rows else 0
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"store {self.path} is at schema version {current}, newer than this "
                f"controller understands ({SCHEMA_VERSION}); upgrade Halcyon or use another "
                "--store"
            )
        for version in range(current + 1, target + 1):
            with self._transaction() as db:
                if dialect.migration_lock:
                    db.execute(dialect.migration_lock)
                # Re-check inside the transaction: another process may have migrated already.
                ((now_at,),) = db.execute("SELECT version FROM schema_version").rows
                if int(now_at) >= version:
                    continue
                for statement in MIGRATIONS[version - 1]:
                    db.execute(dialect.ddl(statement))
                db.execute("UPDATE schema_version SET version = ?", (version,))

    def tables(self) -> set[str]:
        rows = self._query(self._db.dialect.list_tables)
        return {str(r[0]) for r in rows}

    # -- rollouts -----------------------------------------------------------------------------

    def _rollout_row(self, r: RolloutRecord) -> tuple[Any, ...]:
        """The values of :attr:`_rollout_fields`, in order."""
        steps = [float(p) for p in r.step_percents]
        if not all(math.isfinite(p) for p in steps):
            raise ValueError("step_percents must be finite")
        return (
            r.model,
            r.baseline_version,
            r.canary_version,
            json.dumps(steps),
            r.step_index,
            r.canary_weight_bp,
            str(RolloutStatus(r.state)),
            json.dumps(r.policy, sort_keys=True),
            r.started_at,
            r.updated_at,
            int(bool(r.paused)),
            int(bool(r.auto_rollback)),
            str(r.approval),
            int(bool(r.awaiting_approval)),
            int(bool(r.analysis_only)),
            int(r.resumes_in_step),
        )[: len(self._rollout_fields)]

    @staticmethod
    def _rollout_from(row: tuple[Any, ...]) -> RolloutRecord:
        if len(row) == 1 + len(ROLLOUT_FIELDS):  # a store before the gates: none set
            row = (*row, 0, 1, "none", 0, 0, 0)
        return RolloutRecord(
            id=int(row[0]),
            model=row[1],
            baseline_version=row[2],
            canary_version=row[3],
            step_percents=tuple(float(p) for p in json.loads(row[4])),
            step_index=int(row[5]),
            canary_weight_bp=int(row[6]),
            state=RolloutStatus(row[7]),
            policy=json.loads(row[8]),
            started_at=float(row[9]),
            updated_at=float(row[10]),
            paused=bool(row[11]),
            auto_rollback=bool(row[12]),
            approval=str(row[13]),
            awaiting_approval=bool(row[14]),
            analysis_only=bool(row[15]),
            resumes_in_step=int(row[16]),
        )

    def insert_rollout(self, rollout: RolloutRecord) -> RolloutRecord:
        """Store a new rollout; returns it with its assigned id.

        Raises :class:`RolloutConflict` if it is progressing and its model already has one.
        """
        with self._transaction() as db:
            return self._insert_rollout(db, rollout)

    def _insert_rollout(self, db: StoreConnection, rollout: RolloutRecord) -> RolloutRecord:
        try:
            fields = self._rollout_fields
            ((new_id,),) = db.execute(
                f"INSERT INTO rollouts ({', '.join(fields)}) "
                f"VALUES ({', '.join('?' for _ in fields)}) RETURNING id",
                self._rollout_row(rollout),
            ).rows
        except self._db.integrity_error as exc:
            raise RolloutConflict(
                f"model {rollout.model!r} already has a progressing rollout"
            ) from exc
        return replace(rollout, id=int(new_id))

    def start_rollout(
        self, rollout: RolloutRecord, decision: DecisionRecord
    ) -> tuple[RolloutRecord, DecisionRecord]:
        """Insert a rollout and its first decision (``rollout_id`` is filled in) atomically."""
        with self._transaction() as db:
            stored = self._insert_rollout(db, rollout)
            first = self._insert_decision(db, replace(decision, rollout_id=stored.id))
            return stored, first

    def commit_decision(
        self,
        rollout: RolloutRecord,
        decision: DecisionRecord,
        stable: StableRecord | None = None,
    ) -> DecisionRecord:
        """The rollout as the decision leaves it, the decision, and a promotion's new stable
        version, in one transaction; returns the decision with its id."""
        with self._transaction() as db:
            self._update_rollout(db, rollout)
            if stable is not None:
                self._upsert_stable(db, stable)
            return self._insert_decision(db, decision)

    def update_rollout(self, rollout: RolloutRecord) -> None:
        """Overwrite a stored rollout (by id). Raises KeyError if there is none."""
        with self._transaction() as db:
            self._update_rollout(db, rollout)

    def _update_rollout(self, db: StoreConnection, rollout: RolloutRecord) -> None:
        try:
            cur = db.execute(
                f"UPDATE rollouts SET {', '.join(f'{f} = ?' for f in self._rollout_fields)} "
                "WHERE id = ?",
                (*self._rollout_row(rollout), rollout.id),
            )
        except self._db.integrity_error as exc:
            raise RolloutConflict(
                f"model {rollout.model!r} already has a progressing rollout"
            ) from exc
        if cur.rowcount != 1:
            raise KeyError(f"no rollout with id {rollout.id}")

    def get_rollout(self, rollout_id: int) -> RolloutRecord | None:
        rows = self._query(
            f"SELECT {self._rollout_columns} FROM rollouts WHERE id = ?", (rollout_id,)
        )
        return self._rollout_from(rows[0]) if rows else None

    def list_rollouts(
        self, model: str | None = None, states: Iterable[RolloutStatus] | None = None
    ) -> list[RolloutRecord]:
        """Rollouts oldest first, optionally of one model and in the given states."""
        where, params = [], []
        if model:
            where.append("model = ?")
            params.append(model)
        if states is not None:
            wanted = [str(RolloutStatus(s)) for s in states]
            if not wanted:
                return []
            where.append(f"state IN ({', '.join('?' for _ in wanted)})")
            params.extend(wanted)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(
            f"SELECT {self._rollout_columns} FROM rollouts{clause} ORDER BY id", params
        )
        return [self._rollout_from(r) for r in rows]

    # -- decisions ----------------------------------------------------------------------------

    def insert_decision(self, decision: DecisionRecord) -> DecisionRecord:
        """Store a decision (its rollout must exist); returns it with its assigned id."""
        with self._transaction() as db:
            return self._insert_decision(db, decision)

    def _insert_decision(self, db: StoreConnection, decision: DecisionRecord) -> DecisionRecord:
        statistics = {k: float(v) for k, v in decision.statistics.items()}
        fields = self._decision_columns.split(", ")[1:]  # all but id
        values = (
            decision.rollout_id,
            decision.model,
            str(DecisionAction(decision.action)),
            decision.reason,
            decision.from_percent,
            decision.to_percent,
            decision.baseline.to_json() if decision.baseline else None,
            decision.canary.to_json() if decision.canary else None,
            decision.decided_at,
            decision.detail,
            # Non-finite statistics (an infinite likelihood ratio) are stored as JSON's
            # extension tokens, which json.loads reads back.
            json.dumps(statistics, sort_keys=True),
            int(decision.needed_requests),
            int(bool(decision.applied)),
        )[: len(fields)]
        ((new_id,),) = db.execute(
            f"INSERT INTO rollout_decisions ({', '.join(fields)}) "
            f"VALUES ({', '.join('?' for _ in fields)}) RETURNING id",
            values,
        ).rows
        return replace(decision, id=int(new_id), statistics=statistics)

    def list_decisions(
        self, model: str | None = None, *, rollout_id: int | None = None, limit: int = 100
    ) -> list[DecisionRecord]:
        """The newest ``limit`` decisions (of a model / rollout if given), oldest first."""
        if limit <= 0:
            return []
        where: list[str] = []
        params: list[Any] = []
        if model:
            where.append("model = ?")
            params.append(model)
        if rollout_id is not None:
            where.append("rollout_id = ?")
            params.append(rollout_id)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(
            f"SELECT {self._decision_columns} FROM rollout_decisions{clause} "
            "ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [self._decision_from(r) for r in reversed(rows)]

    def latest_decisions(self) -> dict[int, DecisionRecord]:
        """The latest decision of every rollout that has one, by rollout id."""
        rows = self._query(
            f"SELECT {self._decision_columns} FROM rollout_decisions WHERE id IN "
            "(SELECT MAX(id) FROM rollout_decisions GROUP BY rollout_id)"
        )
        return {d.rollout_id: d for d in map(self._decision_from, rows)}

    def has_model(self, model: str) -> bool:
        """Whether the store knows ``model``: a rollout of it or a stable version for it."""
        rows = self._query(
            "SELECT EXISTS(SELECT 1 FROM rollouts WHERE model = ?) OR "
            "EXISTS(SELECT 1 FROM stable_versions WHERE model = ?)",
            (model, model),
        )
        return bool(rows[0][0])

    @staticmethod
    def _decision_from(r: tuple[Any, ...]) -> DecisionRecord:
        return DecisionRecord(
            id=int(r[0]),
            rollout_id=int(r[1]),
            model=r[2],
            action=DecisionAction(r[3]),
            reason=r[4],
            from_percent=float(r[5]),
            to_percent=float(r[6]),
            baseline=ArmSnapshot.from_json(r[7]),
            canary=ArmSnapshot.from_json(r[8]),
            decided_at=float(r[9]),
            detail=r[10],
            statistics={str(k): float(v) for k, v in json.loads(r[11]).items()},
            needed_requests=int(r[12]),
            applied=bool(r[13]) if len(r) > len(DECISION_FIELDS) else True,
        )

    # -- stable versions ----------------------------------------------------------------------

    def stable_versions(self) -> dict[str, StableRecord]:
        rows = self._query(
            "SELECT model, version, source, config_version, updated_at FROM stable_versions"
        )
        return {r[0]: StableRecord(r[0], r[1], StableSource(r[2]), r[3], float(r[4])) for r in rows}

    def put_stable(self, record: StableRecord) -> None:
        self.apply_reconciliation(Reconciliation(effective={}, upserts=[record]))

    def apply_reconciliation(self, rec: Reconciliation) -> None:
        """Write a :func:`controller.stable_versions.reconcile` result in one transaction."""
        with self._transaction() as db:
            for model in rec.deletes:
                db.execute("DELETE FROM stable_versions WHERE model = ?", (model,))
            for r in rec.upserts:
                self._upsert_stable(db, r)

    @staticmethod
    def _upsert_stable(db: StoreConnection, r: StableRecord) -> None:
        db.execute(
            "INSERT INTO stable_versions (model, version, source, config_version, "
            "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT(model) DO UPDATE SET "
            "version = excluded.version, source = excluded.source, "
            "config_version = excluded.config_version, updated_at = excluded.updated_at",
            (r.model, r.version, str(r.source), r.config_version, r.updated_at),
        )

    # -- fleet events -------------------------------------------------------------------------

    def record_fleet_events(self, events: Iterable[FleetEvent]) -> int:
        """Append fleet events in one transaction; returns how many were written."""
        rows = [
            (
                e.at,
                str(FleetEventKind(e.kind)),
                e.replica_id,
                e.model,
                e.version,
                e.address,
                e.detail,
            )
            for e in events
        ]
        if not rows:
            return 0
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO fleet_events (at, kind, replica_id, model, version, address, detail) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def list_fleet_events(
        self, *, replica_id: str | None = None, limit: int = 100
    ) -> list[FleetEvent]:
        """The newest ``limit`` fleet events (of one replica if given), oldest first."""
        if limit <= 0:
            return []
        clause, params = ("WHERE replica_id = ? ", [replica_id]) if replica_id else ("", [])
        rows = self._query(
            "SELECT id, at, kind, replica_id, model, version, address, detail FROM fleet_events "
            f"{clause}ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [
            FleetEvent(
                id=int(r[0]),
                at=float(r[1]),
                kind=FleetEventKind(r[2]),
                replica_id=r[3],
                model=r[4],
                version=r[5],
                address=r[6],
                detail=r[7],
            )
            for r in reversed(rows)
        ]

    def prune_fleet_events(self, keep: int) -> int:
        """Delete all but the newest ``keep`` fleet events; returns how many were deleted."""
        if keep < 0:
            raise ValueError("keep must be >= 0")
        with self._transaction() as db:
            if keep == 0:
                cur = db.execute("DELETE FROM fleet_events")
            else:
                cur = db.execute(
                    "DELETE FROM fleet_events WHERE id < (SELECT MIN(id) FROM "
                    "(SELECT id FROM fleet_events ORDER BY id DESC LIMIT ?) AS newest)",
                    (keep,),
                )
            return int(cur.rowcount)
