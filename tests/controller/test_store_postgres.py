"""The controller's store on a real PostgreSQL server: what only PostgreSQL has to prove.

Migrations from an empty database, a newer schema refused, two controllers migrating one
database at once, a server killed mid-use (the typed :class:`StoreUnavailable`, and the next call
after a restart succeeding), the password kept out of the log, the ``--store`` flag, and one
controller process that keeps its rollout across a restart. The behaviour both backends share
runs on both in :mod:`test_controller_store`. One server per module (tests/support/postgres.py),
a fresh database per test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from controller_helpers import FLEET, OPERATOR, StackFactory, register, rpc_error

from common.auth import bearer_metadata
from common.errors import Reason
from controller.main import build_config, configure
from controller.store import (
    SCHEMA_VERSION,
    ControllerStore,
    FleetEvent,
    FleetEventKind,
    RolloutConflict,
    RolloutRecord,
    RolloutStatus,
    StoreError,
    StoreUnavailable,
)
from controller.store_url import Backend, mask_password, parse_store_location
from halcyon.tools.launcher import read_ready
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2
from tests.support.postgres import PostgresCluster, postgres_cluster
from tests.support.tools import require_tool
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"rollout_tick_s": 3600.0}


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster(require_tool("initdb"), require_tool("pg_ctl")) as cluster:
        yield cluster


@pytest.fixture
def url(pg_cluster: PostgresCluster) -> str:
    return pg_cluster.create_database()


def rollout(model: str = "resnet") -> RolloutRecord:
    return RolloutRecord(
        model=model, baseline_version="v1", canary_version="v2", step_percents=(5.0, 50.0),
        state=RolloutStatus.PROGRESSING, started_at=1_700_000_000.123456,
        updated_at=1_700_000_000.654321, policy={"min_requests": 50},
    )  # fmt: skip


def indexes(url: str) -> set[str]:
    with psycopg.connect(url) as db:
        return {r[0] for r in db.execute("SELECT indexname FROM pg_indexes")}


# -- URLs and the flag -------------------------------------------------------------------------


def test_locations_pick_the_backend_and_mask_the_password() -> None:
    assert parse_store_location("sqlite:///var/lib/h.db").target == "/var/lib/h.db"
    assert parse_store_location("sqlite://rel/h.db").target == "rel/h.db"
    assert parse_store_location("./h.sqlite").backend is Backend.SQLITE
    pg = parse_store_location("postgresql://ctl:s3cret@db:5432/halcyon")
    assert (pg.backend, pg.display) == (Backend.POSTGRESQL, "postgresql://ctl:***@db:5432/halcyon")
    assert parse_store_location("postgres://db/h").backend is Backend.POSTGRESQL
    assert mask_password("postgresql://db/h?password=s3cret&sslmode=require") == (
        "postgresql://db/h?password=***&sslmode=require"
    )
    assert mask_password("postgresql://ctl@db/h") == "postgresql://ctl@db/h"
    with pytest.raises(ValueError, match="unknown scheme") as bad:
        parse_store_location("mysql://ctl:s3cret@db/h")
    assert "s3cret" not in str(bad.value)


def test_store_flag_fills_the_config_and_refuses_db_beside_it() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    url = "postgresql://ctl@db:5432/halcyon"
    assert build_config(parser.parse_args(["--store", url])).db_path == url
    assert str(build_config(parser.parse_args(["--db", "x.db"])).db_path) == "x.db"
    both = parser.parse_args(["--store", url, "--db", "./halcyon-controller.sqlite"])
    with pytest.raises(ValueError, match=r"--store and --db"):
        build_config(both)
    with pytest.raises(SystemExit):
        parser.parse_args(["--store", "mysql://db/h"])


def test_the_password_comes_from_pgpassfile_or_pgpassword(
    pg_cluster: PostgresCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_cluster.password_user("ctl", "pw-from-env")
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    with pytest.raises(StoreUnavailable, match="password"):
        ControllerStore(url)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{pg_cluster.port}:*:ctl:pw-from-env\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    with ControllerStore(url) as store:
        assert store.schema_version == SCHEMA_VERSION  # the user owns the database: it migrated
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    monkeypatch.setenv("PGPASSWORD", "pw-from-env")
    with ControllerStore(url) as store:
        assert store.tables()


# -- schema ------------------------------------------------------------------------------------


def test_migrations_run_from_an_empty_database_to_the_latest(url: str) -> None:
    with ControllerStore(url, target_version=0) as empty:
        assert (empty.schema_version, empty.tables()) == (0, {"schema_version"})
    with ControllerStore(url, target_version=1) as old:
        r = old.insert_rollout(rollout())
    assert "rollouts_by_model" not in indexes(url)
    for target in range(2, SCHEMA_VERSION + 1):
        with ControllerStore(url, target_version=target) as store:
            assert store.schema_version == target
    assert {"rollouts_by_model", "one_progressing_rollout_per_model"} <= indexes(url)
    with ControllerStore(url) as store:
        back = store.get_rollout(r.id)
        assert back == r  # the gate columns got their defaults; floats are 8 bytes
        assert back is not None and back.started_at == 1_700_000_000.123456
        with pytest.raises(RolloutConflict):  # the partial unique index holds here too
            store.insert_rollout(rollout())


def test_a_database_from_a_newer_halcyon_is_refused(url: str) -> None:
    ControllerStore(url).close()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer"):
        ControllerStore(url)


def test_controllers_opening_one_empty_database_at_once_migrate_it_once(url: str) -> None:
    with ThreadPoolExecutor(3) as pool:
        stores = list(pool.map(lambda _: ControllerStore(url), range(3)))
    try:
        assert {s.schema_version for s in stores} == {SCHEMA_VERSION}
        stores[0].insert_rollout(rollout())
        with pytest.raises(RolloutConflict):
            stores[1].insert_rollout(rollout())
    finally:
        for store in stores:
            store.close()


def test_text_with_a_nul_is_stored_with_a_replacement_character(url: str) -> None:
    with ControllerStore(url) as store:
        event = FleetEvent(at=1.0, kind=FleetEventKind.REGISTERED, replica_id="r\x001")
        assert store.record_fleet_events([event]) == 1
        assert [e.replica_id for e in store.list_fleet_events()] == ["r\ufffd1"]


# -- a lost server -----------------------------------------------------------------------------


def test_a_killed_server_is_store_unavailable_and_a_restart_lets_the_next_call_succeed(
    pg_cluster: PostgresCluster, url: str
) -> None:
    with ControllerStore(url) as store:
        first = store.insert_rollout(rollout())
        pg_cluster.stop()
        try:
            with pytest.raises(StoreUnavailable, match="lost the connection"):
                store.list_rollouts()
            with pytest.raises(StoreUnavailable, match="cannot connect"):
                store.insert_rollout(rollout("bert"))  # a write while it is down: typed too
        finally:
            pg_cluster.start()
        assert store.list_rollouts() == [first]
        second = store.insert_rollout(rollout("bert"))
        assert store.list_rollouts() == [first, second]


def test_a_cut_session_fails_one_call_and_the_next_reconnects(url: str) -> None:
    with ControllerStore(url) as store:
        store.insert_rollout(rollout())
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'halcyon-controller' AND datname = current_database()"
            )
        with pytest.raises(StoreUnavailable):
            store.list_rollouts()
        assert [r.model for r in store.list_rollouts()] == ["resnet"]


async def test_an_operator_action_while_the_server_is_down_is_unavailable_then_works(
    pg_cluster: PostgresCluster, url: str, start_stack: StackFactory
) -> None:
    stack = await start_stack(db_path=url, **QUIET)
    calls = [(await register(stack, rid, version=v))[0] for rid, v in (("r1", "v1"), ("r2", "v2"))]
    start = control_pb2.StartRolloutRequest(model="resnet", canary_version="v2")
    await stack.stub.StartRollout(start, metadata=OPERATOR)
    pause = control_pb2.PauseRolloutRequest(model="resnet")
    pg_cluster.stop()
    try:
        err = await rpc_error(stack.stub.PauseRollout(pause, metadata=OPERATOR))
        assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, Reason.STORE_UNAVAILABLE)
        # Reads of the store too: a typed, retryable answer, not INTERNAL.
        for read in (
            stack.stub.GetState(control_pb2.GetStateRequest(), metadata=OPERATOR),
            stack.stub.ListRolloutDecisions(
                control_pb2.ListRolloutDecisionsRequest(model="resnet"), metadata=OPERATOR
            ),
        ):
            err = await rpc_error(read)
            assert (err.code, err.reason) == (
                grpc.StatusCode.UNAVAILABLE,
                Reason.STORE_UNAVAILABLE,
            )
            assert err.retry_after_s == 1.0
    finally:
        pg_cluster.start()
    paused = await stack.stub.PauseRollout(pause, metadata=OPERATOR)
    assert paused.rollout.paused
    for call in calls:
        call.cancel()


async def test_the_store_open_line_names_the_backend_and_masks_the_password(
    pg_cluster: PostgresCluster, start_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    name = pg_cluster.create_database().rsplit("/", 1)[1]
    secret = pg_cluster.url(name, password="hunter2-not-for-logs")  # trust auth ignores it
    with caplog.at_level(logging.INFO, logger="halcyon.controller"):
        await start_stack(db_path=secret, **QUIET)
    opened = [r for r in caplog.records if r.getMessage() == "store open"]
    assert len(opened) == 1
    line: dict[str, Any] = vars(opened[0])
    assert line["backend"] == "postgresql"
    assert line["db"] == pg_cluster.url(name, password="***")
    assert not [r for r in caplog.records if "hunter2" in json.dumps(vars(r), default=str)]


# -- a controller process ------------------------------------------------------------------------


class _Worker:
    """A replica's session held open from this thread until :meth:`leave`."""

    def __init__(self, stub: control_pb2_grpc.ControlServiceStub, replica_id: str, version: str):
        self._done = threading.Event()
        descriptor = fleet_pb2.ReplicaDescriptor(
            replica_id=replica_id, address=f"127.0.0.1:{6100 + int(replica_id[1:])}",
            model="resnet", version=version, slots=1, speed=1.0,
        )  # fmt: skip

        def requests() -> Iterator[control_pb2.WorkerSessionRequest]:
            yield control_pb2.WorkerSessionRequest(register=descriptor)
            self._done.wait(30)

        self._call = stub.WorkerSession(requests(), metadata=FLEET, timeout=30)
        assert next(self._call).WhichOneof("kind") == "lease"

    def leave(self) -> None:
        self._done.set()
        self._call.cancel()


