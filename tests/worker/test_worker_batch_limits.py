"""A batch at exactly the worker's documented limits, answered by a real ``halcyon worker``.

With the item limit at 2**20, ``MAX_ITEMS`` (4,096) items of it made 2**32 tokens: one more
than the ``uint32`` ``batch_tokens`` holds, so building the response failed and the call ended
INTERNAL with no ``ErrorInfo`` (issue #24). The item limit is 2**20 - 1 now, so the corner is
2**32 - 4,096; this sends that batch to a zero-cost simulated device (so it finishes at once
and the response really is built and encoded) on both serving paths — the completion-queue
fast path and grpc.aio — and checks the answer carries the whole sum.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from common.errors import parse_rpc_error
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from tests.support import e2e
from worker.validation import MAX_BATCH_TOKENS, MAX_ITEM_TOKENS, MAX_ITEMS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A standalone zero-cost worker per serving path."""
    launcher = e2e.Launcher(tmp_path_factory.mktemp("limits"))
    try:
        procs = {
            path: launcher.spawn(
                f"limits-{path}",
                "worker",
                "--replica-id",
                f"limits-{path}",
                "--model",
                e2e.MODEL,
                "--serving-path",
                path,
                *e2e.INSTANT,
            )
            for path in ("fast", "aio")
        }
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        launcher.close()


def _batch_at_the_limits() -> worker_pb2.ExecuteBatchRequest:
    # Input at the item limit but one, one output token: the output text stays a word.
    return worker_pb2.ExecuteBatchRequest(
        batch_id="at-the-limits",
        model=e2e.MODEL,
        version="v1",
        items=[
            worker_pb2.BatchItem(id=f"i{i}", input_tokens=MAX_ITEM_TOKENS - 1, max_output_tokens=1)
            for i in range(MAX_ITEMS)
        ],
    )


@pytest.mark.parametrize("serving_path", ["fast", "aio"])
def test_a_batch_at_both_limits_is_answered_with_its_whole_token_sum(
    workers: dict[str, Any], serving_path: str
) -> None:
    assert MAX_BATCH_TOKENS == 2**32 - MAX_ITEMS  # the corner: as close to uint32's top as it gets
    with grpc.insecure_channel(workers[serving_path].grpc) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        try:
            reply = stub.ExecuteBatch(
                _batch_at_the_limits(),
                metadata=(("authorization", f"Bearer {e2e.FLEET_TOKEN}"),),
                timeout=30,
            )
        except grpc.RpcError as err:
            raise AssertionError(f"refused: {parse_rpc_error(err)}") from None
    assert reply.batch_tokens == MAX_BATCH_TOKENS
    assert len(reply.results) == MAX_ITEMS
    assert reply.results[-1].input_tokens == MAX_ITEM_TOKENS - 1


@pytest.mark.parametrize("serving_path", ["fast", "aio"])
def test_one_token_past_the_item_limit_is_refused_typed(
    workers: dict[str, Any], serving_path: str
) -> None:
    request = _batch_at_the_limits()
    request.items[7].max_output_tokens = 2
    with grpc.insecure_channel(workers[serving_path].grpc) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ExecuteBatch(
                request, metadata=(("authorization", f"Bearer {e2e.FLEET_TOKEN}"),), timeout=30
            )
    err = parse_rpc_error(refused.value)
    assert (err.code, err.reason, err.metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELD",
        "items[7].max_output_tokens",
    )
