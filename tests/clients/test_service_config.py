"""``clients/service_config.json`` as gRPC reads it: valid, and retrying what it says.

Each test runs a real gRPC server on 127.0.0.1:0 in this process whose ``Infer`` answers from a
script — Halcyon's own rejections, built with ``common.errors`` exactly as the gateway sends them
(``google.rpc.Status`` trailer plus ``grpc-retry-pushback-ms``) — and calls it through a channel
configured with the published file, as ``clients/python/infer_client.py`` does. The server
records every attempt it saw, so what gRPC's retry machinery (gRFC A6) did is counted, not
inferred. Attempt times come from the server's monotonic clock; nothing here sleeps.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from clients_support import SERVICE_CONFIG, retry_policy  # type: ignore[import-not-found]

from common.errors import (
    NO_RETRY_PUSHBACK,
    PUSHBACK_KEY,
    Reason,
    RichError,
    abort_sync,
    invalid_argument,
    parse_rpc_error,
    quota_exceeded,
    unavailable,
)
from halcyon.v1 import infer_pb2, infer_pb2_grpc

CONFIG_TEXT = SERVICE_CONFIG.read_text()
POLICY = retry_policy()
MAX_ATTEMPTS = int(POLICY["maxAttempts"])
INITIAL_BACKOFF_S = float(POLICY["initialBackoff"].removesuffix("s"))
MAX_BACKOFF_S = float(POLICY["maxBackoff"].removesuffix("s"))
DEADLINE_S = 10.0

# An answer: a reply, or a RichError the server aborts with.
Answer = infer_pb2.InferResponse | RichError
OK = infer_pb2.InferResponse(output="ok")


@dataclass
class Scripted(infer_pb2_grpc.InferServiceServicer):
    """Answers attempt i with ``script[i]`` (the last entry repeats) and records when it came."""

    script: list[Answer]
    attempts: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Infer(self, request: Any, context: grpc.ServicerContext) -> infer_pb2.InferResponse:
        with self.lock:
            self.attempts.append(time.monotonic())
            answer = self.script[min(len(self.attempts), len(self.script)) - 1]
        if isinstance(answer, RichError):
            abort_sync(context, answer)
        return answer


@pytest.fixture
def serve() -> Iterator[Callable[[list[Answer]], tuple[Scripted, str]]]:
    """Start a scripted InferService on 127.0.0.1:0: returns it and its address."""
    servers: list[grpc.Server] = []

    def start(script: list[Answer]) -> tuple[Scripted, str]:
        servicer = Scripted(script)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        infer_pb2_grpc.add_InferServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(grace=None)


def channel(address: str, config: str = CONFIG_TEXT) -> grpc.Channel:
    """A channel exactly as the published Python client makes it."""
    return grpc.insecure_channel(
        address, options=[("grpc.service_config", config), ("grpc.enable_retries", 1)]
    )


def infer(address: str, config: str = CONFIG_TEXT, timeout: float = DEADLINE_S) -> Any:
    with channel(address, config) as ch:
        stub = infer_pb2_grpc.InferServiceStub(ch)
        return stub.Infer(infer_pb2.InferRequest(model="m", input="x"), timeout=timeout)


def failure(address: str, **kwargs: Any) -> grpc.RpcError:
    try:
        reply = infer(address, **kwargs)
    except grpc.RpcError as err:
        return err
    raise AssertionError(f"expected an RPC error, got {reply!r}")


# -- the file itself ----------------------------------------------------------------------------


def test_the_config_names_the_real_service_and_real_codes() -> None:
    """gRPC accepts a config for a service that does not exist (it just never applies): the
    name must be the contract's, and the codes gRPC status names."""
    config = json.loads(CONFIG_TEXT)
    service = infer_pb2.DESCRIPTOR.services_by_name["InferService"].full_name
    (method_config,) = config["methodConfig"]
    assert method_config["name"] == [{"service": service}]
    codes = set(POLICY["retryableStatusCodes"])
    assert codes == {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}
    assert codes <= {code.name for code in grpc.StatusCode}
    # gRPC caps attempts at 5 (gRFC A6, "Limits on Retries and Hedges"): more would be ignored.
    assert 2 <= MAX_ATTEMPTS <= 5
    assert set(config["retryThrottling"]) == {"maxTokens", "tokenRatio"}


def test_a_channel_with_the_config_makes_a_call(serve: Any) -> None:
    servicer, address = serve([OK])
    assert infer(address).output == "ok"
    assert len(servicer.attempts) == 1


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda c: c["methodConfig"][0]["retryPolicy"].update(maxAttempts=1), "maxAttempts"),
        (
            lambda c: c["methodConfig"][0]["retryPolicy"].update(retryableStatusCodes=["BUSY"]),
            "retryableStatusCodes",
        ),
        (lambda c: c["methodConfig"][0]["retryPolicy"].update(initialBackoff="0.1"), "Backoff"),
        (lambda c: c["retryThrottling"].update(maxTokens=-1), "maxTokens"),
    ],
    ids=["one-attempt", "unknown-code", "duration-without-unit", "negative-tokens"],
)
def test_grpc_rejects_a_malformed_config(
    serve: Any, mutate: Callable[[dict[str, Any]], None], complaint: str
) -> None:
    """The same call through a broken variant of the file fails before reaching the server,
    with gRPC naming the field: so the check above is gRPC's own validation, not ours."""
    servicer, address = serve([OK])
    config = copy.deepcopy(json.loads(CONFIG_TEXT))
    mutate(config)
    err = failure(address, config=json.dumps(config))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "service config" in (err.details() or ""), err.details()
    assert complaint in (err.details() or ""), err.details()
    assert servicer.attempts == []


