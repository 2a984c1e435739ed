"""The one process launcher (``halcyon.tools.launcher``) and the parent-death rule it relies on.

A launched service must not outlive its launcher, even a SIGKILLed one (no ``finally`` runs):
the child learns the launcher's pid from its environment and asks the kernel for SIGKILL when
its parent goes (``common.parent_death``), with no ``preexec_fn`` (which would force a
``fork()`` that gRPC's fork handlers abort).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.parent_death import PARENT_PID_ENV
from halcyon.tools import launcher
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
TOKENS = {"HALCYON_FLEET_TOKEN": "t-fleet", "HALCYON_OPERATOR_TOKEN": "t-operator"}
CONTROLLER = [
    "controller", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
    "--console-listen", "off", "--stable", "m=v1", "--drain-delay", "0",
]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "HALCYON_"))}
    return {**env, **TOKENS}


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (a container's init may not reap it at once)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_launched_process_serves_in_its_own_group_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    ready = tmp_path / "c.ready.json"
    ready.write_text("{}")  # a stale file from an earlier run must not count as ready
    proc = launcher.launch(
        [*CONTROLLER, "--db", str(tmp_path / "c.sqlite")],
        ready_file=ready,
        log_path=tmp_path / "c.log",
        env=_env(),
    )
    try:
        info = launcher.wait_ready(proc, ready, 30.0)
        assert info["pid"] == proc.pid
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        assert launcher.stop(proc, 10.0) == 0
    finally:
        launcher.kill(proc)
        proc.wait(timeout=10)
    assert (tmp_path / "c.log").stat().st_size > 0  # its output went to the log


def test_a_process_that_exits_before_ready_is_reported_at_once(tmp_path: Path) -> None:
    ready = tmp_path / "w.ready.json"
    proc = launcher.launch(
        ["worker", "--slots", "0"], ready_file=ready, log_path=tmp_path / "w.log", env=_env()
    )
    started = time.monotonic()
    with pytest.raises(launcher.NotReady) as caught:
        launcher.wait_ready(proc, ready, 30.0)
    assert caught.value.returncode == 2
    assert time.monotonic() - started < 20.0
    assert "slot" in (tmp_path / "w.log").read_text()


def test_a_sigkilled_launchers_child_exits(tmp_path: Path) -> None:
    # A launcher of its own (this test's process must survive): it starts a controller, says
    # the child's pid, and waits to be killed.
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from halcyon.tools import launcher
        d = Path({str(tmp_path)!r})
        proc = launcher.launch(
            [*{CONTROLLER!r}, "--db", str(d / "c.sqlite")],
            ready_file=d / "ready.json", log_path=d / "c.log", env=os.environ,
        )
        launcher.wait_ready(proc, d / "ready.json", 30.0)
        print(proc.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        wait_until(lambda: _gone(child), 15.0, f"the controller (pid {child}) to exit")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)


def test_the_parent_pid_is_checked_so_an_orphan_exits_at_once() -> None:
    # A parent pid that is not the parent: the launcher died before prctl took effect.
    code = "from common.parent_death import die_with_parent; die_with_parent(); print('ran on')"
    orphan = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO, env={**_env(), PARENT_PID_ENV: "1"}, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip
    assert (orphan.returncode, orphan.stdout) == (1, "")
    # The real parent: it runs on, and its own children do not inherit the variable.
    code = (
        "import os; from common.parent_death import die_with_parent; die_with_parent(); "
        f"print(os.environ.get({PARENT_PID_ENV!r}))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO, env={**_env(), PARENT_PID_ENV: str(os.getpid())}, capture_output=True,
        text=True, timeout=30, check=False,
    )  # fmt: skip
    assert (child.returncode, child.stdout) == (0, "None\n")
