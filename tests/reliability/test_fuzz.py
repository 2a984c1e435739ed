"""Fuzzed requests: whatever a client sends, the answer is typed and the server stays up.

Two generators, both hypothesis (derandomized, so CI replays the same examples):

* every ``InferRequest`` field at once — model, input (up to past its 65,536-byte limit),
  max output tokens over all of uint32, session key, priority and lane over all of int32
  (unknown enum values included), a ``timeout`` Duration over the full int64 range with
  out-of-range nanos, and the credential (right, missing, unknown) — sent with **no** gRPC
  deadline, so the ``timeout`` field is the request's deadline, as for a grpcurl user;
* raw bytes to every RPC of every Halcyon service (the methods are read from the proto
  descriptors, so a new RPC is fuzzed without touching this file), unary or streaming, with the
  credential the method's role needs: the gateway's ``InferService``, a standalone worker's
  ``WorkerService`` (standalone, so a fuzzed ``Drain`` drains nothing the gateway uses), and
  the controller's ``ControlService``.

and three scenarios of hostile values that once got through (issue #24; generators and
expected answers in ``fuzz_hostile``): Durations over the whole int64 range in ``StartRollout``
policies (``INVALID_ARGUMENT`` whenever out of range) and in ``ReportOutcomes`` (answered OK,
items dropped, GetState still printable as JSON); batches up to the worker's exact limits
(4,096 items x (2**20 - 1) tokens, answered OK with the whole sum on both serving paths); and
identifiers up to 1 MiB in every controller RPC that takes one (typed, with a message a C-core
client can still read).

Every answer must be ``OK`` or a status with a Halcyon ``ErrorInfo`` — never ``UNKNOWN`` or
``INTERNAL``; an ``InferRequest`` is answered with one of ``INVALID_ARGUMENT``, ``NOT_FOUND``,
``UNAUTHENTICATED``, ``RESOURCE_EXHAUSTED`` (or ``DEADLINE_EXCEEDED`` / ``DEADLINE_UNREACHABLE``
when its own timeout is too short to serve it); bytes that do not decode as the method's
request message get ``INVALID_ARGUMENT`` (``UNAUTHENTICATED`` if the credential is wrong).
After every example the same server must answer a valid request (Infer, Describe, GetState).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fuzz_hostile as hostile
import grpc
import pytest
from google.protobuf import duration_pb2, json_format
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reliability_fleet import API_KEY, INSTANT, MODEL
from reliability_load import outcome_key
from reliability_table import Row, is_answer, sheds_by_reason

from common.auth import AuthPolicy, Role
from halcyon.v1 import control_pb2, infer_pb2, worker_pb2

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

FLEET_TOKEN = "e2e-fleet-token"  # the launcher's (tests/support/e2e.py)
OPERATOR_TOKEN = "e2e-operator-token"
INFER_EXAMPLES = 300
RAW_EXAMPLES = 100  # per RPC
# How long a call may take to be answered; a fuzzed Infer has no gRPC deadline of its own.
ANSWER_WITHIN_S = 5.0
# How long a server stream is read: a valid watch stays open, which is fine.
STREAM_READ_S = 1.0
INFER_CODES = {"INVALID_ARGUMENT", "NOT_FOUND", "UNAUTHENTICATED", "RESOURCE_EXHAUSTED"}
NEVER = {"UNKNOWN", "INTERNAL"}
REFUSED = {"INVALID_ARGUMENT", "UNAUTHENTICATED"}
INFER = "/halcyon.v1.InferService/Infer"
DESCRIBE = "/halcyon.v1.WorkerService/Describe"
GET_STATE = "/halcyon.v1.ControlService/GetState"
HOT_METHODS = {INFER, "/halcyon.v1.WorkerService/ExecuteBatch"}
SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a slow server would make it slow
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def fleet(launcher: Any) -> Any:
    return launcher.fleet({"replica-a": INSTANT})


@pytest.fixture(scope="module")
def aio_gateway(launcher: Any, fleet: Any) -> Any:
    """A second gateway serving Infer through grpc.aio instead of the completion queue."""
    proc = launcher.gateway(fleet.controller, "--serving-path", "aio", name="gateway-aio")
    proc.wait_ready()
    return proc


def _standalone_worker(launcher: Any, serving_path: str) -> Any:
    name = f"standalone-{serving_path}"
    proc = launcher.spawn(
        name, "worker", "--replica-id", name, "--serving-path", serving_path, *INSTANT
    )
    proc.wait_ready()
    return proc


@dataclass
class Findings:
    """Every fuzzed call's outcome, and what broke the rules."""

    calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    def record(self, where: str, outcome: str, ms: float, problem: str | None) -> None:
        self.calls += 1
        self.outcomes[outcome] += 1
        self.codes[outcome.partition("/")[0]] += 1
        self.latencies_ms.append(ms)
        if problem is not None:
            self.violations.append(f"{where[:120]}: {problem}")


