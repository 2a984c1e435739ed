"""The README as a new user reads it: its shell commands run, and what it says about the code is
what the code does.

Commands: every shell block (```sh / ```bash / ```shell / ```console, and ``$ `` lines in any
block) is cut into commands, and each one is run, in README order, in a fresh ``bash`` from the
repository's directory against one live ``halcyon stack --canary`` (the stack ``make stack``
starts). The shell's ``PATH`` has no virtualenv on it: a command works only if the README makes
it work (full ``.venv/bin`` paths, or the activation line the quickstart gives, which is run
before every command as a user's shell would have run it). The stack binds free ports, and the
default addresses in a command are replaced by the live ones. Long runs are shortened
(``halcyon loadtest`` to ``--seconds 1.5``, ``halcyon bench`` to ``--duration 2``). A command
whose README block shows an ``ERROR:`` must fail with the ``Code:`` and ``Message:`` shown.

Commands that cannot run here are skipped with their reason (:data:`SKIP`): cloning, ``make``
targets other than ``help``, starting more servers on the default ports, ``kubectl``.

The rest checks the README's claims against the code: the metric label domains, that every
flag of every subcommand is documented, that every ``ErrorInfo`` reason named exists, and that
the sample response has only real fields.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.command_frame import subcommand_parser
from common.errors import Reason
from gateway.metrics import FLUSH_REASONS, HEDGE_RESULTS, REQUEST_OUTCOMES, SHED_REASONS
from halcyon.tools.cli import SUBCOMMANDS
from halcyon.tools.launcher import read_ready
from halcyon.v1 import infer_pb2
from tests.support.tools import PACKAGES, require_tool
from tests.support.waiting import wait_until
from worker.metrics import BatchOutcome

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The README and the pages it hands its figures and reference to: their commands run as the
# README's do, and the claims below are checked against all of them.
DOCS = (
    README,
    ROOT / "docs" / "benchmarks.md",
    ROOT / "docs" / "reference" / "api.md",
    ROOT / "docs" / "reference" / "operations.md",
    ROOT / "docs" / "reference" / "lifecycle.md",
    ROOT / "docs" / "reference" / "rollouts.md",
    ROOT / "docs" / "reference" / "clients.md",
    ROOT / "docs" / "reference" / "console.md",
)
SHELL_LANGS = {"sh", "bash", "shell", "console"}
ACTIVATION = re.compile(r"^(?:\.|source) (?:\./)?\.venv/bin/activate$")
LOADTEST_SECONDS = 1.5
BENCH_DURATION_S = 2
COMMAND_TIMEOUT_S = 120

# (pattern on the command, why it is not run here)
SKIP: list[tuple[str, str]] = [
    (r"^git clone\b", "clones the repository; the test runs inside it"),
    (r"<[^<>]+>", "has a placeholder to fill in"),
    (
        r"^make (?!help\b)",
        "make targets install, format, run the whole suite (this test included) or start a "
        "stack on the default ports; `make help` is run",
    ),
    (
        r"^(?:\S*/)?halcyon (?:stack|controller|gateway|worker)\b",
        "starts long-running servers on the default ports; this test runs one stack on free "
        "ports, and tests/tools and tests/e2e start each server",
    ),
    (r"\bkubectl\b", "needs a Kubernetes cluster; tests/deploy renders the manifests offline"),
    (r"\bdocker\b", "needs a container runtime"),
    (r"\bkustomize\b", "edits the committed manifests; tests/deploy renders them offline"),
    (
        r"\bhalcyon rollout verify\b",
        "drives two minutes of load through four rollouts; tests/e2e/test_e2e_rollout.py runs it",
    ),
    (r"\bhalcyon rollout watch\b", "streams decisions until interrupted"),
    (
        r"\bhalcyon sweep\b",
        "starts a stack per point and drives ~8 minutes of load; tests/tools/test_sweep.py "
        "runs a short sweep",
    ),
    (
        r"scripts/(?:onnx_cost_curve|cost_model_convergence)\.py",
        "a measurement of a minute or more on a quiet machine; tests/worker runs the engine",
    ),
    (r"(?:^|/)pytest\b", "runs part of the test suite, which `make test` runs anyway"),
    (r"\bapt-get\b", "installs system packages (.ci/run does it on CI)"),
]

# Commands the README shows as alternatives: after one of them ended the rollout, the other
# finds none running and says so with this typed reason (exit 1).
ALTERNATIVES: list[tuple[str, str]] = [
    (r"\bhalcyon rollout (?:promote|abort)\b", "NO_ACTIVE_ROLLOUT"),
]


@dataclass
class Command:
    """One command of the README: its text (continuations joined), where it is, and what its
    block shows it printing (transcript blocks only)."""

    text: str
    line: int
    expected: list[str] = field(default_factory=list)
    source: str = "README"  # the page it is on
    # The whole shell block the command came from: a block that talks to a cluster
    # (kubectl) addresses what that block set up (a port-forward), not the local stack.
    block: str = ""

    @property
    def id(self) -> str:
        words = re.findall(r"[A-Za-z][\w.-]*", re.sub(r"^\S*/", "", self.text))
        page = "" if self.source == "README" else f"{Path(self.source).stem}-"
        return f"{page}L{self.line}-" + "-".join(words[:3])


def _strip_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` outside quotes after a space)."""
    quote: str | None = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _logical_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """(line number, text) with backslash continuations joined and comments dropped."""
    pending: list[str] = []
    start = 0
    for number, raw in lines:
        text = _strip_comment(raw)
        if not pending:
            start = number
        if text.endswith("\\"):
            pending.append(text[:-1].strip())
            continue
        pending.append(text.strip())
        joined = " ".join(p for p in pending if p)
        pending = []
        if joined:
            yield start, joined


