"""`halcyon stack` as a user runs it: secrets, supervision, signals, ports, leftovers.

Real processes throughout: the stack and its children, ``ps``, ``kill -9``, ``make stack`` in
its own process group, commands pasted into a fresh ``bash`` with an empty environment.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from halcyon.tools.stack import PID_FILE, STATE_PREFIX, remove_stale_state_dirs
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
UP_LINE = r"grpc\.health\.v1\.Health/Check"
# Fixed ports for the tests that must reuse them (the next stack on the same ports).
PORTS = {"controller": 52410, "gateway": 52411, "gateway_metrics": 52412}


class StackRun:
    """One ``halcyon stack`` (or ``make stack``) process with its output read in a thread."""

    def __init__(self, argv: list[str], env: dict[str, str], *, new_session: bool = False):
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=new_session,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = 90.0, after: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                found = re.search(pattern, line)
                if found:
                    return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout_s}s:\n{self.text}")

    def rows(self) -> dict[str, tuple[str, str, int]]:
        """process name -> (gRPC address, metrics address, pid) from the printed table."""
        return {
            m.group(1): (m.group(2), m.group(3), int(m.group(4)))
            for m in re.finditer(
                r"^\s+(\S+)\s+(127\.0\.0\.1:\d+)\s+(127\.0\.0\.1:\d+)\s+(\d+)$", self.text, re.M
            )
        }

    def state_dir(self) -> Path:
        found = re.search(r"^State and logs: (\S+)", self.text, re.M)
        assert found, self.text
        return Path(found.group(1))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    env.update(extra)
    return env


def _stack_argv(*extra: str, ports: dict[str, int] | None = None) -> list[str]:
    p = ports or {"controller": 0, "gateway": 0, "gateway_metrics": 0}
    return [
        sys.executable, "-m", "halcyon", "stack",
        "--controller-listen", f"127.0.0.1:{p['controller']}",
        "--gateway-listen", f"127.0.0.1:{p['gateway']}",
        "--gateway-metrics-listen", f"127.0.0.1:{p['gateway_metrics']}",
        *extra,
    ]  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status.lower()


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _fresh_shell(command: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``command`` as pasted into a new terminal: bash, an empty environment."""
    return subprocess.run(
        ["/bin/bash", "--noprofile", "--norc", "-c", command],
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _printed_command(lines: list[str], marker: str) -> str:
    """The command printed under the heading containing ``marker`` (continuations joined)."""
    start = next(i for i, line in enumerate(lines) if marker in line) + 1
    parts = []
    for line in lines[start:]:
        if not line.strip():
            break
        parts.append(line.strip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(parts)


@pytest.fixture
def stacks() -> Iterator[list[StackRun]]:
    started: list[StackRun] = []
    yield started
    for run in started:
        run.stop()


def test_no_secret_in_sight_printed_commands_work_and_killed_processes_come_back(
    stacks: list[StackRun],
) -> None:
    fleet = "fleet-" + secrets.token_hex(12)
    operator = "operator-" + secrets.token_hex(12)
    run = StackRun(_stack_argv(), _env(HALCYON_FLEET_TOKEN=fleet, HALCYON_OPERATOR_TOKEN=operator))
    stacks.append(run)
    run.wait_for(UP_LINE)
    rows = run.rows()
    assert set(rows) == {"controller", "replica-a", "replica-b", "gateway"}
    state = run.state_dir()
    assert state.name.startswith(STATE_PREFIX)

    # No secret on any process's command line (what every local user can read), as ps shows it
    # and as /proc holds it, nor in what the stack printed.
    ps = subprocess.run(["ps", "-eo", "pid,args", "ww"], capture_output=True, text=True).stdout
    assert str(rows["gateway"][2]) in ps
    for _, _, pid in rows.values():
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert b"--fleet-token" not in args and b"--operator-token" not in args, args
    for token in (fleet, operator):
        assert token not in ps
        assert token not in run.text
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                assert token.encode() not in cmdline.read_bytes(), cmdline
            except OSError:
                continue
    # The operator token is readable by its owner only, and the printout says where.
    token_file = state / "operator-token"
    assert token_file.read_text().strip() == operator
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert str(token_file) in run.text

    # Every printed command works pasted into a fresh shell (absolute paths, no venv on PATH).
    infer = _printed_command(run.lines, "Send one request")
    out = _fresh_shell(infer)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["replica_id"] in {"replica-a", "replica-b"}
    state_call = _printed_command(run.lines, "Inspect the control plane")
    out = _fresh_shell(state_call)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["replicas"]) == 2
    health = re.search(r"^Health: (.+)$", run.text, re.M)
    assert health is not None
    out = _fresh_shell(health.group(1))
    assert out.returncode == 0 and "SERVING" in out.stdout, out.stderr
    load = _printed_command(run.lines, "Drive real load").replace("--seconds 20", "--seconds 1")
    out = _fresh_shell(load + " --clients 2 --json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["requests"] > 0

    # kill -9 of a worker (the printed demo), then of the controller: each is reported and
    # restarted on the same ports; the stack keeps running.
    victim = _printed_command(run.lines, "Break something")
    assert victim == f"kill -9 {rows['replica-b'][2]}"
    mark = len(run.lines)
    assert _fresh_shell(victim).returncode == 0
    run.wait_for(r"replica-b \(pid \d+\) was killed by SIGKILL; restarting it", after=mark)
    run.wait_for(r"replica-b is back \(pid \d+, restart 1\)", after=mark)
    ready = json.loads((state / "replica-b.ready.json").read_text())
    assert ready["grpc"] == rows["replica-b"][0] and ready["pid"] != rows["replica-b"][2]
    mark = len(run.lines)
    os.kill(rows["controller"][2], signal.SIGKILL)
    run.wait_for(r"controller \(pid \d+\) was killed by SIGKILL; restarting it", after=mark)
    run.wait_for(r"controller is back", after=mark)

    def both_registered() -> bool:  # with the restarted controller, on its old port
        out = _fresh_shell(state_call)
        return out.returncode == 0 and len(json.loads(out.stdout).get("replicas", [])) == 2

    wait_until(
        both_registered, 30, "the workers to re-register", interval_s=0.5, details=lambda: run.text
    )
    out = _fresh_shell(infer)
    assert out.returncode == 0, out.stderr
    assert run.proc.poll() is None

    # A double Ctrl-C 0.15 s apart: everything stops, nothing is left, the temp dir is gone.
    children = [json.loads(f.read_text())["pid"] for f in state.glob("*.ready.json")]
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.15)
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(timeout=30) == 0, run.text
    assert _wait_gone(children, 5.0) == []
    assert not state.exists()


def test_sigkill_of_the_stack_takes_every_child_and_the_next_stack_starts(
    stacks: list[StackRun],
) -> None:
    first = StackRun(_stack_argv(ports=PORTS), _env())
    stacks.append(first)
    first.wait_for(UP_LINE)
    state = first.state_dir()
    children = [pid for _, _, pid in first.rows().values()]
    first.proc.kill()  # nothing of the stack runs after this: no handler, no cleanup
    first.proc.wait(timeout=10)
    assert _wait_gone(children, 10.0) == [], "children outlived a SIGKILLed stack"
    assert state.exists()  # a SIGKILLed process cannot clean up ...

    second = StackRun(_stack_argv(ports=PORTS), _env())
    stacks.append(second)
    second.wait_for(UP_LINE)  # ... and the same ports are free for the next stack
    assert second.rows()["gateway"][0] == f"127.0.0.1:{PORTS['gateway']}"
    assert not state.exists()  # ... which removes the dead stack's directory
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=30) == 0, second.text


