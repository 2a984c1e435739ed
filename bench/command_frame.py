"""How a ``halcyon`` subcommand parses its flags and fails: the command frame.

What it decides for every subcommand at once, so no subcommand can get it wrong:

* ``--help`` shows every flag's default (:class:`ShowDefaults` appends ``(default X)`` where
  the help text does not already say it);
* a usage error is one line naming the problem and pointing at ``--help`` (not argparse's
  full usage block);
* an error escaping a subcommand is one line on stderr with a non-zero exit, never a
  traceback: a missing or unwritable file names the path, anything else is reported as a bug
  (``HALCYON_TRACEBACK=1`` shows where);
* output piped into a reader that stops early (``| head``) ends quietly, as Unix tools do.

It lives in ``bench`` rather than with the ``halcyon`` command (:mod:`halcyon.tools.cli`)
because ``python -m bench`` must behave exactly as ``halcyon bench`` and ``bench`` sits below
the operator tools: both reach it here without an import cycle. It needs nothing but the
standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

# Exit codes besides a subcommand's own: 1 for a failure the user can fix (a path), 70 for a
# bug (EX_SOFTWARE), 130 for Ctrl-C and 141 for a closed pipe, as a shell reports them.
EXIT_USER_ERROR = 1
EXIT_BUG = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
TRACEBACK_ENV = "HALCYON_TRACEBACK"


class ShowDefaults(argparse.HelpFormatter):
    """Appends ``(default X)`` to an option's help unless the text already names its default.

    Options without a value (``store_true``, ``--help``) and options whose default is None
    are left alone: for those the help text itself must say what happens when they are
    absent (``tests/tools/test_halcyon_cli.py`` checks every subcommand).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or action.nargs == 0
            or action.default is None
            or action.default is argparse.SUPPRESS
            or "default" in text
        ):
            return text
        default = action.default
        if isinstance(default, (list, tuple)):
            shown = ",".join(str(v) for v in default) if default else "none"
        else:
            shown = str(default)
        return f"{text} (default {shown.replace('%', '%%')})"


def _formatter_showing_defaults(base: Any) -> Any:
    """``base`` (e.g. RawDescriptionHelpFormatter, which a subcommand may pick) + ShowDefaults."""
    if issubclass(base, ShowDefaults):
        return base
    return type(f"ShowDefaults{base.__name__}", (ShowDefaults, base), {})


class CommandParser(argparse.ArgumentParser):
    """argparse with a one-line usage error and defaults shown in ``--help``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", ShowDefaults)
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        # A subcommand's configure() may have replaced formatter_class after construction.
        self.formatter_class = _formatter_showing_defaults(self.formatter_class)
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see '{self.prog} --help'\n")


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _say(prog: str, message: str) -> None:
    with contextlib.suppress(OSError):  # stderr gone too: nothing more to tell anyone
        print(f"{prog}: {message}", file=sys.stderr)


def describe_os_error(exc: OSError) -> str:
    """One line for a failed file or network operation: what failed, on what, what to do."""
    what = exc.strerror or str(exc)
    where = f" {exc.filename}" if exc.filename is not None else ""
    if exc.filename2 is not None:
        where += f" -> {exc.filename2}"
    hint = {
        errno.ENOENT: "check the path",
        errno.EACCES: "check its permissions or choose another path",
        errno.EPERM: "check its permissions or choose another path",
        errno.EISDIR: "give a file, not a directory",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.ENOSPC: "free some disk space",
        errno.EROFS: "choose a writable location",
        errno.EADDRINUSE: "stop what holds the port or choose another (port 0 picks a free one)",
        errno.ECONNREFUSED: "start it first, or check the address",
    }.get(exc.errno or 0, "check the path or address and try again")
    return f"{what}:{where}; {hint}" if where else f"{what}; {hint}"


def run_guarded(prog: str, run: Callable[[], int]) -> int:
    """Run a subcommand; whatever escapes it becomes one line on stderr and an exit code."""
    try:
        code = int(run())
        sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        _say(prog, describe_os_error(exc))
        return EXIT_USER_ERROR
    except Exception as exc:  # the one place that turns a crash into a line
        if os.environ.get(TRACEBACK_ENV):
            raise
        _say(
            prog,
            f"unexpected {type(exc).__name__}: {exc}. This is a bug in halcyon; rerun with "
            f"{TRACEBACK_ENV}=1 to see where, and report it",
        )
        return EXIT_BUG


def subcommand_parser(name: str, module: Any, help_text: str) -> CommandParser:
    """The parser of ``halcyon NAME``, configured by its module."""
    sub = CommandParser(prog=f"halcyon {name}", description=help_text)
    module.configure(sub)
    return sub


def run_subcommand(name: str, module: Any, help_text: str, argv: Sequence[str]) -> int:
    """``halcyon NAME ARGV...``: parse with the module's flags, then run it guarded."""
    sub = subcommand_parser(name, module, help_text)
    try:
        parsed = sub.parse_args(argv)
    except BrokenPipeError:  # `halcyon x --help | head`
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    return run_guarded(sub.prog, lambda: module.run(parsed))