def _judge(outcome: str, allowed: set[str] | None) -> str | None:
    """What is wrong with an outcome (None: nothing). ``allowed``: the codes it may have."""
    code = outcome.partition("/")[0]
    if outcome == "OK":
        return None
    if not is_answer(outcome):
        return f"{outcome} without a Halcyon ErrorInfo"
    if code in NEVER:
        return f"{outcome}"
    if allowed is not None and code not in allowed:
        return f"{outcome}, expected one of {sorted(allowed)}"
    return None


# -- one call of any kind ----------------------------------------------------------------------


def _unary(channel: grpc.Channel, path: str, body: bytes, md: Any, timeout: float | None) -> str:
    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    future = call.future(body, metadata=md, timeout=timeout)
    try:
        future.result(timeout=ANSWER_WITHIN_S + 1.0)
    except grpc.FutureTimeoutError:
        future.cancel()
        return "no answer"
    except grpc.RpcError as err:
        return outcome_key(err)
    return "OK"


def _streaming(channel: grpc.Channel, m: MethodDescriptor, body: bytes, md: Any) -> str:
    path = f"/{m.containing_service.full_name}/{m.name}"
    kw: dict[str, Any] = {"request_serializer": None, "response_deserializer": None}
    if not m.server_streaming:  # client streaming: send the one message, read the answer
        call = channel.stream_unary(path, **kw)
        try:
            call(iter([body]), metadata=md, timeout=ANSWER_WITHIN_S)
        except grpc.RpcError as err:
            return outcome_key(err)
        return "OK"
    if m.client_streaming:
        responses = channel.stream_stream(path, **kw)(iter([body]), metadata=md)
    else:
        responses = channel.unary_stream(path, **kw)(body, metadata=md)
    # A valid watch or session stays open: read what arrives for a moment, then hang up.
    first: list[str] = []

    def read() -> None:
        try:
            for _ in responses:
                first.append("OK")
                return
            first.append("OK")  # ended cleanly
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED or not first:
                first.append(outcome_key(err))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(STREAM_READ_S)
    responses.cancel()
    reader.join(ANSWER_WITHIN_S)
    if not first:
        return "OK"  # open and quiet when we hung up: a valid watch with nothing to say yet
    return first[0] if first[0] != "CANCELLED" else "OK"


# -- the targets ---------------------------------------------------------------------------------


@dataclass
class Target:
    """A server and how to ask it something valid."""

    role: str  # "gateway", "worker" or "controller": whose credentials its methods take
    channel: grpc.Channel
    check: Callable[[], str]  # a valid request's outcome


def _metadata(token: str | None, header: str = "authorization") -> tuple[tuple[str, str], ...]:
    if token is None:
        return ()
    return ((header, token),) if header == "x-api-key" else ((header, f"Bearer {token}"),)


def _token_for(role: Role | None) -> str | None:
    return {Role.FLEET: FLEET_TOKEN, Role.OPERATOR: OPERATOR_TOKEN}.get(role) if role else None


