"""``halcyon fleet status | drain | undrain`` against a real controller, workers and gateway.

Processes come from the e2e launcher (:mod:`tests.support.e2e`). One fleet per module for the
commands that leave it as they found it; the wait for a batch in flight gets its own fleet with
a slow replica. ``drain --wait``'s decision is also tested without processes, on scripted
GetState answers and a fake clock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from halcyon.tools.fleet_cmd import EXIT_STILL_BUSY, REPLICA_HEADERS, replica_rows, wait_drained
from halcyon.tools.operator_cli import CliError
from halcyon.v1 import control_pb2, fleet_pb2
from tests.support import e2e

REPO = Path(__file__).resolve().parents[2]


def halcyon_fleet(
    controller: str, *args: str, token: str | None = e2e.OPERATOR_TOKEN, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m halcyon fleet ARGS --controller C``; ``token`` in $HALCYON_OPERATOR_TOKEN
    (None: not set at all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    if token is not None:
        env["HALCYON_OPERATOR_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "halcyon", "fleet", *args, "--controller", controller],
        capture_output=True, text=True, timeout=timeout_s, env=env, check=False,
    )  # fmt: skip


def _rows(stdout: str) -> dict[str, dict[str, str]]:
    """The replica table, by replica id: header -> cell (the columns are aligned)."""
    lines = stdout.split("\n\n", 1)[0].splitlines()
    header = lines[0]
    starts = [header.index(h) for h in REPLICA_HEADERS]
    table = {}
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line)], strict=True)]
        table[cells[0]] = dict(zip(REPLICA_HEADERS, cells, strict=True))
    return table


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    launcher = e2e.Launcher(tmp_path_factory.mktemp("fleet-cmd"))
    try:
        yield launcher.fleet()
    finally:
        launcher.close()


def _draining(fleet: Any) -> dict[str, bool]:
    return {m.replica.replica_id: m.load.draining for m in fleet.get_state().replicas}


# -- status -------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_status_is_one_table_of_replicas_then_gateways_and_routing(fleet: Any) -> None:
    for i in range(8):  # so the gateway has reported and learned a cost model
        fleet.infer(session_key=f"status-{i}")
    e2e.wait_for(
        lambda: any(g.cost_models for g in fleet.get_state().gateways), 10,
        "the gateway's first report", watch=fleet.live(),
    )  # fmt: skip
    out = halcyon_fleet(fleet.controller.grpc, "status")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    rows = _rows(out.stdout)
    assert set(rows) == {"replica-a", "replica-b"}
    for row in rows.values():
        assert (row["model"], row["version"], row["runtime"]) == (e2e.MODEL, "v1", "simulated")
        assert row["state"] == "serving" and row["busy"] == "0/1" and row["speed"] == "1x"
    assert any(row["learned cost (gateway fit)"].endswith("batches)") for row in rows.values())
    rest = out.stdout.split("\n\n", 1)[1]
    assert "gateway gateway: concurrency limit" in rest
    assert f"routing {e2e.MODEL}: stable v1" in rest


@pytest.mark.e2e
def test_status_json_is_get_state_with_proto_field_names(fleet: Any) -> None:
    out = halcyon_fleet(fleet.controller.grpc, "status", "--json")
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert sorted(m["replica"]["replica_id"] for m in state["replicas"]) == [
        "replica-a",
        "replica-b",
    ]
    # Proto names as grpcurl prints them, defaults included so a script can always read them.
    assert all(m["load"]["draining"] is False for m in state["replicas"])
    assert all("busy_slots" in m["load"] for m in state["replicas"])
    # It is the GetState message, field for field.
    parsed = json_format.ParseDict(state, control_pb2.GetStateResponse())
    assert {m.replica.replica_id for m in parsed.replicas} == {"replica-a", "replica-b"}
    assert [r.model for r in parsed.routing] == [e2e.MODEL]


# -- drain and undrain --------------------------------------------------------------------------


@pytest.mark.e2e
def test_drain_shows_in_status_and_undrain_brings_it_back(fleet: Any) -> None:
    ctl = fleet.controller.grpc
    drained = halcyon_fleet(ctl, "drain", "replica-b", "--wait", "--timeout", "20")
    assert drained.returncode == 0, drained.stderr
    lines = drained.stdout.splitlines()
    assert lines[0].startswith("replica-b (llama-3-8b v1): draining")
    assert "UndrainReplica" in drained.stdout  # the controller's next steps, verbatim
    assert "undo: halcyon fleet undrain replica-b" in drained.stdout
    assert lines[-1].startswith("replica-b drained: no batch in flight")
    assert "waiting for replica-b" in drained.stderr  # progress goes to stderr
    assert _draining(fleet) == {"replica-a": False, "replica-b": True}

    status = _rows(halcyon_fleet(ctl, "status").stdout)
    assert status["replica-b"]["state"] == "draining"
    assert status["replica-a"]["state"] == "serving"

    undrained = halcyon_fleet(ctl, "undrain", "replica-b", "--json")
    assert undrained.returncode == 0, undrained.stderr
    answer = json.loads(undrained.stdout)
    assert answer["was_draining"] is True and answer["replica"]["replica"]["replica_id"] == (
        "replica-b"
    )
    e2e.wait_for(
        lambda: _rows(halcyon_fleet(ctl, "status").stdout)["replica-b"]["state"] == "serving",
        15, "status to show replica-b serving again", watch=fleet.live(),
    )  # fmt: skip
    again = halcyon_fleet(ctl, "undrain", "replica-b")
    assert again.returncode == 0
    assert again.stdout.splitlines()[0] == "replica-b (llama-3-8b v1): was not draining"


@pytest.mark.e2e
def test_drain_json_is_the_controllers_answer(fleet: Any) -> None:
    ctl = fleet.controller.grpc
    try:
        out = halcyon_fleet(ctl, "drain", "replica-a", "--json")
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        assert answer["replica"]["load"]["draining"] is True
        assert "UndrainReplica" in answer["next_steps"]
    finally:
        assert halcyon_fleet(ctl, "undrain", "replica-a").returncode == 0
    e2e.wait_for(
        lambda: _draining(fleet) == {"replica-a": False, "replica-b": False}, 15,
        "replica-a to take work again", watch=fleet.live(),
    )  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("action", ["drain", "undrain"])
def test_an_unknown_replica_is_the_controllers_typed_error_and_exit_1(
    fleet: Any, action: str
) -> None:
    out = halcyon_fleet(fleet.controller.grpc, action, "ghost")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"halcyon fleet {action}: NOT_FOUND (UNKNOWN_REPLICA): ")
    assert "ghost" in lines[0]
    assert out.stdout == ""


# -- credentials and reachability ---------------------------------------------------------------


@pytest.mark.e2e
def test_a_missing_or_wrong_credential_is_refused_in_one_line(fleet: Any, tmp_path: Path) -> None:
    ctl = fleet.controller.grpc
    # None at all: the dev token, with a warning, which this controller does not accept.
    missing = halcyon_fleet(ctl, "status", token=None)
    assert missing.returncode == 1
    warning, refusal = missing.stderr.strip().splitlines()
    assert warning.startswith("warning: using the insecure dev operator token")
    assert refusal.startswith("halcyon fleet status: UNAUTHENTICATED (INVALID_CREDENTIALS): ")

    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token\n")
    out = halcyon_fleet(ctl, "drain", "replica-a", "--operator-token-file", str(wrong))
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()  # a token file given: no dev-token warning
    assert line.startswith("halcyon fleet drain: UNAUTHENTICATED (INVALID_CREDENTIALS): ")

    # The fleet credential is a valid token of the wrong role.
    fleet_token = tmp_path / "fleet-token"
    fleet_token.write_text(e2e.FLEET_TOKEN + "\n")
    out = halcyon_fleet(ctl, "drain", "replica-a", "--operator-token-file", str(fleet_token))
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("halcyon fleet drain: PERMISSION_DENIED (WRONG_ROLE): ")
    assert _draining(fleet) == {"replica-a": False, "replica-b": False}  # nothing was drained

    empty = tmp_path / "empty-token"
    empty.write_text("")
    out = halcyon_fleet(ctl, "status", "--operator-token-file", str(empty))
    assert out.returncode == 1
    assert out.stderr.strip() == f"halcyon fleet status: the operator token file {empty} is empty"


def test_no_controller_at_the_address_says_so_in_one_line() -> None:
    out = halcyon_fleet("127.0.0.1:1", "status", "--timeout", "1")
    assert out.returncode == 1
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("halcyon fleet status: UNAVAILABLE")
    assert line.endswith("(is a controller running at 127.0.0.1:1?)")


def test_bad_flags_exit_2() -> None:
    out = halcyon_fleet("127.0.0.1:1", "drain", "replica-a", "--timeout", "0")
    assert out.returncode == 2 and "--timeout" in out.stderr
    out = halcyon_fleet("127.0.0.1:1", "frobnicate")
    assert out.returncode == 2 and "invalid choice" in out.stderr


# -- drain --wait with a batch in flight --------------------------------------------------------

SLOW = ("--intercept-ms", "6000", "--ms-per-token", "0", "--jitter", "0", "--no-warm-up",
        "--shutdown-grace", "30")  # fmt: skip


def _ok_batches(worker: Any) -> float:
    return float(e2e.sample(e2e.scrape(worker), "halcyon_worker_batches_total", outcome="ok"))


@pytest.mark.e2e
def test_drain_wait_returns_only_once_the_batch_in_flight_is_done(tmp_path: Path) -> None:
    launcher = e2e.Launcher(tmp_path)
    try:
        fleet = launcher.fleet({"replica-s": SLOW})
        worker = fleet.workers["replica-s"]
        ctl = fleet.controller.grpc
        answer: dict[str, Any] = {}

        def call() -> None:
            try:
                answer["reply"] = fleet.infer(session_key="slow", deadline_s=30)
            except grpc.RpcError as err:
                answer["error"] = err

        caller = threading.Thread(target=call)
        caller.start()
        e2e.wait_for(
            lambda: fleet.get_state().replicas[0].load.busy_slots == 1, 10,
            "a heartbeat showing the batch in flight", watch=fleet.live(),
        )  # fmt: skip
        before = _ok_batches(worker)

        # Too short a wait: exit 3, the replica stays draining.
        short = halcyon_fleet(ctl, "drain", "replica-s", "--wait", "--timeout", "1")
        assert short.returncode == EXIT_STILL_BUSY, short.stdout + short.stderr
        assert "replica-s still had 1/1 slots busy after 1 s" in short.stderr
        assert fleet.get_state().replicas[0].load.draining

        # Long enough: it returns after the batch finished (the worker counted it), not before.
        waited = halcyon_fleet(ctl, "drain", "replica-s", "--wait", "--timeout", "30")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert "replica-s drained: no batch in flight" in waited.stdout
        assert _ok_batches(worker) == before + 1
        caller.join(timeout=30)
        assert "reply" in answer, answer  # the request in flight was answered, not cut
        assert answer["reply"].replica_id == "replica-s"
    finally:
        launcher.close()


# -- drain --wait's decision, without processes -------------------------------------------------


def _member(lease_s: int, busy: int, draining: bool = True) -> control_pb2.FleetMember:
    member = control_pb2.FleetMember(
        replica=fleet_pb2.ReplicaDescriptor(
            replica_id="r", model="m", version="v1", slots=2, speed=1.0
        ),
        load=fleet_pb2.ReplicaLoad(busy_slots=busy, draining=draining),
    )
    member.lease_expires_at.FromSeconds(lease_s)
    return member


class _Script:
    """A console whose GetState answers a script of members (None: the replica is gone), one
    per call, on a clock that moves a second per call."""

    def __init__(self, members: list[control_pb2.FleetMember | None]) -> None:
        self.members = members
        self.calls = 0
        self.now = 0.0
        self.metadata = ()
        self.stub = SimpleNamespace(GetState=self.get_state)

    def get_state(self, request: Any, metadata: Any, timeout: float) -> Any:
        member = self.members[min(self.calls, len(self.members) - 1)]
        self.calls += 1
        self.now += 1.0
        return control_pb2.GetStateResponse(replicas=[member] if member is not None else [])

    def wait(self, timeout_s: float = 30.0) -> int:
        args = argparse.Namespace(timeout=timeout_s, json=False, action="drain")
        drain = control_pb2.DrainReplicaResponse(replica=_member(100, 2))
        return wait_drained(
            self,  # type: ignore[arg-type]
            args,
            drain,
            clock=lambda: self.now,
            sleep=lambda s: None,
        )


def test_the_wait_ends_at_the_second_heartbeat_after_the_drain_with_no_busy_slot() -> None:
    # 100 is the lease the drain answer showed: no heartbeat since. A first heartbeat (101)
    # saying 0 busy is not enough: it may predate the worker reading the drain.
    script = _Script([_member(100, 0), _member(101, 0), _member(101, 0), _member(102, 0)])
    assert script.wait() == 0
    assert script.calls == 4


def test_the_wait_goes_on_while_heartbeats_report_busy_slots() -> None:
    script = _Script([_member(101, 2), _member(102, 1), _member(103, 1), _member(104, 0)])
    assert script.wait() == 0
    assert script.calls == 4


def test_the_wait_times_out_with_exit_3_while_still_busy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = _Script([_member(100 + i, 1) for i in range(50)])
    assert script.wait(timeout_s=5) == EXIT_STILL_BUSY
    assert script.calls == 5
    assert "r still had 1/2 slots busy after 5 s (--timeout)" in capsys.readouterr().err


def test_a_replica_that_leaves_or_is_undrained_ends_the_wait_with_an_error() -> None:
    with pytest.raises(CliError, match="left the fleet"):
        _Script([_member(101, 1), None]).wait()
    with pytest.raises(CliError, match="no longer draining"):
        _Script([_member(101, 1), _member(102, 0, draining=False)]).wait()


def test_replica_rows_show_the_best_learned_fit_and_the_lease() -> None:
    state = control_pb2.GetStateResponse(replicas=[_member(110, 1)])
    for samples, per_token_ns in ((5, 30_000), (50, 22_000)):
        gateway = state.gateways.add(gateway_id=f"g{samples}")
        fit = gateway.cost_models.add(replica_id="r", samples=samples)
        fit.intercept.FromMilliseconds(18)
        fit.per_token.FromNanoseconds(per_token_ns)
    [row] = replica_rows(state, now=100.0)
    cells = dict(zip(REPLICA_HEADERS, row, strict=True))
    assert cells["state"] == "draining" and cells["busy"] == "1/2" and cells["lease"] == "10.0s"
    assert cells["learned cost (gateway fit)"] == "18.00 ms + 0.0220 ms/token (50 batches)"
