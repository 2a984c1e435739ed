"""The image's install, done here as deploy/Dockerfile does it, then run.

No container runtime is needed: the Dockerfile is read, not copied. Its build stage's COPY
lines put the same files in a temporary source tree, and its RUN line (the one that runs
``pip install``) runs there under ``/bin/sh -c`` with the stage's ARG defaults and ENV, the
virtualenv path the runtime stage copies (``COPY --from=build``) moved under ``tmp_path``, and
``python`` the interpreter running these tests. Then, from that virtualenv only: ``halcyon
--version``; the grpcio pins of constraints.txt are what got installed; a controller, a worker
and a gateway start on 127.0.0.1:0 through the image's ENTRYPOINT (the e2e launcher, with
that program in place of ``python -m halcyon``), the gateway's gRPC health turns SERVING, it
answers an Infer, and gateway and worker report the completion-queue fast path
(``halcyon_serving_path_info{path="fast"}``) — which a grpcio release outside
``VERIFIED_GRPCIO`` turns off without failing anything else. A COPY that misses a package, a
RUN line that drops ``-c constraints.txt``, an extra that does not install: each fails here.

Needs PyPI (or the index pip is configured with): without it the install tests skip with one
line, and fail under CI. pip's cache is used (the image sets PIP_NO_CACHE_DIR, this does not),
so a warm run costs the virtualenv, the resolve and the unpacking: ~40 s for the default
image and ~55 s for ``EXTRAS=onnx`` on this 2-core machine; so ``make test`` installs the default
image only, and ``HALCYON_TEST_IMAGE_EXTRAS=1`` adds the ``EXTRAS=onnx`` one.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from deploy_support import DEPLOY, REPO, e2e  # type: ignore[import-not-found]
from grpc_health.v1 import health_pb2

from common.raw_unary import VERIFIED_GRPCIO
from tests.support.tools import in_ci

DOCKERFILE = DEPLOY / "Dockerfile"
CONSTRAINTS = REPO / "constraints.txt"
ALL_EXTRAS_ENV = "HALCYON_TEST_IMAGE_EXTRAS"
INSTALL_TIMEOUT_S = 900
SERVING = health_pb2.HealthCheckResponse.SERVING


# -- reading the Dockerfile ------------------------------------------------------------------


@dataclass
class Stage:
    """One ``FROM`` stage: its name and its instructions, continuations joined."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def stages(dockerfile: Path = DOCKERFILE) -> list[Stage]:
    found: list[Stage] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(words[0], name))
        else:
            assert found, f"{dockerfile}: {keyword} before FROM"
            found[-1].instructions.append((keyword, args))
    return found


@dataclass
class Install:
    """What the build stage does to install the package, read off the Dockerfile."""

    base: str  # the build stage's image, e.g. python:3.11-slim
    args: dict[str, str]  # ARG name -> default
    env: dict[str, str]
    workdir: str
    copies: list[tuple[list[str], str]]  # (sources in the build context, destination)
    run: str  # the RUN line that runs pip install
    venv: str  # the path the runtime stage copies out of the build stage


def install_recipe(dockerfile: Path = DOCKERFILE) -> Install:
    parsed = stages(dockerfile)
    builds = [s for s in parsed if any("pip install" in r for r in s.all("RUN"))]
    assert len(builds) == 1, f"{dockerfile}: expected one stage that runs pip install"
    [build] = builds
    assert not build.all("SHELL"), "the test runs RUN lines with /bin/sh -c, Docker's default"
    [run] = [r for r in build.all("RUN") if "pip install" in r]
    assert not run.startswith("["), "the pip install RUN line must be in shell form"
    args: dict[str, str] = {}
    for decl in build.all("ARG"):
        name, _, default = decl.partition("=")
        args[name] = shlex.split(default)[0] if shlex.split(default) else ""
    env: dict[str, str] = {}
    for decl in build.all("ENV"):
        for pair in shlex.split(decl):
            key, _, value = pair.partition("=")
            env[key] = value
    [workdir] = build.all("WORKDIR")
    copies = []
    for decl in build.all("COPY"):
        words = shlex.split(decl)
        assert not any(w.startswith("--") for w in words), f"COPY option not handled: {decl}"
        copies.append((words[:-1], words[-1]))
    outs = [
        shlex.split(c)
        for s in parsed
        for c in s.all("COPY")
        if c.startswith("--from=") and c.split()[0] == f"--from={build.name}"
    ]
    assert len(outs) == 1 and outs[0][1] == outs[0][2], f"expected one COPY --from: {outs}"
    venv = outs[0][1]
    assert venv in run, f"the RUN line does not build {venv}, which the runtime stage copies"
    return Install(build.base, args, env, workdir, copies, run, venv)


