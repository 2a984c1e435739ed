"""What makes an Infer request well-formed, and what it costs.

Every malformed field becomes INVALID_ARGUMENT with a BadRequest violation naming the field,
never a crash or UNKNOWN. The effective deadline is the earlier of the gRPC deadline and the
request's own ``timeout`` (for clients such as grpcurl that cannot always set one); with
neither, the gateway's default applies. Work is counted in tokens (prompt + generated),
the unit the device cost model, the batcher and the quotas all use.

No deadline is longer than :data:`MAX_TIMEOUT_S` (ADR 0011). A ``timeout`` field beyond it is
INVALID_ARGUMENT naming ``timeout``: the client asked for something the gateway will not
honour, and saying so beats silently shortening it. A gRPC deadline beyond it (or a deadline
so far out that it is not a number any more) is clamped to it instead: that deadline is often
set by a library default rather than by the caller, and the gateway answering — typed — within
the maximum is all a caller can observe either way. Every deadline the gateway computes with is
therefore a finite number of seconds no larger than the maximum, so nothing downstream (the
batcher's plan, the ``ExecuteBatch`` call timeouts) ever sees an absurd one.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import invalid_argument
from halcyon.v1 import infer_pb2

MAX_INPUT_BYTES = 65_536
MAX_OUTPUT_TOKENS = 4_096
DEFAULT_OUTPUT_TOKENS = 64
MAX_MODEL_NAME = 128
MAX_SESSION_KEY = 256
BYTES_PER_TOKEN = 4
MAX_TIMEOUT_S = 600.0  # the longest deadline a request may have (ADR 0011)
_PRIORITIES = frozenset(infer_pb2.Priority.values())
_LANES = frozenset(infer_pb2.Lane.values())


@dataclass(slots=True)
class ValidRequest:
    """An Infer request that passed validation, with its derived costs. Treated as immutable
    (not frozen: a frozen dataclass costs ~1 µs more to build, once per request)."""

    model: str
    input: str
    input_tokens: int
    max_output_tokens: int
    session_key: str
    priority: int  # infer_pb2.Priority value; UNSPECIFIED means the tenant's default
    bulk: bool
    timeout_s: float  # from receipt; the effective deadline

    @property
    def work_tokens(self) -> int:
        return self.input_tokens + self.max_output_tokens


def count_input_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four bytes of UTF-8 per token, at least one."""
    return _tokens_for_bytes(len(text.encode()))


def _tokens_for_bytes(size: int) -> int:
    return max(1, -(-size // BYTES_PER_TOKEN))


def validate(
    req: infer_pb2.InferRequest,
    grpc_time_remaining_s: float | None,
    default_timeout_s: float,
) -> ValidRequest:
    """Check every field; raise a RichError naming the first bad one."""
    if not req.model:
        raise invalid_argument("model", "required; name the model to run")
    if len(req.model) > MAX_MODEL_NAME:
        raise invalid_argument("model", f"at most {MAX_MODEL_NAME} characters")
    if not req.input:
        raise invalid_argument("input", "required; the prompt must not be empty")
    size = len(req.input.encode())
    if size > MAX_INPUT_BYTES:
        raise invalid_argument("input", f"{size} bytes; at most {MAX_INPUT_BYTES}")
    out = req.max_output_tokens or DEFAULT_OUTPUT_TOKENS
    if out > MAX_OUTPUT_TOKENS:
        raise invalid_argument(
            "max_output_tokens", f"{out} is above the limit of {MAX_OUTPUT_TOKENS}"
        )
    if len(req.session_key) > MAX_SESSION_KEY:
        raise invalid_argument("session_key", f"at most {MAX_SESSION_KEY} characters")
    if req.priority not in _PRIORITIES:
        raise invalid_argument("priority", f"unknown value {req.priority}")
    if req.lane not in _LANES:
        raise invalid_argument("lane", f"unknown value {req.lane}")
    if grpc_time_remaining_s is not None and grpc_time_remaining_s != grpc_time_remaining_s:
        grpc_time_remaining_s = None  # NaN: no usable deadline at all
    if grpc_time_remaining_s is None:
        timeout_s = min(default_timeout_s, MAX_TIMEOUT_S)
    elif grpc_time_remaining_s > MAX_TIMEOUT_S:  # also infinity
        timeout_s = MAX_TIMEOUT_S
    else:
        # Already past (the batcher refuses it as DEADLINE_UNREACHABLE), but never below zero.
        timeout_s = grpc_time_remaining_s if grpc_time_remaining_s > 0.0 else 0.0
    if req.HasField("timeout"):
        t = req.timeout
        if t.seconds < 0 or t.nanos < 0 or t.nanos >= 1_000_000_000:
            raise invalid_argument("timeout", 'must be a positive duration such as "2s"')
        requested = t.seconds + t.nanos / 1e9
        if t.seconds > MAX_TIMEOUT_S or (t.seconds == MAX_TIMEOUT_S and t.nanos > 0):
            raise invalid_argument(
                "timeout",
                f"{requested:.9g}s is above the limit of {MAX_TIMEOUT_S:g}s; send at most that",
            )
        if requested <= 0:
            raise invalid_argument("timeout", "must be positive")
        timeout_s = min(timeout_s, requested) if grpc_time_remaining_s is not None else requested
    return ValidRequest(
        model=req.model,
        input=req.input,
        input_tokens=_tokens_for_bytes(size),  # count_input_tokens, the size already known
        max_output_tokens=out,
        session_key=req.session_key,
        priority=req.priority,
        bulk=req.lane == infer_pb2.LANE_BULK,
        timeout_s=timeout_s,
    )
