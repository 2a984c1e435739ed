"""The system tools some tests drive, and what a test does when one is missing.

What it decides: a test that needs a program this project does not install itself (Debian's
``promtool``, ``prometheus``, ``kubectl``, ``openssl``, ``node``, PostgreSQL's ``initdb`` and
``pg_ctl``) asks :func:`require_tool`. On a
developer's machine a missing tool skips the test with one line naming the package that provides
it; under CI (``CI`` set to anything but ``""``/``0``/``false``) the same absence fails the test,
because ``.ci/run`` installs every one of them and a skipped check there would be a silent hole.

Debian keeps a PostgreSQL server's programs off ``PATH`` (``/usr/lib/postgresql/N/bin``, see
:data:`OFF_PATH`); the same package's ``pg_ctlcluster`` is on it, and stands for them: with it
gone from ``PATH`` they count as missing too, so hiding ``PATH`` hides the package whole.

Tools the project installs itself (``grpcurl`` from PyPI into ``.venv``, ``buf`` from npm into
``.tools``, KServe into ``.tools/kserve``) are not listed: ``make test`` creates them first.
tests/support/test_missing_tools.py runs the tool-driven tests with these programs removed from
``PATH`` to prove they skip, and fail under CI, as promised.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

__all__ = [
    "OFF_PATH",
    "PACKAGES",
    "find_tool",
    "in_ci",
    "missing_message",
    "missing_packages",
    "require_tool",
]

# Program -> the Debian package that provides it (what .ci/run installs with apt-get).
PACKAGES: dict[str, str] = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "kubectl": "kubectl",
    "openssl": "openssl",
    "node": "nodejs",
    "npm": "npm",
    "chromium": "chromium",
    "chromedriver": "chromium-driver",
    "pg_ctlcluster": "postgresql",
    "initdb": "postgresql",
    "pg_ctl": "postgresql",
}

# Programs Debian installs off PATH -> (a glob of the directories that hold them, the program
# of the same package on PATH that must be there too). The newest version's directory wins.
OFF_PATH: dict[str, tuple[str, str]] = {
    "initdb": ("/usr/lib/postgresql/*/bin", "pg_ctlcluster"),
    "pg_ctl": ("/usr/lib/postgresql/*/bin", "pg_ctlcluster"),
}


def in_ci() -> bool:
    """True under CI: ``CI`` set to a non-empty value other than ``0``/``false``."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing_message(name: str) -> str:
    """The one line a skip (or CI failure) prints for a missing ``name``."""
    package = PACKAGES.get(name, name)
    return f"{name} not found: install Debian's {package} package (apt-get install {package})"


def find_tool(name: str) -> str | None:
    """The path of ``name`` (on ``PATH``, or where :data:`OFF_PATH` says), or None."""
    found = shutil.which(name)
    if found or name not in OFF_PATH:
        return found
    pattern, on_path = OFF_PATH[name]
    if shutil.which(on_path) is None:
        return None
    candidates = [os.path.join(d, name) for d in glob.glob(pattern)]
    present = [c for c in candidates if os.access(c, os.X_OK)]
    return max(present, key=_version_key) if present else None


def _version_key(path: str) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin/initdb`` -> (15,): numeric parts, so 15 sorts above 9."""
    return tuple(int(part) for part in path.split(os.sep) if part.isdigit())


def require_tool(name: str) -> str:
    """The path of ``name``; skips (a developer's machine) or fails (CI) when it is missing."""
    import pytest  # here, so .ci/run can ask for the missing packages before pytest exists

    path = find_tool(name)
    if path:
        return path
    if in_ci():
        pytest.fail(f"{missing_message(name)}; .ci/run installs it on CI", pytrace=False)
    pytest.skip(missing_message(name))


def missing_packages() -> list[str]:
    """The Debian packages whose programs are not on ``PATH`` (what .ci/run installs)."""
    return sorted({PACKAGES[name] for name in PACKAGES if find_tool(name) is None})


if __name__ == "__main__":  # .ci/run: `python3 tests/support/tools.py` lists what to install
    print(" ".join(missing_packages()))
    sys.exit(0)
