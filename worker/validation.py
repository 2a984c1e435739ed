"""Request validation for ExecuteBatch: a malformed batch is refused before it costs a slot.

What it decides: which batches the replica accepts, and the exact field named when it does
not (INVALID_ARGUMENT with a BadRequest field violation). Rules: at least one item and at
most ``MAX_ITEMS``; every item has a non-empty id, unique in the batch; no item has zero work
tokens (``input_tokens + max_output_tokens == 0``); per-item tokens are bounded. The limits
and the wire agree: a batch at both (``MAX_ITEMS`` items of ``MAX_ITEM_TOKENS`` tokens) holds
``MAX_BATCH_TOKENS`` = 2**32 - 4,096 work tokens, which fits the ``uint32`` that carries the
sum (``ExecuteBatchResponse.batch_tokens``, and ``CostSample.batch_tokens``,
``BatchOutcome.tokens``, ``BatchInfo.tokens`` after it). The item limit was 2**20, which made
the corner 2**32 — one past ``uint32`` — and the response unencodable; lowering it by one token
kept every wire type (and every client's JSON) as it was. Echoed ids go through
:func:`common.errors.echo`. A batch for another model or version is FAILED_PRECONDITION /
``WRONG_MODEL`` (see :mod:`worker.rejections`): the request is well-formed and the model may
well exist — this replica just does not serve it, so the caller's fleet view is stale and it
should route elsewhere, which NOT_FOUND ("no such model") would not say.
"""

from __future__ import annotations

from common.errors import echo, invalid_argument
from halcyon.v1 import worker_pb2
from worker.descriptor import ReplicaIdentity
from worker.rejections import wrong_model
from worker.runtime import WorkItem

__all__ = ["MAX_BATCH_TOKENS", "MAX_ITEMS", "MAX_ITEM_TOKENS", "parse_batch"]

MAX_ITEMS = 4096
MAX_ITEM_TOKENS = (1 << 20) - 1
# The largest batch_tokens a valid batch can have; the wire field is uint32.
MAX_BATCH_TOKENS = MAX_ITEMS * MAX_ITEM_TOKENS
UINT32_MAX = (1 << 32) - 1
assert MAX_BATCH_TOKENS <= UINT32_MAX, "a batch at the limits must fit batch_tokens (uint32)"


def parse_batch(
    request: worker_pb2.ExecuteBatchRequest, identity: ReplicaIdentity
) -> list[WorkItem]:
    """The batch's items, or a :class:`~common.errors.RichError` naming what is wrong."""
    if request.model != identity.model or request.version != identity.version:
        raise wrong_model(identity, request.model, request.version)
    if not request.items:
        raise invalid_argument("items", "a batch needs at least one item")
    if len(request.items) > MAX_ITEMS:
        raise invalid_argument("items", f"at most {MAX_ITEMS} items per batch")
    seen: set[str] = set()
    items: list[WorkItem] = []
    for i, item in enumerate(request.items):
        if not item.id:
            raise invalid_argument(f"items[{i}].id", "every item needs an id")
        if item.id in seen:
            raise invalid_argument(f"items[{i}].id", f"duplicate item id {echo(item.id)!r}")
        seen.add(item.id)
        if item.input_tokens + item.max_output_tokens == 0:
            raise invalid_argument(
                f"items[{i}].input_tokens", "item has zero tokens (input and max output)"
            )
        if item.input_tokens + item.max_output_tokens > MAX_ITEM_TOKENS:
            raise invalid_argument(
                f"items[{i}].max_output_tokens", f"at most {MAX_ITEM_TOKENS} tokens per item"
            )
        items.append(WorkItem(item.id, item.input, item.input_tokens, item.max_output_tokens))
    return items
