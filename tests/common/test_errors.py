"""Rich errors: the wire encoding round-trips, and a real grpc.aio server/client pair agrees."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest
from google.rpc import error_details_pb2, status_pb2
from hypothesis import given
from hypothesis import strategies as st

from common.errors import (
    DETAILS_KEY,
    DOMAIN,
    PUSHBACK_KEY,
    FieldViolation,
    QuotaViolation,
    Reason,
    RichError,
    abort,
    abort_sync,
    deadline_missed,
    deadline_unreachable,
    invalid_argument,
    not_found_model,
    parse_rpc_error,
    permission_denied,
    quota_exceeded,
    unauthenticated,
    unavailable,
)


class FakeCallError(grpc.RpcError):  # type: ignore[misc]
    """Stands in for a client-side RpcError: the trio of call accessors, nothing else."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: Any) -> None:
        super().__init__()
        self._code = code
        self._details = details
        self._trailers = trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return self._trailers


def as_call_error(err: RichError) -> FakeCallError:
    return FakeCallError(err.code, err.message, err.trailing_metadata())


def assert_same(got: RichError, want: RichError) -> None:
    assert got.code == want.code
    assert got.message == want.message
    assert got.reason == want.reason
    assert got.domain == want.domain
    assert got.metadata == want.metadata
    assert got.field_violations == want.field_violations
    assert got.quota_violations == want.quota_violations
    if want.retry_after_s is None:
        assert got.retry_after_s is None
    else:
        assert got.retry_after_s is not None
        assert math.isclose(got.retry_after_s, want.retry_after_s, rel_tol=1e-12, abs_tol=1e-9)


# -- the encoding -----------------------------------------------------------------------------


def test_reason_values_are_their_names_and_the_domain_is_fixed() -> None:
    assert DOMAIN == "halcyon.dev"
    for reason in Reason:
        assert reason.value == reason.name
        assert reason == reason.name  # a StrEnum compares equal to the plain string
    assert {"QUOTA_EXCEEDED", "DEADLINE_MISSED", "NOT_IMPLEMENTED"} <= {r.value for r in Reason}


def test_to_status_carries_every_detail_and_the_pushback_trailer() -> None:
    err = RichError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "over quota",
        reason=Reason.QUOTA_EXCEEDED,
        metadata={"tenant": "acme"},
        retry_after_s=0.25,
        field_violations=[FieldViolation("model", "empty")],
        quota_violations=[QuotaViolation("tenant:acme", "10 rps")],
    )
    status = err.to_status()
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status.details == "over quota"
    trailers = dict(status.trailing_metadata)
    assert trailers[PUSHBACK_KEY] == "250"
    proto = status_pb2.Status.FromString(trailers[DETAILS_KEY])
    assert proto.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert proto.message == "over quota"
    kinds = [d.type_url.rsplit("/", 1)[1] for d in proto.details]
    assert kinds == [
        "google.rpc.ErrorInfo",
        "google.rpc.RetryInfo",
        "google.rpc.BadRequest",
        "google.rpc.QuotaFailure",
    ]
    info = error_details_pb2.ErrorInfo()
    proto.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "QUOTA_EXCEEDED",
        "halcyon.dev",
        {"tenant": "acme"},
    )
    retry = error_details_pb2.RetryInfo()
    proto.details[1].Unpack(retry)
    assert retry.retry_delay.ToNanoseconds() == 250_000_000


def test_no_retry_advice_means_no_retry_info_and_no_pushback() -> None:
    err = not_found_model("llama")
    keys = [k for k, _ in err.trailing_metadata()]
    assert keys == [DETAILS_KEY]
    proto = status_pb2.Status.FromString(err.trailing_metadata()[0][1])
    assert not any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in proto.details)


@pytest.mark.parametrize(
    ("retry_after_s", "pushback"),
    [(0.0, "0"), (0.001, "1"), (0.0011, "2"), (0.07, "70"), (1.5, "1500"), (2.0000004, "2001")],
)
def test_pushback_rounds_up_to_whole_milliseconds(retry_after_s: float, pushback: str) -> None:
    err = unavailable(Reason.OVERLOADED, "busy", retry_after_s)
    assert dict(err.trailing_metadata())[PUSHBACK_KEY] == pushback


def test_invalid_construction_is_refused() -> None:
    with pytest.raises(ValueError):
        RichError(grpc.StatusCode.OK, "fine")
    with pytest.raises(ValueError):
        RichError(grpc.StatusCode.UNAVAILABLE, "x", retry_after_s=-1.0)
    with pytest.raises(ValueError):
        RichError(grpc.StatusCode.UNAVAILABLE, "x", retry_after_s=math.nan)


def test_rich_error_is_a_raisable_exception_with_a_useful_str() -> None:
    err = unavailable(Reason.QUEUE_FULL, "queue full", 0.5)
    with pytest.raises(RichError) as caught:
        raise err
    assert caught.value is err
    assert str(err) == "UNAVAILABLE: queue full [QUEUE_FULL]"
    assert hash(err) == hash(err)  # exceptions must stay hashable


