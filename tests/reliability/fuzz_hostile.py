"""The hostile values of issue #24 ("Bad input that still gets through"), as fuzz generators
and the answer each must get — pure: no processes, no calls (``test_fuzz`` sends them).

* **Durations** in the operator API and the report stream: ``RolloutPolicy.window`` /
  ``max_duration`` over the whole int64 range with out-of-range nanos (and the policy's counts
  and ratios over all of uint32 / double, NaN and infinities included) must be refused
  ``INVALID_ARGUMENT`` whenever they are out of range; a ``ReportOutcomes`` stream carrying
  such latencies, device times and cost models is answered OK (the items are dropped), and
  GetState stays printable as JSON (what grpcurl does with it).
* **A batch at the limits**: up to ``MAX_ITEMS`` items of up to ``MAX_ITEM_TOKENS`` tokens
  (the exact corner, 2**32 - 4,096 tokens, always among them) is answered OK with its whole
  token sum.
* **Overlong identifiers** (a replica id or model up to 1 MiB) get a typed status whose
  message stays short, so a C-core client can read it.

The limits here are written out again on purpose, not imported: the fuzz run checks the
server against the documented numbers (docs/reference/api.md, "Limits").
"""

from __future__ import annotations

from google.protobuf import duration_pb2
from hypothesis import strategies as st

from halcyon.v1 import control_pb2, fleet_pb2, worker_pb2

# docs/reference/api.md, "Limits".
MAX_WINDOW_S = 3600
MAX_ROLLOUT_DURATION_S = 7 * 24 * 3600
MAX_NAME_CHARS = 128
MAX_ID_CHARS = 253
MAX_ITEMS = 4096
MAX_ITEM_TOKENS = (1 << 20) - 1
# A status message a C-core client reads whole, with room to spare (its trailer limit: 8 KB).
SHORT_MESSAGE = 1024
INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)

durations = st.builds(
    duration_pb2.Duration,
    seconds=st.one_of(
        st.integers(-5, 5),
        st.integers(0, 10**6),
        INT64,
        st.sampled_from([2**63 - 1, -(2**63), 315_576_000_001, MAX_WINDOW_S + 1]),
    ),
    nanos=st.one_of(st.just(0), st.integers(0, 999_999_999), INT32),
)
_doubles = st.one_of(
    st.just(0.0), st.floats(allow_nan=True, allow_infinity=True), st.floats(0.0, 2.0)
)
policies = st.builds(
    control_pb2.RolloutPolicy,
    window=st.one_of(st.none(), durations),
    max_duration=st.one_of(st.none(), durations),
    min_requests=st.one_of(st.integers(0, 100), st.integers(0, 2**32 - 1)),
    max_error_rate_increase=_doubles,
    max_error_rate_ratio=_doubles,
    max_p95_ratio=_doubles,
    healthy_windows_to_advance=st.one_of(st.integers(0, 5), st.integers(0, 2**32 - 1)),
    unhealthy_windows_to_rollback=st.one_of(st.integers(0, 5), st.integers(0, 2**32 - 1)),
    false_alarm_rate=_doubles,
)


def duration_in_range(d: duration_pb2.Duration, maximum_s: int) -> bool:
    """Well-formed, positive and at most ``maximum_s`` (the documented rule, restated)."""
    if abs(d.nanos) > 999_999_999 or (d.seconds > 0 > d.nanos) or (d.seconds < 0 < d.nanos):
        return False
    total = d.seconds * 1_000_000_000 + d.nanos
    return 0 < total <= maximum_s * 1_000_000_000


def policy_durations_out_of_range(policy: control_pb2.RolloutPolicy) -> bool:
    """Whether a set window or max_duration breaks its own documented bound."""
    return (policy.HasField("window") and not duration_in_range(policy.window, MAX_WINDOW_S)) or (
        policy.HasField("max_duration")
        and not duration_in_range(policy.max_duration, MAX_ROLLOUT_DURATION_S)
    )