def constraint_pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: not a pin: {line}"
            pins[canonical(name)] = version
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- what can be checked without installing --------------------------------------------------


def test_the_image_installs_with_the_constraints_the_fast_path_is_verified_on() -> None:
    recipe = install_recipe()
    copied = set()
    for sources, dest in recipe.copies:
        into = len(sources) > 1 or dest.endswith("/")
        copied |= {
            Path(recipe.workdir, dest, src) if into else Path(recipe.workdir, dest)
            for src in sources
        }
    assert Path(recipe.workdir, "constraints.txt") in copied, "constraints.txt is not COPY'd"
    words = shlex.split(recipe.run)
    pip = words.index("install")
    options = words[pip:]
    assert "-c" in options and options[options.index("-c") + 1] == "constraints.txt", (
        f"pip install without -c constraints.txt: {recipe.run}"
    )
    grpcio = constraint_pins()["grpcio"]
    assert ".".join(grpcio.split(".")[:2]) in VERIFIED_GRPCIO, grpcio


def test_every_package_the_project_ships_is_copied_into_the_image() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    sources = {src for srcs, _ in install_recipe().copies for src in srcs}
    assert packages <= sources, f"packages not COPY'd: {sorted(packages - sources)}"
    assert {"pyproject.toml", project["project"]["readme"]} <= sources


def test_the_default_image_has_no_extras_and_onnx_is_a_build_arg() -> None:
    recipe = install_recipe()
    assert recipe.args.get("EXTRAS") == ""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "onnx" in extras


# -- the install, done -----------------------------------------------------------------------


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple/"


def _require_index() -> None:
    url = _index_url()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
            return
    except (urllib.error.URLError, OSError) as exc:
        message = f"no route to the package index {url} ({exc})"
    if in_ci():
        pytest.fail(f"{message}: the image install test needs it under CI", pytrace=False)
    pytest.skip(message)


def _copy_context(recipe: Install, root: Path) -> Path:
    """The build stage's filesystem after its COPY lines: ``root`` stands for ``/``."""
    workdir = root / recipe.workdir.lstrip("/")
    workdir.mkdir(parents=True)
    for sources, dest in recipe.copies:
        target = workdir / dest
        for src in sources:
            path = REPO / src
            assert path.exists(), f"COPY {src}: not in the build context"
            if path.is_dir():  # Docker copies a directory's contents into the destination
                shutil.copytree(path, target, dirs_exist_ok=True)
            elif len(sources) > 1 or dest.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return workdir


@dataclass
class Installed:
    venv: Path
    seconds: float

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name


