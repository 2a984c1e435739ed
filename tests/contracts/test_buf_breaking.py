"""``scripts/buf_breaking.sh`` catches a wire-incompatible contract change, and only that.

Each test makes a scratch git repository holding a copy of ``proto/`` and ``buf.yaml``,
commits it, commits a change on top, and runs the script there as CI runs it in the real
repository: the change is compared with the commit before it (``.git#ref=HEAD~1``). A renumbered
field or an incompatible type fails naming the field; an additive change passes; a widened
``uint32`` fails under the FILE category the project uses (it changes the JSON grpcurl prints
and the type in generated code) although the wire-only category would let it through.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "buf_breaking.sh"
BUF = REPO / ".tools" / "node_modules" / ".bin" / "buf"
INFER = Path("proto/halcyon/v1/infer.proto")
WORKER = Path("proto/halcyon/v1/worker.proto")
PIN = "@bufbuild/buf@1.75.0"


@pytest.fixture(autouse=True)
def _buf() -> None:
    # The project installs buf itself (`make lint`, which `make test` runs first).
    if not BUF.exists():
        pytest.fail(f"{BUF} missing: make lint installs it (npm install --prefix .tools {PIN})")


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid",
         "-c", "commit.gpgsign=false", *args],
        cwd=repo, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout


def run(repo: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("CI", "BUF_BREAKING_AGAINST")}
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=repo, env={**environ, **env},
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit: the contracts as they are in this tree."""
    root = tmp_path / "contracts"
    shutil.copytree(REPO / "proto", root / "proto")
    shutil.copy(REPO / "buf.yaml", root / "buf.yaml")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "contracts")
    return root


def commit_edit(repo: Path, path: Path, edit: Callable[[str], str]) -> None:
    text = (repo / path).read_text()
    changed = edit(text)
    assert changed != text, f"the edit changed nothing in {path}"
    (repo / path).write_text(changed)
    git(repo, "commit", "-q", "-am", "change")


def sub(pattern: str, replacement: str) -> Callable[[str], str]:
    """Replace the one match of ``pattern`` (a field declaration)."""

    def edit(text: str) -> str:
        new, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert count == 1, f"{pattern!r} matched {count} times"
        return new

    return edit


def test_a_renumbered_field_fails_naming_it(repo: Path) -> None:
    commit_edit(repo, INFER, sub(r"^  string input = 2;", "  string input = 9;"))
    out = run(repo)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert re.search(r'infer\.proto:\d+:\d+:.*"input"', out.stdout), out.stdout
    assert "breaks compatibility with HEAD~1" in out.stderr


def test_an_incompatible_type_change_fails_naming_the_field(repo: Path) -> None:
    commit_edit(repo, INFER, sub(r"^  string model = 1;", "  int64 model = 1;"))
    out = run(repo)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert re.search(r'infer\.proto:\d+:\d+:.*"model".*"string" to "int64"', out.stdout), out.stdout


def test_an_additive_change_passes(repo: Path) -> None:
    def add(text: str) -> str:
        text = text.replace(
            "message InferRequest {", "message InferRequest {\n  // New.\n  string note = 99;", 1
        )
        return text + "\n// New.\nmessage Extra {\n  // New.\n  string value = 1;\n}\n"

    commit_edit(repo, INFER, add)
    out = run(repo)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "compatible with HEAD~1" in out.stdout


def test_widening_uint32_to_uint64_fails_under_file_but_not_wire(repo: Path) -> None:
    """Same bytes on the wire, but JSON prints uint64 as a string ("64", not 64) and generated
    code changes type: FILE (and WIRE_JSON) flag it, WIRE alone would not."""
    # The base says uint32 whatever this tree says now; the change on top widens it.
    path = repo / INFER
    path.write_text(
        re.sub(r"(?m)^  uint\d\d tokens = 3;", "  uint32 tokens = 3;", path.read_text())
    )
    git(repo, "commit", "-q", "--allow-empty", "-am", "base: uint32")
    commit_edit(repo, INFER, sub(r"^  uint32 tokens = 3;", "  uint64 tokens = 3;"))

    out = run(repo)
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert re.search(r'"tokens".*"uint32" to "uint64"', out.stdout), out.stdout

    buf_yaml = repo / "buf.yaml"
    buf_yaml.write_text(
        re.sub(r"(?m)^(breaking:\n  use:\n    - )\w+", r"\1WIRE", buf_yaml.read_text())
    )
    git(repo, "commit", "-q", "--amend", "-a", "--no-edit")
    wire = run(repo)
    assert wire.returncode == 0, (wire.stdout, wire.stderr)


def test_the_first_commit_has_nothing_to_break(repo: Path) -> None:
    for ci in ("", "true"):
        out = run(repo, CI=ci)
        assert out.returncode == 0, (ci, out.stdout, out.stderr)
        assert out.stdout.strip() == (
            "buf_breaking: skipped: HEAD~1 does not exist (the first commit has nothing to break)"
        )


def test_a_shallow_clone_fetches_the_previous_commit_or_says_it_could_not(
    repo: Path, tmp_path: Path
) -> None:
    commit_edit(repo, WORKER, lambda text: text + "\n// A comment.\n")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))

    out = run(shallow)  # the remote answers: one more commit is fetched and compared
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "compatible with HEAD~1" in out.stdout

    cut = tmp_path / "cut"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(cut))
    git(cut, "remote", "remove", "origin")  # offline: nothing to deepen from
    for ci, prefix in (("", ""), ("true", "WARNING: ")):
        out = run(cut, CI=ci)
        assert out.returncode == 0, (ci, out.stdout, out.stderr)
        assert out.stderr.strip().splitlines() == [
            f"buf_breaking: {prefix}skipped: HEAD~1 is not in this shallow clone and could not "
            "be fetched (git fetch --deepen=1 to check)"
        ], out.stderr
