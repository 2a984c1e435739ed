"""The ``halcyon`` command's contract for every subcommand: defaults shown in ``--help``,
one-line errors with a non-zero exit and no traceback, quiet when its reader stops early.

Walks ``halcyon.tools.cli.SUBCOMMANDS``, so a subcommand or flag added later is checked too.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import bench.cli
from bench.command_frame import (
    EXIT_BUG,
    EXIT_USER_ERROR,
    describe_os_error,
    run_guarded,
    subcommand_parser,
)
from halcyon.tools.cli import SUBCOMMANDS


def _halcyon(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "halcyon", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _spellings(default: object) -> set[str]:
    """Ways a help text may write a default: 20.0 as "20", 0xC0FFEE in hex, a list joined."""
    out = {str(default)}
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        out.add(f"{default:g}")
        if isinstance(default, int):
            out.add(f"{default:#x}")
            out.add(f"0x{default:X}")
    if isinstance(default, (list, tuple)):
        out.add(",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default))
    return out


def _options(name: str) -> list[tuple[argparse.Action, str]]:
    module_name, help_text = SUBCOMMANDS[name]
    parser = subcommand_parser(name, importlib.import_module(module_name), help_text)
    parser.format_help()  # what `--help` does first: picks the formatter that shows defaults
    formatter = parser._get_formatter()
    return [
        (action, formatter._expand_help(action) if action.help else "")
        for action in parser._actions
        if action.option_strings and action.nargs != 0
    ]


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_flag_with_a_default_shows_it(name: str) -> None:
    missing = []
    for action, text in _options(name):
        if action.default is None or action.default is argparse.SUPPRESS:
            continue
        shown = text[text.find("default") :] if "default" in text else ""
        if not any(spelling in shown for spelling in _spellings(action.default)):
            missing.append(f"{'/'.join(action.option_strings)} (default {action.default!r})")
    assert not missing, f"halcyon {name} --help hides defaults: {missing}"


def test_help_renders_the_default_it_was_not_told() -> None:
    text = dict((a.dest, t) for a, t in _options("loadtest"))["target"]
    assert "(default 127.0.0.1:50051)" in text


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_help_of_every_subcommand(name: str) -> None:
    proc = _halcyon(name, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: halcyon {name}")
    assert not proc.stderr


def test_python_m_bench_is_halcyon_bench() -> None:
    # bench cannot import the halcyon command (it sits below it), so it names its own summary.
    assert SUBCOMMANDS["bench"] == ("bench.cli", bench.cli.SUMMARY)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--rates", "x"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (2, _halcyon("bench", "--rates", "x").stderr)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("bench", "--rates", "x"), "argument --rates: not a list of rates: 'x'"),
        (("bench", "--workers", "0"), "argument --workers: 0 must be at least 1"),
        (("loadtest", "--seconds", "soon"), "argument --seconds: invalid float value"),
        (("gateway", "--objective", "fast"), "invalid choice: 'fast'"),
        (("worker", "--slots", "0"), "a replica needs at least one slot"),
        (("controller", "--lease-ttl", "-1"), "--lease-ttl"),
        (("stack", "--intercept-ms", "x"), "--intercept-ms"),
        (("nonsense",), "invalid choice: 'nonsense'"),
    ],
)
def test_a_usage_error_is_one_line_that_points_at_help(args: tuple[str, ...], says: str) -> None:
    proc = _halcyon(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0] and "--help" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_a_missing_trace_file_is_one_line_not_a_traceback() -> None:
    proc = _halcyon("bench", "--trace", "/nonexistent/trace.jsonl", "--workers", "1")
    assert proc.returncode == EXIT_USER_ERROR
    assert proc.stderr.strip().splitlines() == [
        "halcyon bench: No such file or directory: /nonexistent/trace.jsonl; check the path"
    ]


def test_an_unwritable_plot_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "plot.png"
    proc = _halcyon(
        "bench", "--rates", "50", "--duration", "1", "--workers", "1", "--plot", str(target)
    )
    assert proc.returncode == EXIT_USER_ERROR
    assert proc.stderr.strip().splitlines()[-1] == (
        f"halcyon bench: No such file or directory: {target}; check the path"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "--json", "--duration", "5", "--workers", "1"),
        ("bench", "--rates", "50", "--duration", "2", "--workers", "1"),
        ("bench", "--scenario", "herd"),
    ],
)
def test_a_reader_that_stops_early_is_not_an_error(args: tuple[str, ...]) -> None:
    # `halcyon bench --json | head -1` where head has gone before the bench writes: the
    # reader's end is closed at once, so the first write meets a broken pipe.
    writer = subprocess.Popen(
        [sys.executable, "-m", "halcyon", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert writer.stdout is not None and writer.stderr is not None
    writer.stdout.close()
    stderr = writer.stderr.read()
    code = writer.wait(timeout=60)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert code == 141  # what a shell reports for a writer stopped by a closed pipe


def test_an_unexpected_exception_is_one_line_and_a_bug_exit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HALCYON_TRACEBACK", raising=False)

    def boom() -> int:
        raise KeyError("replica-z")

    assert run_guarded("halcyon x", boom) == EXIT_BUG
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("halcyon x: unexpected KeyError: 'replica-z'. This is a bug")
    assert "HALCYON_TRACEBACK=1" in err
    monkeypatch.setenv("HALCYON_TRACEBACK", "1")
    with pytest.raises(KeyError):
        run_guarded("halcyon x", boom)


def test_os_errors_say_what_to_do() -> None:
    in_use = OSError(errno.EADDRINUSE, "Address already in use")
    assert describe_os_error(in_use) == (
        "Address already in use; stop what holds the port or choose another "
        "(port 0 picks a free one)"
    )
    denied = PermissionError(errno.EACCES, "Permission denied", "/etc/shadow")
    assert describe_os_error(denied) == (
        "Permission denied: /etc/shadow; check its permissions or choose another path"
    )


def test_objective_has_one_vocabulary_with_the_old_spelling_accepted() -> None:
    from gateway.batching import Objective
    from gateway.main import configure as gateway_configure

    parser = argparse.ArgumentParser()
    gateway_configure(parser)
    assert parser.parse_args([]).objective == "requests"
    assert parser.parse_args(["--objective", "tokens"]).objective == "tokens"
    assert parser.parse_args(["--objective", "on_time_tokens"]).objective == "tokens"
    assert Objective.parse("requests") is Objective.ON_TIME_REQUESTS
    assert Objective.parse("ON_TIME_TOKENS") is Objective.ON_TIME_TOKENS
    bench = dict((a.dest, a) for a, _ in _options("bench"))["objective"]
    gateway = dict((a.dest, a) for a, _ in _options("gateway"))["objective"]
    assert set(gateway.choices or ()) | {"both"} == set(bench.choices or ())


def test_a_server_with_a_missing_config_file_says_which_flag(tmp_path: Path) -> None:
    missing = tmp_path / "tenants.yaml"
    proc = _halcyon(
        "gateway", "--tenants", str(missing), "--listen", "127.0.0.1:0", "--metrics-listen", "off",
        "--dev-mode",
    )  # fmt: skip
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if '"ERROR"' in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr
    assert f"cannot read {missing}: No such file or directory; check --tenants" in errors[0]
