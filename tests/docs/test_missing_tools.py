"""``make test`` on a machine without the system tools: every test that drives one skips with one
line naming the Debian package, and under CI the same absence fails.

The tests that ask :func:`tests.support.tools.require_tool` for a program, or take the root
conftest's ``pki`` fixture (``openssl``), found here by reading the test sources so a new one is
covered without a list to keep, run again in a child pytest
whose ``PATH`` really lacks every program of :data:`tests.support.tools.PACKAGES`: each
``PATH`` directory that holds one is replaced by a directory of links to everything else in it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tools import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SELF = Path(__file__).resolve()
_NAMES_PACKAGE = re.compile(r"[\w-]+ not found: install Debian's [\w-]+ package")
USES_TOOL = re.compile(r"\brequire_tool\(\s*\"([\w-]+)\"")
USES_PKI = re.compile(r"\bpki: Path\b")


def tool_tests() -> dict[Path, set[str]]:
    """Test files that ask for a system tool, with the tools each asks for by name."""
    found: dict[Path, set[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.resolve() == SELF:
            continue
        text = path.read_text()
        names = set(USES_TOOL.findall(text))
        if USES_PKI.search(text):
            names.add("openssl")  # the root conftest's ``pki`` fixture makes certificates with it
        if names:
            found[path] = names
    return found


def hidden_path(tmp: Path) -> str:
    """``PATH`` with no program of :data:`PACKAGES` on it, everything else still reachable."""
    dirs: list[str] = []
    for i, entry in enumerate(os.environ.get("PATH", "").split(os.pathsep)):
        d = Path(entry)
        if not d.is_dir() or not any((d / name).exists() for name in PACKAGES):
            dirs.append(entry)
            continue
        shadow = tmp / f"path{i}"
        shadow.mkdir()
        for item in d.iterdir():
            if item.name not in PACKAGES:
                (shadow / item.name).symlink_to(item)
        dirs.append(str(shadow))
    return os.pathsep.join(dirs)


def _run(targets: list[str], path: str, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = path
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsfE", "-p", "no:cacheprovider", *targets],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _readme_tool_commands() -> list[str]:
    from tests.docs import test_readme  # the README's commands, as that test collects them

    return [
        f"tests/docs/test_readme.py::test_readme_command_runs_as_written[{c.id}]"
        for c in test_readme.COMMANDS
        if test_readme.system_tools(c) and test_readme.skip_reason(c) is None
    ]


@pytest.fixture(scope="module")
def targets() -> tuple[list[str], set[str]]:
    files = tool_tests()
    assert files, "no test asks require_tool for a program: this test has nothing to prove"
    names = set().union(*files.values())
    return [str(p.relative_to(ROOT)) for p in files] + _readme_tool_commands(), names


@pytest.mark.e2e
def test_without_the_tools_each_test_skips_naming_its_package(
    targets: tuple[list[str], set[str]], tmp_path: Path
) -> None:
    selected, names = targets
    proc = _run(selected, hidden_path(tmp_path), ci=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped, out
    assert all(_NAMES_PACKAGE.search(line) for line in skipped), out  # one line naming it
    for package in {PACKAGES[name] for name in names}:
        assert any(f"Debian's {package} package" in line for line in skipped), (package, out)


@pytest.mark.e2e
def test_without_the_tools_under_ci_the_same_tests_fail(
    targets: tuple[list[str], set[str]], tmp_path: Path
) -> None:
    selected, names = targets
    proc = _run(selected, hidden_path(tmp_path), ci=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert not [line for line in skipped if "not found: install Debian's" in line], out
    failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
    for package in {PACKAGES[name] for name in names}:
        assert any(f"Debian's {package} package" in line for line in failed), (package, out)


def test_the_hidden_path_really_hides_them(tmp_path: Path) -> None:
    path = hidden_path(tmp_path)
    for name in PACKAGES:
        found = subprocess.run(
            ["bash", "-c", f"command -v {name}"], env={"PATH": path}, capture_output=True,
            check=False,
        )  # fmt: skip
        assert found.returncode != 0, (name, found.stdout)
    ls = subprocess.run(["bash", "-c", "command -v ls"], env={"PATH": path}, check=False)
    assert ls.returncode == 0, "everything else stays reachable"
