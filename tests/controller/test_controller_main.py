"""``halcyon controller`` as a process: flags, readiness, persistence and a clean SIGTERM."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.auth import bearer_metadata
from controller.main import build_config, configure
from halcyon.tools.launcher import read_ready
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="halcyon controller")
    configure(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    args = parse()
    assert args.listen == "127.0.0.1:50050"
    assert args.metrics_listen == "127.0.0.1:9450"
    assert args.db == Path("./halcyon-controller.sqlite")
    config = build_config(args)
    assert (config.lease_ttl_s, config.heartbeat_interval_s) == (3.0, 1.0)
    assert dict(config.stable) == {}


def test_stable_flags_and_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("stable:\n  resnet: v1\n  bert: v3\n")
    config = build_config(parse("--config", str(cfg), "--stable", "resnet=v2"))
    assert dict(config.stable) == {"resnet": "v2", "bert": "v3"}


def test_bad_flags_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--stable", "resnet")
    assert "MODEL=VERSION" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("--lease-ttl", "-1")
    with pytest.raises(ValueError, match="shorter"):
        build_config(parse("--lease-ttl", "1", "--heartbeat-interval", "2"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("stable: [resnet]\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        build_config(parse("--config", str(bad)))


def test_help_explains_the_controller() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "halcyon.tools.cli", "controller", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=True,
    ).stdout
    for needle in ("--stable", "MODEL=VERSION", "--lease-ttl", "--db", "HALCYON_FLEET_TOKEN",
                   "--listen", "--ready-file", "stable:"):  # fmt: skip
        assert needle in out


def wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float = 20.0) -> dict[str, Any]:
    def running() -> None:
        assert proc.poll() is None, f"controller exited early: {proc.communicate()}"

    return wait_until(lambda: read_ready(path), timeout, f"the ready file {path}", check=running)


def test_process_serves_persists_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    ready, db = tmp_path / "ready.json", tmp_path / "c.sqlite"
    env = {**os.environ, "HALCYON_FLEET_TOKEN": "f-token", "HALCYON_OPERATOR_TOKEN": "o-token"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "halcyon.tools.cli", "controller", "--listen", "127.0.0.1:0",
         "--metrics-listen", "127.0.0.1:0", "--ready-file", str(ready), "--db", str(db),
         "--stable", "resnet=v1", "--shutdown-grace", "2", "--drain-delay", "0"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        addr = wait_for_file(ready, proc)["grpc"]
        with grpc.insecure_channel(addr) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            stub = control_pb2_grpc.ControlServiceStub(channel)
            session = stub.WorkerSession(
                iter(
                    [
                        control_pb2.WorkerSessionRequest(
                            register=fleet_pb2.ReplicaDescriptor(
                                replica_id="r1", address="127.0.0.1:1", model="resnet",
                                version="v1", slots=1, speed=1.0,
                            )
                        )
                    ]
                ),
                metadata=bearer_metadata("f-token"),
                timeout=10,
            )  # fmt: skip
            assert next(session).WhichOneof("kind") == "lease"
            state = stub.GetState(
                control_pb2.GetStateRequest(), metadata=bearer_metadata("o-token"), timeout=5
            )
            assert [r.stable_version for r in state.routing] == ["v1"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert any(line["msg"] == "controller stopped" for line in logs)
        assert not any("insecure dev" in line["msg"] for line in logs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    db_conn = sqlite3.connect(db)
    kinds = [k for (k,) in db_conn.execute("SELECT kind FROM fleet_events ORDER BY id")]
    stable = db_conn.execute("SELECT model, version, source FROM stable_versions").fetchall()
    db_conn.close()
    assert kinds[0] == "registered"
    assert stable == [("resnet", "v1", "config")]
