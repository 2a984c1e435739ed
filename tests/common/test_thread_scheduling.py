"""The helper-thread scheduler: which threads it switches, once each, and what stops it."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from common.thread_scheduling import (
    HelperThreadScheduler,
    schedule_helper_threads,
    tighten_timer_slack,
)


def _tasks(tmp_path: Path, *tids: int) -> Path:
    for tid in tids:
        (tmp_path / str(tid)).mkdir(exist_ok=True)
    return tmp_path


class Recorder:
    def __init__(self, fail: dict[int, BaseException] | None = None) -> None:
        self.calls: list[int] = []
        self.fail = fail or {}

    def __call__(self, tid: int) -> None:
        self.calls.append(tid)
        if tid in self.fail:
            raise self.fail[tid]


def test_switches_every_thread_but_the_loops_once(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, 100, 101, 102)
    setter = Recorder()
    scheduler = HelperThreadScheduler(100, tasks=tasks, set_batch=setter)

    assert scheduler.apply() == 2
    assert sorted(setter.calls) == [101, 102]
    # A later scan switches only the threads that appeared since.
    _tasks(tmp_path, 103)
    assert scheduler.apply() == 1
    assert sorted(setter.calls) == [101, 102, 103]
    assert scheduler.switched == 3
    # Exited threads are forgotten, so the record stays as small as the thread list.
    (tmp_path / "101").rmdir()
    assert scheduler.apply() == 0
    assert scheduler.switched == 2


def test_a_thread_that_exited_meanwhile_is_skipped(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, 1, 2, 3)
    setter = Recorder(fail={2: ProcessLookupError()})
    scheduler = HelperThreadScheduler(1, tasks=tasks, set_batch=setter)

    assert scheduler.apply() == 1
    assert scheduler.switched == 1


def test_refusal_stops_all_further_attempts(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, 1, 2, 3)
    setter = Recorder(fail={2: PermissionError("not allowed"), 3: PermissionError("no")})
    scheduler = HelperThreadScheduler(1, tasks=tasks, set_batch=setter)

    scheduler.apply()
    attempts = len(setter.calls)
    _tasks(tmp_path, 4)
    assert scheduler.apply() == 0
    assert len(setter.calls) == attempts  # no new attempt after a refusal


def test_unreadable_task_list_switches_nothing(tmp_path: Path) -> None:
    setter = Recorder()
    scheduler = HelperThreadScheduler(1, tasks=tmp_path / "missing", set_batch=setter)
    assert scheduler.apply() == 0
    assert setter.calls == []


class FakeLoop:
    def __init__(self) -> None:
        self.scheduled: list[tuple[float, Any]] = []
        self.cancelled = 0

    def call_later(self, delay: float, callback: Any) -> Any:
        self.scheduled.append((delay, callback))
        loop = self

        class Handle:
            def cancel(self) -> None:
                loop.cancelled += 1

        return Handle()


def test_keep_applied_rescans_on_a_timer_until_stopped(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path, 1, 2)
    setter = Recorder()
    scheduler = HelperThreadScheduler(1, tasks=tasks, set_batch=setter)
    loop = FakeLoop()

    scheduler.keep_applied(loop, every_s=5.0)  # type: ignore[arg-type]
    assert setter.calls == [2]
    assert [delay for delay, _ in loop.scheduled] == [5.0]

    _tasks(tmp_path, 3)
    loop.scheduled[-1][1]()  # the timer fires
    assert setter.calls == [2, 3]
    assert len(loop.scheduled) == 2

    scheduler.stop()
    assert loop.cancelled == 1


def test_normal_policy_changes_nothing() -> None:
    assert schedule_helper_threads("normal") is None


@pytest.mark.skipif(not HelperThreadScheduler.supported(), reason="needs Linux SCHED_BATCH")
def test_real_threads_become_batch_and_the_loop_thread_does_not() -> None:
    # In a child process, so this test's own process keeps its scheduling.
    script = textwrap.dedent(
        """
        import os, threading
        from common.thread_scheduling import HelperThreadScheduler
        started, stop = threading.Event(), threading.Event()
        ids = []
        def helper():
            ids.append(threading.get_native_id())
            started.set()
            stop.wait()
        t = threading.Thread(target=helper)
        t.start()
        started.wait()
        HelperThreadScheduler().apply()
        print(os.sched_getscheduler(ids[0]), os.sched_getscheduler(threading.get_native_id()))
        stop.set()
        t.join()
        """
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    # The loop's thread keeps the policy the child inherited from this process.
    assert [int(x) for x in out] == [os.SCHED_BATCH, os.sched_getscheduler(0)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl timer slack is Linux's")
def test_timer_slack_is_set_for_the_calling_thread_only() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    get_slack = 30  # PR_GET_TIMERSLACK
    before = libc.prctl(get_slack, 0, 0, 0, 0)
    seen: list[tuple[bool, int]] = []

    def in_a_thread() -> None:
        seen.append((tighten_timer_slack(1234), libc.prctl(get_slack, 0, 0, 0, 0)))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [(True, 1234)]
    assert libc.prctl(get_slack, 0, 0, 0, 0) == before  # this thread is untouched