def _controller(url: str, ready: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "HALCYON_FLEET_TOKEN": "test-fleet-token",
           "HALCYON_OPERATOR_TOKEN": "test-operator-token"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "halcyon", "controller", "--store", url, "--listen", "127.0.0.1:0",
         "--metrics-listen", "127.0.0.1:0", "--console-listen", "off", "--ready-file",
         str(ready), "--stable", "resnet=v1", "--shutdown-grace", "1", "--drain-delay", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _serve(proc: subprocess.Popen[str], ready: Path) -> str:
    def running() -> None:
        assert proc.poll() is None, f"controller exited early: {proc.communicate()}"

    found: dict[str, Any] = wait_until(
        lambda: read_ready(ready), 20, "the ready file", check=running
    )
    return str(found["grpc"])


def _stop(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


@pytest.mark.e2e
def test_a_controller_process_on_postgresql_keeps_its_rollout_across_a_restart(
    url: str, tmp_path: Path
) -> None:
    operator = bearer_metadata("test-operator-token")
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(first := _controller(url, tmp_path / "ready1.json"))
        with grpc.insecure_channel(_serve(first, tmp_path / "ready1.json")) as channel:
            stub = control_pb2_grpc.ControlServiceStub(channel)
            workers = [_Worker(stub, "r1", "v1"), _Worker(stub, "r2", "v2")]
            started = stub.StartRollout(
                control_pb2.StartRolloutRequest(model="resnet", canary_version="v2"),
                metadata=operator, timeout=10,
            ).rollout  # fmt: skip
            for worker in workers:
                worker.leave()
        logs = _stop(first)
        opened = [line for line in logs if line["msg"] == "store open"]
        assert opened and opened[0]["backend"] == "postgresql", logs

        procs.append(second := _controller(url, tmp_path / "ready2.json"))
        with grpc.insecure_channel(_serve(second, tmp_path / "ready2.json")) as channel:
            stub = control_pb2_grpc.ControlServiceStub(channel)
            state = stub.GetState(control_pb2.GetStateRequest(), metadata=operator, timeout=5)
        assert [(r.id, r.model, r.canary_version) for r in state.rollouts] == [
            (started.id, "resnet", "v2")
        ]
        _stop(second)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
