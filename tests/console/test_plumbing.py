"""The console's plumbing: the tap chain, rich statuses read back as JSON errors, and the
servicer stand-in context (in process, no sockets)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from common.errors import RichError, invalid_argument
from controller.console.problems import ConsoleError, from_status
from controller.console.tap import ChainedTap
from halcyon.v1 import control_pb2


class Recorder:
    def __init__(self, log: list[Any], name: str, fail: bool = False) -> None:
        self.log, self.name, self.fail = log, name, fail

    def record(self, model: str, version: str, kind: int, latency_s: float) -> None:
        self.log.append((self.name, "record", model))
        if self.fail:
            raise RuntimeError("broken")

    def record_batch(self, model: str, version: str, size: int, ok: bool) -> None:
        self.log.append((self.name, "batch", model))
        if self.fail:
            raise RuntimeError("broken")


def test_the_tap_that_was_there_sees_every_outcome_first_and_a_broken_console_costs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log: list[Any] = []
    chain = ChainedTap(Recorder(log, "evidence"), Recorder(log, "console", fail=True))
    chain.record("m", "v1", control_pb2.REQUEST_OUTCOME_KIND_OK, 0.01)
    chain.record_batch("m", "v1", 4, False)
    chain.record("m", "v2", control_pb2.REQUEST_OUTCOME_KIND_OK, 0.01)
    assert log == [
        ("evidence", "record", "m"), ("console", "record", "m"),
        ("evidence", "batch", "m"), ("console", "batch", "m"),
        ("evidence", "record", "m"), ("console", "record", "m"),
    ]  # fmt: skip
    assert sum("console traffic history failed" in r.message for r in caplog.records) == 1


def test_a_chain_without_a_first_tap_feeds_the_console_alone() -> None:
    log: list[Any] = []
    ChainedTap(None, Recorder(log, "console")).record("m", "v1", 1, 0.0)
    assert log == [("console", "record", "m")]


def test_a_rich_status_reads_back_with_code_reason_metadata_and_retry() -> None:
    rich = RichError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "no rollout of m is running",
        reason="NO_ACTIVE_ROLLOUT",
        metadata={"model": "m"},
        retry_after_s=1.5,
    )
    err = from_status(rich.code, rich.message, rich.trailing_metadata())
    body = err.body()["error"]
    assert (err.http_status, body["code"], body["reason"]) == (
        409,
        "FAILED_PRECONDITION",
        "NO_ACTIVE_ROLLOUT",
    )
    assert body["metadata"] == {"model": "m"} and body["retry_after_s"] == 1.5
    assert err.headers() == {"Retry-After": "2"}


def test_status_codes_map_to_http_and_a_bare_status_keeps_its_code() -> None:
    bad = invalid_argument("replica_id", "is required")
    assert from_status(bad.code, bad.message, bad.trailing_metadata()).http_status == 400
    bare = from_status(grpc.StatusCode.NOT_FOUND, "gone", ())
    assert (bare.http_status, bare.reason) == (404, None)
    assert ConsoleError(grpc.StatusCode.INTERNAL, "bug").body()["error"]["reason"] == "INTERNAL"
    assert from_status(grpc.StatusCode.UNAVAILABLE, "x", [("grpc-status-details-bin", b"\xff")])
