"""The controller store's schema and its migrations, written once for every backend.

What it decides: the tables, their columns and indexes, and how the schema evolves.
``schema_version`` holds one row with the version the database is at; :data:`MIGRATIONS` is an
append-only list of forward steps, each applied in its own transaction together with the version
bump, so a crash mid-migration leaves the database at the previous version and reopening
finishes the job. Column types that differ between SQLite and PostgreSQL are ``{tokens}`` a
:class:`controller.store_dialect.Dialect` fills in (SQLite gets exactly the text it always had).
"""

from __future__ import annotations

__all__ = [
    "DECISION_FIELDS",
    "GATES_VERSION",
    "GATE_FIELDS",
    "MIGRATIONS",
    "ROLLOUT_FIELDS",
    "SCHEMA_VERSION",
]

# Append-only: never edit a released step, add a new one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the initial schema.
    (
        """CREATE TABLE rollouts (
            id {id_pk},
            model TEXT NOT NULL,
            baseline_version TEXT NOT NULL,
            canary_version TEXT NOT NULL,
            step_percents TEXT NOT NULL,
            step_index INTEGER NOT NULL,
            canary_weight_bp INTEGER NOT NULL,
            state TEXT NOT NULL,
            policy TEXT NOT NULL,
            started_at {real} NOT NULL,
            updated_at {real} NOT NULL
        )""",
        """CREATE TABLE rollout_decisions (
            id {id_pk},
            rollout_id {id_ref} NOT NULL REFERENCES rollouts(id),
            model TEXT NOT NULL,
            action TEXT NOT NULL,
            reason TEXT NOT NULL,
            from_percent {real} NOT NULL,
            to_percent {real} NOT NULL,
            baseline_metrics TEXT,
            canary_metrics TEXT,
            decided_at {real} NOT NULL
        )""",
        """CREATE TABLE stable_versions (
            model TEXT PRIMARY KEY,
            version TEXT NOT NULL,
            source TEXT NOT NULL,
            config_version TEXT,
            updated_at {real} NOT NULL
        )""",
        """CREATE TABLE fleet_events (
            id {id_pk},
            at {real} NOT NULL,
            kind TEXT NOT NULL,
            replica_id TEXT NOT NULL,
            model TEXT NOT NULL,
            version TEXT NOT NULL,
            address TEXT NOT NULL,
            detail TEXT NOT NULL
        )""",
    ),
    # 2: indexes for the per-model and per-replica queries.
    (
        "CREATE INDEX rollouts_by_model ON rollouts(model, id)",
        "CREATE INDEX decisions_by_model ON rollout_decisions(model, id)",
        "CREATE INDEX decisions_by_rollout ON rollout_decisions(rollout_id, id)",
        "CREATE INDEX fleet_events_by_replica ON fleet_events(replica_id, id)",
    ),
    # 3: the evidence behind a decision beyond the arm metrics; one running rollout per model.
    (
        "ALTER TABLE rollout_decisions ADD COLUMN detail TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE rollout_decisions ADD COLUMN statistics TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE rollout_decisions ADD COLUMN needed_requests INTEGER NOT NULL DEFAULT 0",
        "CREATE UNIQUE INDEX one_progressing_rollout_per_model ON rollouts(model) "
        "WHERE state = 'progressing'",
    ),
    # 4: the rollout gates (issue #20), and whether a decision took effect. Rows written before
    # have no gates and every decision of theirs was applied. The new terminal state
    # 'analyzed' needs no DDL (state is free text; the unique index covers 'progressing').
    (
        "ALTER TABLE rollouts ADD COLUMN paused INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN auto_rollback INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE rollouts ADD COLUMN approval TEXT NOT NULL DEFAULT 'none'",
        "ALTER TABLE rollouts ADD COLUMN awaiting_approval INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN analysis_only INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollouts ADD COLUMN resumes_in_step INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE rollout_decisions ADD COLUMN applied INTEGER NOT NULL DEFAULT 1",
    ),
    # 5: who leads (issue #22, PostgreSQL only): one row, written by the controller that holds
    # the leader lock — the address standbys name to clients, and an epoch bumped at every
    # takeover. An SQLite store has the table and never a row (no election there).
    (
        """CREATE TABLE controller_leader (
            id INTEGER PRIMARY KEY,
            epoch INTEGER NOT NULL,
            address TEXT NOT NULL,
            since {real} NOT NULL
        )""",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
# The version that added the gate columns (migration 4); a store opened at an earlier target
# (a migration test) reads and writes the rows of its own version, without them.
GATES_VERSION = 4
ROLLOUT_FIELDS = (
    "model", "baseline_version", "canary_version", "step_percents", "step_index",
    "canary_weight_bp", "state", "policy", "started_at", "updated_at",
)  # fmt: skip
GATE_FIELDS = (
    "paused", "auto_rollback", "approval", "awaiting_approval", "analysis_only",
    "resumes_in_step",
)  # fmt: skip
DECISION_FIELDS = (
    "id", "rollout_id", "model", "action", "reason", "from_percent", "to_percent",
    "baseline_metrics", "canary_metrics", "decided_at", "detail", "statistics",
    "needed_requests",
)  # fmt: skip