@pytest.fixture(scope="module")
def targets(launcher: Any, fleet: Any, aio_gateway: Any) -> Iterator[dict[str, Target]]:
    """Every server to fuzz, by name; the ``-aio`` ones serve their hot method through aio."""
    addresses = {
        "gateway": fleet.gateway.grpc,
        "gateway-aio": aio_gateway.grpc,
        "worker": _standalone_worker(launcher, "fast").grpc,
        "worker-aio": _standalone_worker(launcher, "aio").grpc,
        "controller": fleet.controller.grpc,
    }
    channels = {name: grpc.insecure_channel(address) for name, address in addresses.items()}
    valid = {
        "gateway": (
            INFER,
            infer_pb2.InferRequest(model=MODEL, input="still there?").SerializeToString(),
            _metadata(API_KEY, "x-api-key"),
        ),
        "worker": (
            DESCRIBE,
            worker_pb2.DescribeRequest().SerializeToString(),
            _metadata(FLEET_TOKEN),
        ),
        "controller": (
            GET_STATE,
            control_pb2.GetStateRequest().SerializeToString(),
            _metadata(OPERATOR_TOKEN),
        ),
    }

    def target(name: str) -> Target:
        role = name.removesuffix("-aio")
        path, body, md = valid[role]
        channel = channels[name]
        return Target(role, channel, lambda: _unary(channel, path, body, md, ANSWER_WITHIN_S))

    yield {name: target(name) for name in channels}
    for channel in channels.values():
        channel.close()


def _after(target: Target, findings: Findings, where: str) -> None:
    """The valid request right after a fuzzed one: it must succeed."""
    t0 = time.monotonic()
    outcome = target.check()
    problem = None if outcome == "OK" else f"a valid request right after got {outcome}"
    findings.record(f"{where} (then valid)", outcome, (time.monotonic() - t0) * 1000, problem)


# -- the generators ----------------------------------------------------------------------------

_INT32 = st.integers(-(2**31), 2**31 - 1)
_text = st.one_of(
    st.text(max_size=64), st.builds(str.__mul__, st.sampled_from("aé\x00"), st.integers(0, 70_000))
)
_duration = st.builds(
    duration_pb2.Duration,
    seconds=st.one_of(
        st.integers(-5, 5),
        st.integers(0, 10**12),
        st.integers(-(2**63), 2**63 - 1),
        st.just(10_000_000_000),
    ),
    nanos=st.one_of(st.integers(0, 999_999_999), _INT32),
)
_infer_requests = st.builds(
    infer_pb2.InferRequest,
    model=st.one_of(st.just(MODEL), _text),
    input=_text,
    max_output_tokens=st.one_of(st.integers(0, 5000), st.integers(0, 2**32 - 1)),
    session_key=_text,
    priority=st.one_of(st.integers(0, 3), _INT32),
    lane=st.one_of(st.integers(0, 2), _INT32),
    timeout=st.one_of(st.none(), _duration),
)
_credentials = st.sampled_from([API_KEY, API_KEY, "demo-key-batch", None, "no-such-key"])


def _fuzz_infer(target: Target, findings: Findings) -> None:
    @settings(SETTINGS, max_examples=INFER_EXAMPLES)
    @given(request=_infer_requests, key=_credentials)
    def example(request: infer_pb2.InferRequest, key: str | None) -> None:
        t0 = time.monotonic()
        outcome = _unary(
            target.channel,
            INFER,
            request.SerializeToString(),
            _metadata(key, "x-api-key"),
            None,  # no gRPC deadline: the timeout field is the deadline
        )
        allowed = INFER_CODES | {"DEADLINE_EXCEEDED"}
        problem = _judge(outcome, allowed)
        if outcome.startswith("DEADLINE_EXCEEDED/") and outcome != (
            "DEADLINE_EXCEEDED/DEADLINE_UNREACHABLE"
        ):
            problem = f"{outcome} for an idle fleet"
        where = f"gateway:Infer({_short(request)}, key={key!r})"
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)
        _after(target, findings, where)

    example()


def _short(request: Message) -> str:
    text = str(request).replace("\n", " ")
    return text if len(text) < 160 else text[:157] + "..."