# -- what it retries ----------------------------------------------------------------------------


def test_unavailable_is_retried_and_the_call_succeeds(serve: Any) -> None:
    servicer, address = serve(
        [unavailable(Reason.SHUTTING_DOWN, "the gateway is shutting down", None), OK]
    )
    assert infer(address).output == "ok"
    assert len(servicer.attempts) == 2


def test_resource_exhausted_waits_the_pushback_before_retrying(serve: Any) -> None:
    """Halcyon's QUOTA_EXCEEDED carries RetryInfo and the pushback trailer; gRPC waits that
    long: not its own backoff (at most initialBackoff for the first retry), and not capped at
    maxBackoff either (A6: "retry in n ms")."""
    pushback_s = MAX_BACKOFF_S + 0.2
    assert pushback_s > 2 * INITIAL_BACKOFF_S, "the backoff alone could explain the wait"
    servicer, address = serve([quota_exceeded("acme", pushback_s, "refills soon"), OK])
    assert infer(address).output == "ok"
    first, second = servicer.attempts
    assert second - first >= pushback_s - 0.005  # the pushback is whole ms, rounded up


def test_invalid_argument_is_not_retried_even_with_a_pushback(serve: Any) -> None:
    bad = invalid_argument("max_output_tokens", "9999 is above the limit of 4096")
    bad.retry_after_s = 0.01  # a pushback trailer does not make a code retryable
    servicer, address = serve([bad, OK])
    err = failure(address)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert parse_rpc_error(err).reason == Reason.INVALID_FIELD
    assert len(servicer.attempts) == 1


def test_after_max_attempts_the_client_gets_the_last_rich_error(serve: Any) -> None:
    servicer, address = serve(
        [
            unavailable(Reason.QUEUE_FULL, "the batch queue is full", 0.001),
            unavailable(Reason.OVERLOADED, "at the adaptive concurrency limit", 0.002),
        ]
    )
    err = parse_rpc_error(failure(address))
    assert len(servicer.attempts) == MAX_ATTEMPTS
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.reason == Reason.OVERLOADED
    assert err.retry_after_s == pytest.approx(0.002)


def test_a_pushback_beyond_the_deadline_ends_in_a_bare_deadline_exceeded(serve: Any) -> None:
    """What the docs warn about: gRPC schedules the retry after the pushback even when the
    deadline comes first, and the call then ends DEADLINE_EXCEEDED without the rich error.
    (A client that must see QUOTA_EXCEEDED sets a deadline longer than the refill it accepts.)"""
    servicer, address = serve([quota_exceeded("acme", 5.0, "refills in 5 s"), OK])
    err = failure(address, timeout=0.3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert parse_rpc_error(err).reason is None
    assert len(servicer.attempts) == 1


def _throttled_attempts(max_tokens: float, calls: int) -> list[int]:
    """Attempts per call when every attempt fails, by gRFC A6's throttling rule: each failed
    attempt takes a token, and a retry is made only while more than half remain."""
    tokens, seen = max_tokens, []
    for _ in range(calls):
        attempts = 0
        while True:
            attempts += 1
            tokens = max(0.0, tokens - 1)
            if attempts >= MAX_ATTEMPTS or tokens <= max_tokens / 2:
                break
        seen.append(attempts)
    return seen


def test_retry_throttling_stops_retries_while_most_calls_fail(serve: Any) -> None:
    """A retry storm is cut: once failures have used up half of maxTokens, calls get one
    attempt each, and the next success earns back only tokenRatio."""
    max_tokens = float(json.loads(CONFIG_TEXT)["retryThrottling"]["maxTokens"])
    refusal = unavailable(Reason.NO_CAPACITY, "no replica can take this version now", 0.001)
    servicer, address = serve([refusal])
    calls = 6
    expected = _throttled_attempts(max_tokens, calls)
    assert expected[-1] == 1 and expected[0] == MAX_ATTEMPTS, expected  # throttling shows
    seen: list[int] = []
    # One channel for all calls: throttling is per channel and server name.
    with channel(address) as ch:
        stub = infer_pb2_grpc.InferServiceStub(ch)
        for _ in range(calls):
            before = len(servicer.attempts)
            with pytest.raises(grpc.RpcError):
                stub.Infer(infer_pb2.InferRequest(model="m"), timeout=DEADLINE_S)
            seen.append(len(servicer.attempts) - before)
    assert seen == expected


def test_resource_exhausted_with_no_retry_advice_is_not_retried(serve: Any) -> None:
    """A refusal waiting cannot fix (a message over the size limit) carries pushback -1, which
    gRPC's retry reads as "do not retry" (gRFC A6): one attempt, and the rich error intact."""
    too_large = RichError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "request of 200000 bytes is over the limit",
        reason=Reason.MESSAGE_TOO_LARGE,
    )  # fmt: skip
    assert (PUSHBACK_KEY, NO_RETRY_PUSHBACK) in too_large.trailing_metadata()
    servicer, address = serve([too_large])
    err = parse_rpc_error(failure(address))
    assert (err.code, err.reason, err.retry_after_s) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.MESSAGE_TOO_LARGE, None,
    )  # fmt: skip
    assert len(servicer.attempts) == 1