def test_constructors_pick_the_codes_and_details_of_the_design_table() -> None:
    bad = invalid_argument("max_tokens", "must be positive")
    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.field_violations == [FieldViolation("max_tokens", "must be positive")]

    missing = not_found_model("gpt-x")
    assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_MODEL)
    assert missing.metadata == {"model": "gpt-x"}

    quota = quota_exceeded("acme", 1.25, "burst of 10 spent")
    assert quota.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert quota.reason == Reason.QUOTA_EXCEEDED
    assert quota.retry_after_s == 1.25
    assert quota.quota_violations == [QuotaViolation("tenant:acme", "burst of 10 spent")]

    shed = unavailable(Reason.NO_CAPACITY, "no replica", 0.2)
    assert (shed.code, shed.reason, shed.retry_after_s) == (
        grpc.StatusCode.UNAVAILABLE,
        Reason.NO_CAPACITY,
        0.2,
    )

    late = deadline_unreachable("cannot finish", predicted_completion_s=0.1234567)
    assert (late.code, late.reason) == (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        Reason.DEADLINE_UNREACHABLE,
    )
    assert late.metadata == {"predicted_completion_ms": "123.457"}
    assert deadline_unreachable("cannot finish").metadata == {}

    evicted = deadline_missed("evicted")
    assert (evicted.code, evicted.reason) == (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        Reason.DEADLINE_MISSED,
    )

    assert unauthenticated("no key").code == grpc.StatusCode.UNAUTHENTICATED
    assert unauthenticated("no key", Reason.MISSING_CREDENTIALS).reason == "MISSING_CREDENTIALS"
    denied = permission_denied("operators only", Reason.WRONG_ROLE)
    assert (denied.code, denied.reason) == (grpc.StatusCode.PERMISSION_DENIED, "WRONG_ROLE")


# -- round trip through trailers --------------------------------------------------------------

_text = st.text(max_size=20)
_codes = st.sampled_from([c for c in grpc.StatusCode if c != grpc.StatusCode.OK])
_reasons = st.one_of(st.none(), st.sampled_from(list(Reason)), st.text(min_size=1, max_size=20))


@st.composite
def rich_errors(draw: st.DrawFn) -> RichError:
    reason = draw(_reasons)
    return RichError(
        draw(_codes),
        draw(_text),
        reason=reason,
        # ErrorInfo metadata travels only with an ErrorInfo, which needs a reason.
        metadata=draw(st.dictionaries(_text, _text, max_size=3)) if reason is not None else {},
        retry_after_s=draw(
            st.one_of(st.none(), st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False))
        ),
        field_violations=draw(st.lists(st.builds(FieldViolation, _text, _text), max_size=3)),
        quota_violations=draw(st.lists(st.builds(QuotaViolation, _text, _text), max_size=3)),
    )


@given(rich_errors())
def test_round_trip_through_trailers_gives_back_every_field(err: RichError) -> None:
    assert_same(parse_rpc_error(as_call_error(err)), err)


@given(rich_errors())
def test_round_trip_through_grpc_aio_metadata(err: RichError) -> None:
    # The aio client hands trailers over as grpc.aio.Metadata rather than a tuple.
    trailers = grpc.aio.Metadata(*err.trailing_metadata())
    assert_same(parse_rpc_error(FakeCallError(err.code, err.message, trailers)), err)


def _overloaded(**changes: Any) -> RichError:
    fields: dict[str, Any] = {
        "code": grpc.StatusCode.UNAVAILABLE,
        "message": "busy",
        "reason": "OVERLOADED",
        "retry_after_s": 0.01,
    }
    return RichError(**{**fields, **changes})


def test_remembered_trailers_are_each_errors_own() -> None:
    # Trailers are remembered for errors with the same figures: never another error's, so
    # errors that differ in any one field get their own.
    errors = [
        _overloaded(),
        _overloaded(code=grpc.StatusCode.RESOURCE_EXHAUSTED),
        _overloaded(message="busier"),
        _overloaded(reason="QUEUE_FULL"),
        _overloaded(retry_after_s=0.02),
        _overloaded(retry_after_s=None),
        _overloaded(metadata={"limit": "64"}),
        _overloaded(metadata={"limit": "65"}),
        _overloaded(domain="example.com"),
        _overloaded(field_violations=[FieldViolation("model", "unknown")]),
    ]
    for err in errors + errors:
        assert err.trailing_metadata() == err._build_trailers()
    assert len({e.trailing_metadata() for e in errors}) == len(errors)