def _decodes(request_class: type[Message], body: bytes) -> bool:
    try:
        request_class.FromString(body)
    except DecodeError:
        return False
    return True


def _methods() -> list[tuple[str, MethodDescriptor]]:
    """(target, method) for every RPC of every Halcyon service, and the hot methods (served
    off the completion queue by default) once more on a process serving them through aio."""
    found = []
    for module, server in (
        (infer_pb2, "gateway"),
        (worker_pb2, "worker"),
        (control_pb2, "controller"),
    ):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                found.append((server, m))
                if f"/{service.full_name}/{m.name}" in HOT_METHODS:
                    found.append((f"{server}-aio", m))
    return found


_CONTROL_ROLES = AuthPolicy(fleet_token="f", operator_token="o")


def _role(server: str, path: str) -> tuple[str | None, str]:
    """The token a method needs and the header it goes in."""
    if server == "gateway":
        return API_KEY, "x-api-key"
    if server == "worker":
        return FLEET_TOKEN, "authorization"
    return _token_for(_CONTROL_ROLES.required(path)), "authorization"


def _fuzz_raw(
    target_name: str, target: Target, method: MethodDescriptor, findings: Findings
) -> None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    token, header = _role(target.role, path)
    request_class = GetMessageClass(method.input_type)
    streaming = method.client_streaming or method.server_streaming

    @settings(SETTINGS, max_examples=RAW_EXAMPLES)
    @given(body=st.binary(max_size=256), credential=st.sampled_from(["right", "right", "none"]))
    def example(body: bytes, credential: str) -> None:
        md = _metadata(token if credential == "right" else None, header)
        t0 = time.monotonic()
        if streaming:
            outcome = _streaming(target.channel, method, body, md)
        else:
            outcome = _unary(target.channel, path, body, md, ANSWER_WITHIN_S)
        # Undecodable bytes or no credential: refused as one or the other (which check comes
        # first is the server's choice).
        allowed = None if _decodes(request_class, body) else REFUSED
        if credential == "none" and token is not None:
            allowed = REFUSED
        shown = f"{body[:24]!r}{'...' if len(body) > 24 else ''}"
        where = f"{target_name}:{method.name}({shown}, {credential})"
        problem = _judge(outcome, allowed)
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)
        _after(target, findings, where)

    example()