def extract_commands(markdown: str) -> list[Command]:
    """Every command in the README's shell blocks, in order."""
    commands: list[Command] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```\s*([\w-]*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        lang = fence.group(1).lower()
        body: list[tuple[int, str]] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        prompted = any(text.startswith("$ ") for _, text in body)
        if prompted:
            commands += _transcript(body)
        elif lang in SHELL_LANGS:
            commands += [Command(text, n) for n, text in _logical_lines(body)]
        else:
            continue
        block = "\n".join(text for _, text in body)
        for command in commands:
            command.block = command.block or block
    return commands


def _transcript(body: list[tuple[int, str]]) -> list[Command]:
    """``$ command`` lines (with continuations) and the output shown after each."""
    commands: list[Command] = []
    i = 0
    while i < len(body):
        number, text = body[i]
        if not text.startswith("$ "):
            if commands:
                commands[-1].expected.append(text)
            i += 1
            continue
        chunk = [(number, text[2:])]
        while chunk[-1][1].rstrip().endswith("\\") and i + 1 < len(body):
            i += 1
            chunk.append(body[i])
        commands += [Command(t, n) for n, t in _logical_lines(chunk)]
        i += 1
    return commands


def skip_reason(command: Command) -> str | None:
    if ACTIVATION.match(command.text):
        return "the activation line itself: run before every command here"
    for pattern, reason in SKIP:
        if re.search(pattern, command.text):
            return reason
    if re.search(r"\bkubectl\b", command.block):
        return "part of a block that runs against a Kubernetes cluster (kubectl port-forward)"
    return None


# -- the live stack ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveStack:
    addresses: dict[str, str]  # default address in the README -> the live one

    def adapt(self, text: str) -> str:
        """The command against this stack, with long runs shortened."""
        for default, live in self.addresses.items():
            text = re.sub(rf"(?<![\w.]){re.escape(default)}(?!\d)", live, text)
        loadtest = re.search(r"\bhalcyon loadtest\b", text)
        if loadtest:
            extra = ""
            if "--target" not in text:
                extra += f" --target {self.addresses['127.0.0.1:50051']}"
            if re.search(r"--seconds[ =]\S+", text):
                text = re.sub(r"--seconds[ =]\S+", f"--seconds {LOADTEST_SECONDS}", text)
            else:
                extra += f" --seconds {LOADTEST_SECONDS}"
            text = text[: loadtest.end()] + extra + text[loadtest.end() :]
        rollout = re.search(r"\bhalcyon (?:rollout|fleet) \w+", text)
        if rollout:
            # This stack has no load to judge a canary on: start it, do not wait for the end.
            text = re.sub(r" --watch\b", "", text)
            if "--controller" not in text:
                end = rollout.end()
                text = (
                    text[:end] + f" --controller {self.addresses['127.0.0.1:50050']}" + text[end:]
                )
        bench = re.search(r"\bhalcyon bench\b", text)
        if bench and "--scenario rollout" in text and "--quick" not in text:
            # The full sweep takes most of an hour; --quick is its seconds-long smoke run (and
            # the doc's own seed counts, later on the line, would win over ours).
            text = re.sub(r" --(?:rival-aa-seeds|aa-seeds|seeds) \d+", "", text)
            bench = re.search(r"\bhalcyon bench\b", text)
            assert bench is not None
            text = text[: bench.end()] + " --quick --seeds 3 --aa-seeds 6" + text[bench.end() :]
        elif bench and "--duration" not in text and "--trace" not in text:
            end = bench.end()
            text = text[:end] + f" --duration {BENCH_DURATION_S}" + text[end:]
        return text


def _ready(state: Path, name: str, timeout_s: float) -> dict[str, Any]:
    path = state / f"{name}.ready.json"
    return wait_until(
        lambda: read_ready(path), timeout_s, f"{name} of the stack to be ready", interval_s=0.05
    )


def _wait_serving(address: str, timeout_s: float) -> None:
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)

        def serving() -> bool:
            reply = health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=2)
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        wait_until(
            serving, timeout_s, f"gateway {address} to be SERVING", interval_s=0.1,
            transient=(grpc.RpcError,),
        )  # fmt: skip


def _user_env() -> dict[str, str]:
    """A fresh shell's environment: no virtualenv on PATH, no Halcyon overrides."""
    venvs = {str(ROOT / ".venv" / "bin"), str(Path(sys.executable).parent)}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in venvs]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONHOME") and not k.startswith(("HALCYON_", "OTEL_"))
    }
    env["PATH"] = os.pathsep.join(path)
    return env


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    state = tmp_path_factory.mktemp("readme-stack")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HALCYON_", "OTEL_"))}
    stack = subprocess.Popen(
        [sys.executable, "-m", "halcyon", "stack", "--canary",
         "--gateway-listen", "127.0.0.1:0", "--gateway-metrics-listen", "127.0.0.1:0",
         "--controller-listen", "127.0.0.1:0", "--state-dir", str(state)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        controller = _ready(state, "controller", 60)
        gateway = _ready(state, "gateway", 60)
        worker = _ready(state, "replica-a", 60)
        _wait_serving(gateway["grpc"], 30)
        yield LiveStack(
            {
                "127.0.0.1:50051": gateway["grpc"],
                "127.0.0.1:9451": gateway["metrics"],
                "127.0.0.1:50050": controller["grpc"],
                "127.0.0.1:9450": controller["metrics"],
                "127.0.0.1:50060": worker["grpc"],
                "127.0.0.1:9460": worker["metrics"],
                "localhost:50051": gateway["grpc"],
                "localhost:50050": controller["grpc"],
            }
        )
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            stack.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stack.kill()
            stack.wait()


def _commands_of(page: Path) -> list[Command]:
    commands = extract_commands(page.read_text())
    for command in commands:
        command.source = "README" if page == README else str(page.relative_to(ROOT))
    return commands


README_TEXT = "\n".join(page.read_text() for page in DOCS)
COMMANDS = [command for page in DOCS for command in _commands_of(page)]
ACTIVATION_LINE = next((c.text for c in COMMANDS if ACTIVATION.match(c.text)), None)


def system_tools(command: Command) -> list[str]:
    """The system programs (:data:`tests.support.tools.PACKAGES`) the command runs."""
    words = [segment.split() for segment in re.split(r"&&|\|\||[;|]", command.text)]
    names = [Path(w[0]).name for w in words if w]
    return [name for name in names if name in PACKAGES]


@pytest.mark.e2e
@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_readme_command_runs_as_written(command: Command, request: pytest.FixtureRequest) -> None:
    reason = skip_reason(command)
    if reason is not None:
        pytest.skip(f"{command.source} line {command.line}: {reason}")
    for tool in system_tools(command):
        require_tool(tool)  # before the stack starts: a missing tool skips (fails under CI)
    live_stack: LiveStack = request.getfixturevalue("live_stack")
    text = live_stack.adapt(command.text)
    script = f"{ACTIVATION_LINE} && {text}" if ACTIVATION_LINE else text
    proc = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=_user_env(), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    where = f"{command.source} line {command.line}: {command.text}\n(ran: {script})"
    output = proc.stdout + proc.stderr
    assert "command not found" not in output, f"{where}\n{output}"
    assert "Traceback" not in output, f"{where}\n{output}"
    shown = [line.strip() for line in command.expected]
    if any(line.startswith("ERROR:") for line in shown):
        assert proc.returncode != 0, f"{where}: the README shows an error\n{output}"
        for line in shown:
            if line.startswith(("Code:", "Message:")):
                assert line in output, f"{where}: README shows {line!r}\n{output}"
    elif any(re.search(p, text) and reason in output for p, reason in ALTERNATIVES):
        assert proc.returncode == 1, f"{where}\nexit {proc.returncode}\n{output}"
    else:
        assert proc.returncode == 0, f"{where}\nexit {proc.returncode}\n{output}"


def python_blocks(markdown: str) -> list[tuple[int, str]]:
    """The README's ```python blocks (line of the fence, code): whole programs to run."""
    return [
        (markdown[: m.start()].count("\n") + 1, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```$", markdown, re.M | re.S)
    ]


PYTHON_BLOCKS = python_blocks(README.read_text())


@pytest.mark.e2e
@pytest.mark.parametrize(("line", "code"), PYTHON_BLOCKS, ids=[f"L{n}" for n, _ in PYTHON_BLOCKS])
def test_readme_python_runs_as_written(line: int, code: str, live_stack: LiveStack) -> None:
    """Each Python example, as the README says to run it (``.venv/bin/python``, from the
    repository), against the live stack: it prints an answer, not a traceback."""
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", live_stack.adapt(code)], cwd=ROOT,
        env=_user_env(), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in output, f"README line {line}\n{output}"
    assert proc.stdout.strip(), f"README line {line}: printed nothing"


def test_the_readme_shows_a_python_client() -> None:
    assert PYTHON_BLOCKS, "the README's first-hour client example is gone"


def test_the_readme_has_commands_to_run() -> None:
    runnable = [c for c in COMMANDS if skip_reason(c) is None]
    assert len(runnable) >= 5, [c.text for c in COMMANDS]
    assert ACTIVATION_LINE is not None or all(
        re.match(r"^(?:\.venv/bin/|/)", c.text) for c in runnable
    ), "commands need the activation line, or full .venv/bin paths"


def test_extraction_joins_continuations_and_reads_transcripts() -> None:
    text = (
        "```sh\n"
        "halcyon bench --json \\\n"
        "  --rates 50   # a comment\n"
        "\n"
        'grpcurl -d \'{"a": "#not a comment"}\' x  # comment\n'
        "```\n"
        "```\n"
        "$ grpcurl -plaintext \\\n"
        "    x y\n"
        "ERROR:\n"
        "  Code: InvalidArgument\n"
        "```\n"
    )
    commands = extract_commands(text)
    assert [c.text for c in commands] == [
        "halcyon bench --json --rates 50",
        'grpcurl -d \'{"a": "#not a comment"}\' x',
        "grpcurl -plaintext x y",
    ]
    assert [c.line for c in commands] == [2, 5, 8]
    assert commands[2].expected == ["ERROR:", "  Code: InvalidArgument"]


def test_adapting_shortens_runs_and_points_at_the_live_stack() -> None:
    stack = LiveStack({"127.0.0.1:50051": "127.0.0.1:4001", "127.0.0.1:9451": "127.0.0.1:4002"})
    assert stack.adapt("halcyon loadtest --clients 32 --seconds 20") == (
        "halcyon loadtest --target 127.0.0.1:4001 --clients 32 --seconds 1.5"
    )
    assert stack.adapt(
        ".venv/bin/halcyon loadtest --gateway-metrics 127.0.0.1:9451 --json | head -1"
    ) == (
        ".venv/bin/halcyon loadtest --target 127.0.0.1:4001 --seconds 1.5 "
        "--gateway-metrics 127.0.0.1:4002 --json | head -1"
    )
    assert stack.adapt("halcyon bench --scenario fleet") == (
        "halcyon bench --duration 2 --scenario fleet"
    )
    assert stack.adapt("halcyon bench --scenario rollout --jobs 2") == (
        "halcyon bench --quick --seeds 3 --aa-seeds 6 --scenario rollout --jobs 2"
    )
    assert stack.adapt("halcyon bench --scenario rollout --seeds 50 --aa-seeds 300 --json") == (
        "halcyon bench --quick --seeds 3 --aa-seeds 6 --scenario rollout --json"
    )
    assert stack.adapt("grpcurl 127.0.0.1:50051 x 127.0.0.1:500510") == (
        "grpcurl 127.0.0.1:4001 x 127.0.0.1:500510"
    )


# -- what the README says about the code ---------------------------------------------------------


def _table_row(metric: str) -> str:
    row = next((line for line in README_TEXT.splitlines() if line.startswith(f"| `{metric}`")), "")
    assert row, f"README's metrics table has no row for {metric}"
    return row


def _backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", text))


def test_request_outcome_labels_are_the_ones_the_readme_lists() -> None:
    documented = _backticked(_table_row("halcyon_gateway_requests_total").split("|")[3])
    assert documented == set(REQUEST_OUTCOMES)


def test_every_gateway_reason_is_counted_under_its_documented_label() -> None:
    from common.errors import RichError
    from gateway.app import _outcome_label

    groupings = {
        "MISSING_CREDENTIALS": "unauthenticated",
        "INVALID_CREDENTIALS": "unauthenticated",
        "INVALID_FIELD": "invalid_argument",
    }
    gateway_reasons = [
        Reason.QUOTA_EXCEEDED, Reason.OVERLOADED, Reason.QUEUE_FULL, Reason.NO_CAPACITY,
        Reason.DEADLINE_UNREACHABLE, Reason.DEADLINE_MISSED, Reason.UNKNOWN_MODEL,
        Reason.INVALID_FIELD, Reason.MISSING_CREDENTIALS, Reason.INVALID_CREDENTIALS,
        Reason.WRONG_ROLE, Reason.UPSTREAM_FAILURE, Reason.SHUTTING_DOWN, Reason.INTERNAL,
    ]  # fmt: skip
    for reason in gateway_reasons:
        err = RichError(grpc.StatusCode.UNAVAILABLE, "x", reason=reason)
        assert _outcome_label(err) == groupings.get(reason, reason.lower()), reason
    goodput = RichError(
        grpc.StatusCode.UNAVAILABLE, "x", reason=Reason.OVERLOADED, metadata={"shed": "goodput"}
    )
    assert _outcome_label(goodput) == "shed_for_goodput"


def test_other_label_domains_match_the_readme() -> None:
    shed = _backticked(_table_row("halcyon_gateway_shed_total").split("|")[3])
    assert shed == set(SHED_REASONS)
    flush = set(
        re.findall(r"[a-z]+", _table_row("halcyon_gateway_batch_flushes_total").split("|")[3])
    )
    assert set(FLUSH_REASONS) <= flush
    hedges = _table_row("halcyon_gateway_hedges_total").split("|")[3]
    assert all(result in hedges for result in HEDGE_RESULTS)
    batches = _table_row("halcyon_worker_batches_total").split("|")[3]
    assert {o.value for o in BatchOutcome} == {w.strip() for w in batches.split(",")}
    for reason in infer_pb2.FlushReason.keys():  # noqa: SIM118 - an enum wrapper, not a dict
        if reason != "FLUSH_REASON_UNSPECIFIED":
            assert f"`{reason.removeprefix('FLUSH_REASON_')}`" in README_TEXT, reason


def test_every_flag_of_every_subcommand_is_documented() -> None:
    missing = []
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        parser = subcommand_parser(name, importlib.import_module(module_name), help_text)
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in README_TEXT:
                    missing.append(f"halcyon {name} {option}")
    assert not missing, f"flags the README does not mention: {missing}"


def test_every_reason_the_readme_names_exists() -> None:
    section = README_TEXT[README_TEXT.index("### Errors") :]
    section = section[: section.find("\n#", 1)] if "\n#" in section[1:] else section
    rows = [line for line in section.splitlines() if line.startswith("|")]
    named = set(re.findall(r"\b[A-Z][A-Z_]{3,}[A-Z]\b", "\n".join(rows)))
    codes = set(grpc.StatusCode.__members__) | {"RESOURCE_EXHAUSTED"}
    unknown = {n for n in named if n not in codes and n not in Reason.__members__}
    assert not unknown, f"reasons in the README's error table that do not exist: {unknown}"


def test_the_sample_response_has_only_real_fields() -> None:
    start = README_TEXT.index("```json\n") + len("```json\n")
    sample = json.loads(README_TEXT[start : README_TEXT.index("```", start)])
    fields = set(infer_pb2.InferResponse.DESCRIPTOR.fields_by_name)
    assert set(sample) <= fields, set(sample) - fields