def test_sigterm_to_make_stacks_process_group_leaves_nothing_running(
    stacks: list[StackRun],
) -> None:
    args = " ".join(
        f"--{flag}-listen 127.0.0.1:{port}"
        for flag, port in (
            ("controller", PORTS["controller"]),
            ("gateway", PORTS["gateway"]),
            ("gateway-metrics", PORTS["gateway_metrics"]),
        )
    )
    for attempt in range(3):
        run = StackRun(
            ["make", "--no-print-directory", "stack", f"STACK_ARGS={args}"],
            _env(),
            new_session=True,  # its own process group, as a terminal gives a foreground job
        )
        stacks.append(run)
        run.wait_for(UP_LINE)
        children = [pid for _, _, pid in run.rows().values()]
        os.killpg(run.proc.pid, signal.SIGTERM)  # make and the stack both get it
        run.proc.wait(timeout=30)
        assert _wait_gone(children, 15.0) == [], f"attempt {attempt}: {run.text}"
        assert not run.state_dir().exists()


def test_a_port_in_use_is_reported_with_the_process_holding_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = subprocess.run(
            [*_stack_argv(), "--gateway-listen", f"127.0.0.1:{port}"],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2
    message = out.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    assert f"port {port} (--gateway-listen) is already in use" in message
    assert f"held by pid {os.getpid()} (" in message


def test_a_secret_flag_is_refused_before_anything_starts() -> None:
    out = subprocess.run(
        [*_stack_argv(), "--operator-token", "s3cret"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "visible to every local user in ps" in out.stderr
    assert "--operator-token-file PATH" in out.stderr


def test_stale_state_directories_of_dead_stacks_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f"{STATE_PREFIX}dead"
    gone.mkdir()
    (gone / PID_FILE).write_text(f"{dead.pid}\n")
    live = tmp_path / f"{STATE_PREFIX}live"
    live.mkdir()
    (live / PID_FILE).write_text(f"{os.getpid()}\n")
    unknown = tmp_path / f"{STATE_PREFIX}old"  # no pid file: not ours to judge
    unknown.mkdir()
    assert remove_stale_state_dirs(tmp_path) == [gone]
    assert live.exists() and unknown.exists() and not gone.exists()