def test_fuzzed_requests(targets: dict[str, Target], scoreboard: Any) -> None:
    findings = Findings()
    _fuzz_infer(targets["gateway"], findings)
    for server, method in _methods():
        _fuzz_raw(server, targets[server], method, findings)

    answered = sum(n for k, n in findings.outcomes.items() if is_answer(k))
    latencies = sorted(findings.latencies_ms)
    row = Row(
        scenario=f"fuzzed requests ({len({m.full_name for _, m in _methods()})} RPCs)",
        requests=findings.calls,
        answered=answered,
        p99_ms=latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        sheds=sheds_by_reason(findings.outcomes),
        lost_detail={k: n for k, n in findings.outcomes.items() if not is_answer(k)},
    )
    row.notes.append("codes: " + ", ".join(f"{c} {n:,}" for c, n in findings.codes.most_common()))
    if findings.violations:
        by_rpc = Counter(v.partition("(")[0] for v in findings.violations)
        row.notes.append(
            "broken answers by RPC: " + ", ".join(f"{m} {n}" for m, n in by_rpc.most_common())
        )
        row.failures.append(
            f"{len(findings.violations)} answers broke the rules, e.g. "
            + "; ".join(findings.violations[:: max(1, len(findings.violations) // 2)][:2])
        )
    scoreboard.check(row)


# -- hostile values (issue #24) ----------------------------------------------------------------

HOSTILE_EXAMPLES = 60
LIMIT_EXAMPLES = 8  # per serving path: each batch is up to 4,096 items
START_ROLLOUT = "/halcyon.v1.ControlService/StartRollout"
REPORT_OUTCOMES = "/halcyon.v1.ControlService/ReportOutcomes"
WORKER_SESSION = "/halcyon.v1.ControlService/WorkerSession"


def _answer(call: Callable[[], Any]) -> tuple[str, str, Any]:
    """(outcome key, status message, the response) of a call that ends within its timeout."""
    try:
        response = call()
    except grpc.RpcError as err:
        details = err.details() if callable(getattr(err, "details", None)) else ""
        return outcome_key(err), str(details or ""), None
    return "OK", "", response


def _row(scenario: str, findings: Findings) -> Row:
    answered = sum(n for k, n in findings.outcomes.items() if is_answer(k))
    latencies = sorted(findings.latencies_ms)
    row = Row(
        scenario=scenario,
        requests=findings.calls,
        answered=answered,
        p99_ms=latencies[int(0.99 * (len(latencies) - 1))] if latencies else None,
        sheds=sheds_by_reason(findings.outcomes),
        lost_detail={k: n for k, n in findings.outcomes.items() if not is_answer(k)},
    )
    row.notes.append("codes: " + ", ".join(f"{c} {n:,}" for c, n in findings.codes.most_common()))
    if findings.violations:
        row.failures.append(
            f"{len(findings.violations)} answers broke the rules, e.g. "
            + "; ".join(findings.violations[:2])
        )
    return row


def test_hostile_durations(targets: dict[str, Target], scoreboard: Any) -> None:
    controller = targets["controller"]
    operator, fleet_md = _metadata(OPERATOR_TOKEN), _metadata(FLEET_TOKEN)
    start = controller.channel.unary_unary(
        START_ROLLOUT,
        request_serializer=control_pb2.StartRolloutRequest.SerializeToString,
        response_deserializer=control_pb2.StartRolloutResponse.FromString,
    )
    report = controller.channel.stream_unary(
        REPORT_OUTCOMES,
        request_serializer=control_pb2.ReportOutcomesRequest.SerializeToString,
        response_deserializer=control_pb2.ReportOutcomesResponse.FromString,
    )
    get_state = controller.channel.unary_unary(
        GET_STATE,
        request_serializer=control_pb2.GetStateRequest.SerializeToString,
        response_deserializer=control_pb2.GetStateResponse.FromString,
    )
    findings = Findings()

    @settings(SETTINGS, max_examples=HOSTILE_EXAMPLES)
    @given(policy=hostile.policies, d=hostile.durations)
    def example(policy: control_pb2.RolloutPolicy, d: duration_pb2.Duration) -> None:
        request = control_pb2.StartRolloutRequest(model=MODEL, canary_version="v-fuzz")
        request.policy.CopyFrom(policy)
        t0 = time.monotonic()
        outcome, _, _ = _answer(lambda: start(request, metadata=operator, timeout=5))
        problem = _judge(outcome, None)
        if hostile.policy_durations_out_of_range(policy) and outcome != (
            "INVALID_ARGUMENT/INVALID_FIELD"
        ):
            problem = f"{outcome} for an out-of-range policy Duration"
        where = f"controller:StartRollout({_short(policy)})"
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)

        t0 = time.monotonic()
        sent = hostile.hostile_report(d, MODEL)
        outcome, _, _ = _answer(lambda: report(iter([sent]), metadata=fleet_md, timeout=5))
        problem = None if outcome == "OK" else f"the report stream ended {outcome}"
        where = f"controller:ReportOutcomes({_short(d)})"
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)

        # What grpcurl does with GetState: print it as JSON. A Duration no JSON can say (the
        # fuzzed cost model, a stored policy) would break it for every operator.
        t0 = time.monotonic()
        outcome, _, state = _answer(
            lambda: get_state(control_pb2.GetStateRequest(), metadata=operator, timeout=5)
        )
        problem = None if outcome == "OK" else f"GetState got {outcome}"
        if state is not None:
            try:
                json_format.MessageToJson(state)
            except Exception as exc:
                problem = f"GetState no longer prints as JSON: {exc}"
        findings.record(
            "controller:GetState (as JSON)", outcome, (time.monotonic() - t0) * 1000, problem
        )

    example()
    scoreboard.check(_row("hostile durations (StartRollout, ReportOutcomes)", findings))


def _fuzz_limits(name: str, target: Target, findings: Findings) -> None:
    execute = target.channel.unary_unary(
        "/halcyon.v1.WorkerService/ExecuteBatch",
        request_serializer=worker_pb2.ExecuteBatchRequest.SerializeToString,
        response_deserializer=worker_pb2.ExecuteBatchResponse.FromString,
    )
    fleet_md = _metadata(FLEET_TOKEN)

    @settings(SETTINGS, max_examples=LIMIT_EXAMPLES)
    @given(shape=hostile.batch_shapes)
    def example(shape: tuple[int, int]) -> None:
        items, tokens = shape
        request = hostile.batch(MODEL, items, tokens)
        t0 = time.monotonic()
        outcome, _, reply = _answer(lambda: execute(request, metadata=fleet_md, timeout=30))
        problem = None if outcome == "OK" else f"{outcome} for a batch within the limits"
        if reply is not None and reply.batch_tokens != items * tokens:
            problem = f"batch_tokens {reply.batch_tokens}, sent {items * tokens}"
        where = f"{name}:ExecuteBatch({items} x {tokens} tokens)"
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)
        _after(target, findings, where)

    example()