def install_as_the_image_does(tmp_path: Path, extras: str | None = None) -> Installed:
    """Run the Dockerfile's pip install RUN line into a fresh virtualenv under ``tmp_path``
    (``extras`` stands for ``--build-arg EXTRAS=...``; None keeps the Dockerfile's default)."""
    recipe = install_recipe()
    tag = recipe.base.partition(":")[2]
    image_python = re.match(r"\d+\.\d+", tag)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert image_python, f"cannot tell the image's Python from {recipe.base}"
    if image_python.group() != here:
        message = f"the image runs Python {image_python.group()}, these tests {here}"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    _require_index()
    workdir = _copy_context(recipe, tmp_path / "build")
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_NO_CACHE", "VIRTUAL"))}
    env |= recipe.args | recipe.env
    if extras is not None:
        env["EXTRAS"] = extras
    # The image builds with PIP_NO_CACHE_DIR=1 (no cache left in a layer). Here pip's cache is
    # kept: the install is the same, only the wheels come from the local cache when they can.
    env.pop("PIP_NO_CACHE_DIR", None)
    # `python` is the interpreter running the tests (the image's is the base image's).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    command = recipe.run.replace(recipe.venv, str(venv))
    started = time.monotonic()
    result = subprocess.run(
        ["/bin/sh", "-c", command],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    print(f"\nimage install ({extras or 'default'}): {took:.1f} s")
    return Installed(venv, took)


# The e2e launcher's classes (tests.support.e2e, through deploy_support).
_Proc: Any = e2e.Proc
_Launcher: Any = e2e.Launcher


class VenvProc(_Proc):  # type: ignore[misc]
    """An e2e launcher process run by the image's ENTRYPOINT program in the virtualenv
    instead of ``python -m halcyon`` from this checkout; everything else as the launcher."""

    program: Path

    def start(self) -> VenvProc:
        real = subprocess.Popen

        def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
            assert argv[:3] == [sys.executable, "-m", "halcyon"], argv
            return real([str(self.program), *argv[3:]], **kwargs)

        with mock.patch.object(subprocess, "Popen", popen):
            super().start()
        return self


class VenvLauncher(_Launcher):  # type: ignore[misc]
    def __init__(self, workdir: Path, program: Path) -> None:
        super().__init__(workdir)
        self.program = program

    def spawn(self, name: str, *args: str) -> VenvProc:
        proc = VenvProc(name, list(args), self.workdir)
        proc.program = self.program
        self.procs.append(proc)
        return proc.start()


def _venv_python(installed: Installed, code: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(installed.bin("python")), "-c", code],
        cwd=cwd,
        env=e2e._env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.e2e
@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
@pytest.mark.parametrize("extras", [None, "onnx"], ids=["default", "extras-onnx"])
def test_the_image_install_runs_a_fleet_on_the_fast_path(
    tmp_path: Path, extras: str | None
) -> None:
    if extras and not os.environ.get(ALL_EXTRAS_ENV):
        # A second fresh install costs ~55 s of CI's 15 minutes; the ONNX runtime itself is
        # tested in tests/worker and tests/tools. Opt in to install the image's extras too.
        pytest.skip(f"EXTRAS={extras} install: set {ALL_EXTRAS_ENV}=1 to run it (~55 s)")
    installed = install_as_the_image_does(tmp_path, extras)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    halcyon = installed.bin("halcyon")

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = subprocess.run(
        [str(halcyon), "--version"], cwd=run_dir, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == f"halcyon {version}", result

    # What got installed: the constraints' pins, and the package itself (not this checkout).
    listed = json.loads(_venv_python(installed, _PIP_LIST, run_dir))
    versions = {canonical(name): v for name, v in listed["versions"].items()}
    for name, pin in constraint_pins().items():
        assert versions.get(name) == pin, f"{name}: installed {versions.get(name)}, pinned {pin}"
    assert Path(listed["halcyon"]).is_relative_to(installed.venv), listed["halcyon"]
    assert ("onnxruntime" in versions) == (extras == "onnx"), sorted(versions)

    worker_args: tuple[str, ...] = e2e.INSTANT
    if extras == "onnx":
        model = run_dir / "small.onnx"
        made = subprocess.run(
            [str(halcyon), "model", "generate", "--out", str(model), "--preset", "small"],
            cwd=run_dir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
        worker_args = ("--runtime", "onnx", "--model-file", str(model))

    launcher = VenvLauncher(run_dir, halcyon)
    try:
        fleet = launcher.fleet({"replica-a": worker_args}, converge_timeout_s=60.0)
        for proc in fleet.procs:  # the console script, run by the virtualenv's python
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
            assert bytes(halcyon) in argv, (proc.name, argv)
        for service in ("liveness", "readiness"):
            assert fleet.health(fleet.gateway, service) == SERVING, service
        reply = fleet.infer(max_output_tokens=4)
        assert reply.replica_id == "replica-a" and reply.version == "v1"
        for proc in (fleet.gateway, fleet.workers["replica-a"]):
            families = e2e.scrape(proc)
            assert e2e.sample(families, "halcyon_serving_path_info", path="fast") == 1, (
                f"{proc.name} is not on the fast path:\n{proc.log_tail()}"
            )
        assert fleet.gateway.stop() == 0, fleet.gateway.describe()
    finally:
        launcher.close()


_PIP_LIST = """
import importlib.metadata as m, json, halcyon
print(json.dumps({
    "versions": {d.metadata["Name"]: d.version for d in m.distributions()},
    "halcyon": halcyon.__file__,
}))
"""