def hostile_report(d: duration_pb2.Duration, model: str) -> control_pb2.ReportOutcomesRequest:
    """A report whose every Duration (and one model name) is the fuzzed one."""
    return control_pb2.ReportOutcomesRequest(
        gateway_id="fuzz-gateway",
        requests=[
            control_pb2.RequestOutcome(
                model=model,
                version="v-fuzz",
                kind=control_pb2.REQUEST_OUTCOME_KIND_OK,
                latency=d,
            )
        ],
        batches=[
            control_pb2.BatchOutcome(
                model=model, version="v-fuzz", size=1, tokens=2**32 - 1, device_time=d, ok=True
            )
        ],
        cost_models=[
            fleet_pb2.CostModel(replica_id="fuzz-replica", intercept=d, per_token=d, per_step=d)
        ],
    )


# (items, tokens per item); the exact corner first.
batch_shapes = st.one_of(
    st.just((MAX_ITEMS, MAX_ITEM_TOKENS)),
    st.tuples(st.integers(1, MAX_ITEMS), st.integers(2, MAX_ITEM_TOKENS)),
    st.tuples(
        st.integers(MAX_ITEMS - 16, MAX_ITEMS), st.integers(MAX_ITEM_TOKENS - 16, MAX_ITEM_TOKENS)
    ),
)


def batch(model: str, items: int, tokens: int) -> worker_pb2.ExecuteBatchRequest:
    """``items`` items of ``tokens`` work tokens each (all input but one output token)."""
    return worker_pb2.ExecuteBatchRequest(
        batch_id="fuzz-limits",
        model=model,
        version="v1",
        items=[
            worker_pb2.BatchItem(id=f"i{i}", input_tokens=tokens - 1, max_output_tokens=1)
            for i in range(items)
        ],
    )


# A string of up to 1 MiB, mostly past the limits: ASCII, or 4-byte UTF-8 characters (up to
# 2**18 of them: a request past the server's 4 MiB receive limit is refused by gRPC core
# itself, without ErrorInfo, before any handler runs — a documented limit, not this case).
identifiers = st.one_of(
    st.builds(
        str.__mul__,
        st.just("r"),
        st.one_of(
            st.integers(1, 300),
            st.integers(MAX_ID_CHARS + 1, 1 << 20),
            st.sampled_from([MAX_NAME_CHARS, MAX_NAME_CHARS + 1, MAX_ID_CHARS, 1 << 20]),
        ),
    ),
    st.builds(str.__mul__, st.just("\U0001f600"), st.integers(1, 1 << 18)),
)
# The controller RPCs an identifier goes into: (method, field, the request, its limit).
IDENTIFIER_RPCS = (
    ("DrainReplica", "replica_id", MAX_ID_CHARS),
    ("UndrainReplica", "replica_id", MAX_ID_CHARS),
    ("StartRollout", "model", MAX_NAME_CHARS),
    ("PromoteRollout", "model", MAX_NAME_CHARS),
    ("AbortRollout", "model", MAX_NAME_CHARS),
    ("ListRolloutDecisions", "model", MAX_NAME_CHARS),
)


def identifier_request(method: str, field: str, value: str) -> bytes:
    request_class = getattr(control_pb2, f"{method}Request")
    fields: dict[str, object] = {field: value}
    if method == "StartRollout":
        fields["canary_version"] = "v-fuzz"
    return bytes(request_class(**fields).SerializeToString())


def registration(replica_id: str) -> bytes:
    """A WorkerSession's first message under ``replica_id`` (always past its limit here)."""
    return bytes(
        control_pb2.WorkerSessionRequest(
            register=fleet_pb2.ReplicaDescriptor(
                replica_id=replica_id,
                address="127.0.0.1:1",
                model="fuzz-model",
                version="v1",
                slots=1,
                speed=1.0,
            )
        ).SerializeToString()
    )