def test_parse_tolerates_missing_or_broken_details() -> None:
    plain = parse_rpc_error(FakeCallError(grpc.StatusCode.INTERNAL, "boom", None))
    assert (plain.code, plain.message, plain.reason, plain.retry_after_s) == (
        grpc.StatusCode.INTERNAL,
        "boom",
        None,
        None,
    )

    pushback_only = parse_rpc_error(
        FakeCallError(grpc.StatusCode.UNAVAILABLE, "later", ((PUSHBACK_KEY, "1500"),))
    )
    assert pushback_only.retry_after_s == 1.5

    garbage = parse_rpc_error(
        FakeCallError(
            grpc.StatusCode.UNAVAILABLE,
            "x",
            ((DETAILS_KEY, b"\xff\xff\xff"), (PUSHBACK_KEY, "not-a-number")),
        )
    )
    assert (garbage.code, garbage.reason, garbage.retry_after_s) == (
        grpc.StatusCode.UNAVAILABLE,
        None,
        None,
    )

    bare = parse_rpc_error(grpc.RpcError())
    assert bare.code == grpc.StatusCode.UNKNOWN


def test_retry_info_wins_over_the_pushback_trailer() -> None:
    err = unavailable(Reason.OVERLOADED, "x", 0.0004)  # pushback rounds up to 1 ms
    assert dict(err.trailing_metadata())[PUSHBACK_KEY] == "1"
    parsed = parse_rpc_error(as_call_error(err))
    assert parsed.retry_after_s == pytest.approx(0.0004)


# -- a real grpc.aio server and client --------------------------------------------------------

_SERVICE = "halcyon.test.ErrorEcho"

_CASES: dict[str, RichError] = {
    "quota": quota_exceeded("acme", 2.5, "10 requests/s"),
    "invalid": invalid_argument("input", "must not be empty"),
    "overloaded": unavailable(Reason.OVERLOADED, "fleet overloaded", 0.125),
    "late": deadline_unreachable("cannot finish in time", predicted_completion_s=0.75),
    "denied": permission_denied("fleet credential required", Reason.WRONG_ROLE),
}


async def _fail(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    # A trailer the servicer set before rejecting must survive the abort.
    context.set_trailing_metadata((("x-served-by", "test"),))
    await abort(context, _CASES[request.decode()])


async def _raise_plain(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise RuntimeError("not a rich error")


@pytest.fixture
async def server_address() -> AsyncIterator[str]:
    handlers: dict[str, grpc.RpcMethodHandler] = {
        "Fail": grpc.unary_unary_rpc_method_handler(_fail),
        "Crash": grpc.unary_unary_rpc_method_handler(_raise_plain),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.mark.parametrize("case", sorted(_CASES))
async def test_aio_client_reads_what_abort_sent(server_address: str, case: str) -> None:
    want = _CASES[case]
    async with grpc.aio.insecure_channel(server_address) as channel:
        call = channel.unary_unary(f"/{_SERVICE}/Fail")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(case.encode(), timeout=10)
    rpc_error = caught.value
    assert_same(parse_rpc_error(rpc_error), want)

    trailers = list(rpc_error.trailing_metadata())
    assert ("x-served-by", "test") in trailers
    pushback = [v for k, v in trailers if k == PUSHBACK_KEY]
    if want.retry_after_s is None:
        assert pushback == []
    else:
        assert pushback == [str(math.ceil(want.retry_after_s * 1000))]


async def test_sync_client_reads_what_abort_sent(server_address: str) -> None:
    want = _CASES["quota"]

    def call_with_sync_channel() -> grpc.RpcError:
        with grpc.insecure_channel(server_address) as channel:
            try:
                channel.unary_unary(f"/{_SERVICE}/Fail")(b"quota", timeout=10)
            except grpc.RpcError as err:
                return err
        raise AssertionError("the call should have failed")

    # The server runs on this event loop, so the blocking client must run on another thread.
    err = await asyncio.to_thread(call_with_sync_channel)
    assert_same(parse_rpc_error(err), want)


async def test_a_plain_failure_parses_without_details(server_address: str) -> None:
    async with grpc.aio.insecure_channel(server_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channel.unary_unary(f"/{_SERVICE}/Crash")(b"", timeout=10)
    parsed = parse_rpc_error(caught.value)
    assert parsed.code == grpc.StatusCode.UNKNOWN
    assert (parsed.reason, parsed.retry_after_s, parsed.field_violations) == (None, None, [])


def test_abort_sync_on_a_thread_pool_server() -> None:
    want = _CASES["overloaded"]

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-served-by", "sync"),))
        abort_sync(context, want)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                _SERVICE, {"Fail": grpc.unary_unary_rpc_method_handler(fail)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with (
            grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
            pytest.raises(grpc.RpcError) as caught,
        ):
            channel.unary_unary(f"/{_SERVICE}/Fail")(b"", timeout=10)
    finally:
        server.stop(None)
    assert_same(parse_rpc_error(caught.value), want)
    trailers = list(caught.value.trailing_metadata())
    assert ("x-served-by", "sync") in trailers
    assert (PUSHBACK_KEY, "125") in trailers