def test_batches_at_the_limits(targets: dict[str, Target], scoreboard: Any) -> None:
    findings = Findings()
    for name in ("worker", "worker-aio"):
        _fuzz_limits(name, targets[name], findings)
    scoreboard.check(_row("batches at the limits (4,096 x (2^20 - 1) tokens)", findings))


def _judge_identifier(outcome: str, message: str, value: str, limit: int) -> str | None:
    problem = _judge(outcome, None)
    if len(value) > limit and outcome != "INVALID_ARGUMENT/INVALID_FIELD":
        problem = f"{outcome} for {len(value):,} characters (limit {limit})"
    if len(message) > hostile.SHORT_MESSAGE:
        problem = f"a {len(message):,}-character message echoes the request"
    return problem


def _fuzz_identifier(
    controller: Target, method: str, field_name: str, limit: int, findings: Findings
) -> None:
    call = controller.channel.unary_unary(f"/halcyon.v1.ControlService/{method}")
    md = _metadata(OPERATOR_TOKEN)

    @settings(SETTINGS, max_examples=HOSTILE_EXAMPLES // 3)
    @given(value=hostile.identifiers)
    def example(value: str) -> None:
        body = hostile.identifier_request(method, field_name, value)
        t0 = time.monotonic()
        outcome, message, _ = _answer(lambda: call(body, metadata=md, timeout=5))
        where = f"controller:{method}({field_name} of {len(value):,} chars)"
        problem = _judge_identifier(outcome, message, value, limit)
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)
        _after(controller, findings, where)

    example()


def _fuzz_registration(controller: Target, findings: Findings) -> None:
    session = controller.channel.stream_stream(WORKER_SESSION)
    md = _metadata(FLEET_TOKEN)

    @settings(SETTINGS, max_examples=HOSTILE_EXAMPLES // 3)
    @given(value=hostile.identifiers.filter(lambda v: len(v) > hostile.MAX_ID_CHARS))
    def example(value: str) -> None:
        body = hostile.registration(value)

        def first() -> Any:
            for response in session(iter([body]), metadata=md, timeout=5):
                return response
            return None

        t0 = time.monotonic()
        outcome, message, _ = _answer(first)
        where = f"controller:WorkerSession(replica_id of {len(value):,} chars)"
        problem = _judge_identifier(outcome, message, value, hostile.MAX_ID_CHARS)
        findings.record(where, outcome, (time.monotonic() - t0) * 1000, problem)
        _after(controller, findings, where)

    example()


def test_overlong_identifiers(targets: dict[str, Target], scoreboard: Any) -> None:
    findings = Findings()
    for method, field_name, limit in hostile.IDENTIFIER_RPCS:
        _fuzz_identifier(targets["controller"], method, field_name, limit, findings)
    _fuzz_registration(targets["controller"], findings)
    scoreboard.check(_row("overlong identifiers (1 MiB, 7 RPCs)", findings))
