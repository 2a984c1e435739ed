"""Hostile values an operator or fleet member can send the controller (issue #24, "Bad input
that still gets through"): unbounded Durations, unbounded identifiers, NaN and huge numbers.

Each is refused ``INVALID_ARGUMENT`` naming its field (requests) or dropped and counted (report
streams), and no status repeats more than a short prefix of what the client sent. The policy
and report parts are checked on the pure functions; the identifier and Duration refusals also
against a real ``halcyon controller`` process with a grpcio (gRPC C core) client, which loses
a typed status whose trailers pass ~8 KB.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from common.clock import ManualClock
from common.durations import to_duration
from common.errors import Reason, RichError, parse_rpc_error
from controller.outcomes import DROP_REASONS, OutcomeAggregator
from controller.registry import InvalidDescriptor, validate_descriptor
from controller.rollout_requests import validate_policy
from halcyon.v1 import control_pb2, control_pb2_grpc, fleet_pb2
from tests.support import e2e

INT64_MAX = 2**63 - 1
MEGABYTE = "r" * (1 << 20)
# A status a C-core client can still read whole (its default trailer limit is 8 KB).
SHORT = 1024
K = control_pb2.RequestOutcomeKind


def _d(seconds: int, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


def _refusal(call: Any) -> RichError:
    with pytest.raises(RichError) as refused:
        call()
    return refused.value


# -- the rollout policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"window": _d(INT64_MAX)}, "policy.window"),
        ({"max_duration": _d(INT64_MAX)}, "policy.max_duration"),
        ({"window": _d(3601)}, "policy.window"),
        ({"max_duration": _d(7 * 24 * 3600 + 1)}, "policy.max_duration"),
        ({"window": _d(1, -1)}, "policy.window"),
        ({"window": _d(0, 2_000_000_000)}, "policy.window"),
        ({"max_duration": _d(-(2**63))}, "policy.max_duration"),
        ({"window": _d(600), "max_duration": _d(300)}, "policy.window"),
        ({"max_duration": _d(5)}, "policy.max_duration"),  # shorter than the default window
        ({"min_requests": 2**32 - 1}, "policy.min_requests"),
        ({"healthy_windows_to_advance": 2**32 - 1}, "policy.healthy_windows_to_advance"),
        ({"unhealthy_windows_to_rollback": 1001}, "policy.unhealthy_windows_to_rollback"),
        ({"max_error_rate_ratio": math.nan}, "policy.max_error_rate_ratio"),
        ({"max_p95_ratio": math.inf}, "policy.max_p95_ratio"),
        ({"max_p95_ratio": 1e308}, "policy.max_p95_ratio"),
        ({"false_alarm_rate": math.nan}, "policy.false_alarm_rate"),
        ({"max_error_rate_increase": -math.inf}, "policy.max_error_rate_increase"),
    ],
)
def test_out_of_range_policy_fields_are_refused_by_name(policy: dict[str, Any], field: str) -> None:
    err = _refusal(lambda: validate_policy(control_pb2.RolloutPolicy(**policy)))
    assert (err.code, err.reason, err.metadata["field"]) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.INVALID_FIELD,
        field,
    )
    assert len(err.message) < 300


def test_policy_at_its_maxima_is_accepted() -> None:
    accepted = validate_policy(
        control_pb2.RolloutPolicy(
            window=_d(3600),
            max_duration=_d(7 * 24 * 3600),
            min_requests=1_000_000,
            healthy_windows_to_advance=1000,
            unhealthy_windows_to_rollback=1000,
            max_error_rate_ratio=1000.0,
            max_p95_ratio=1000.0,
        )
    )
    assert (accepted.window_s, accepted.max_duration_s, accepted.min_requests) == (
        3600.0,
        604800.0,
        1_000_000,
    )


# -- report streams: the one item is dropped, the rest counted ---------------------------------


def test_out_of_range_report_items_are_dropped_one_by_one() -> None:
    agg = OutcomeAggregator(ManualClock(1000.0))

    def request(**kw: Any) -> control_pb2.RequestOutcome:
        fields: dict[str, Any] = {
            "model": "m",
            "version": "v1",
            "replica_id": "r1",
            "kind": K.REQUEST_OUTCOME_KIND_OK,
            "latency": to_duration(0.05),
        }
        return control_pb2.RequestOutcome(**{**fields, **kw})

    def batch(**kw: Any) -> control_pb2.BatchOutcome:
        fields: dict[str, Any] = {"model": "m", "version": "v1", "replica_id": "r1", "size": 1}
        fields.update(tokens=2**32 - 1, device_time=to_duration(0.01), ok=True)
        return control_pb2.BatchOutcome(**{**fields, **kw})

    result = agg.ingest(
        control_pb2.ReportOutcomesRequest(
            gateway_id="gw-1",
            requests=[
                request(),
                request(latency=_d(INT64_MAX)),
                request(latency=_d(1, -1)),
                request(model=MEGABYTE),
                request(replica_id=MEGABYTE),
            ],
            batches=[batch(), batch(device_time=_d(INT64_MAX)), batch(version=MEGABYTE)],
            cost_models=[
                fleet_pb2.CostModel(replica_id="r1", intercept=to_duration(0.018)),
                fleet_pb2.CostModel(replica_id="r2", intercept=_d(INT64_MAX)),
                fleet_pb2.CostModel(replica_id=MEGABYTE),
            ],
        )
    )
    assert result.counted["ok"] == 1
    assert result.dropped == {
        "invalid_latency": 2,
        "invalid_identifier": 3,
        "invalid_device_time": 1,
        "invalid_cost_model": 2,
    }
    assert set(result.dropped) <= set(DROP_REASONS)
    assert result.problem is not None and len(result.problem) < 300
    [gateway] = agg.gateways()
    assert [c.replica_id for c in gateway.cost_models] == ["r1"]
    assert agg.window("m", "v1").batches == 1


def test_a_megabyte_gateway_id_skips_the_status_but_counts_the_outcomes() -> None:
    agg = OutcomeAggregator(ManualClock(1000.0))
    result = agg.ingest(
        control_pb2.ReportOutcomesRequest(
            gateway_id=MEGABYTE,
            requests=[
                control_pb2.RequestOutcome(
                    model="m", version="v1", kind=K.REQUEST_OUTCOME_KIND_OK, latency=_d(0)
                )
            ],
        )
    )
    assert result.counted["ok"] == 1 and result.dropped == {"invalid_identifier": 1}
    assert agg.gateways() == []


# -- registrations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("replica_id", MEGABYTE),
        ("address", "h" * 300 + ":1"),
        ("model", "m" * 129),
        ("version", "v" * 129),
        ("hardware", "x" * 4097),
    ],
)
def test_overlong_descriptor_strings_are_refused_without_repeating_them(
    field: str, value: str
) -> None:
    fields: dict[str, Any] = {
        "replica_id": "r1",
        "address": "127.0.0.1:6000",
        "model": "m",
        "version": "v1",
        "slots": 1,
        "speed": 1.0,
    }
    fields[field] = value
    with pytest.raises(InvalidDescriptor) as refused:
        validate_descriptor(fleet_pb2.ReplicaDescriptor(**fields))
    assert refused.value.field == field
    assert f"got {len(value):,}" in refused.value.description
    assert len(refused.value.description) < 100


# -- a real controller, a C-core client -----------------------------------------------------


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    launcher = e2e.Launcher(tmp_path_factory.mktemp("hostile"))
    try:
        proc = launcher.controller()
        # A canary replica, so a StartRollout gets as far as storing its policy.
        canary = launcher.worker(proc, "canary-v2", *e2e.INSTANT, "--version", "v2")
        canary.wait_ready()
        yield proc
    finally:
        launcher.close()


@pytest.fixture(scope="module")
def stub(controller: Any) -> Iterator[control_pb2_grpc.ControlServiceStub]:
    with grpc.insecure_channel(controller.grpc) as channel:
        yield control_pb2_grpc.ControlServiceStub(channel)


def _operator() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {e2e.OPERATOR_TOKEN}"),)


def _fleet() -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {e2e.FLEET_TOKEN}"),)


def _typed_refusal(call: Any, field: str) -> RichError:
    """The call's status: INVALID_ARGUMENT / INVALID_FIELD naming ``field``, and short."""
    with pytest.raises(grpc.RpcError) as failed:
        call()
    err = parse_rpc_error(failed.value)
    assert (err.code, err.reason, err.metadata.get("field")) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.INVALID_FIELD,
        field,
    ), err
    assert len(err.message) < SHORT
    return err


@pytest.mark.e2e
def test_a_megabyte_replica_id_in_worker_session_is_refused_typed(stub: Any) -> None:
    register = control_pb2.WorkerSessionRequest(
        register=fleet_pb2.ReplicaDescriptor(
            replica_id=MEGABYTE, address="127.0.0.1:1", model="m", version="v1", slots=1, speed=1
        )
    )

    def session() -> None:
        for _ in stub.WorkerSession(iter([register]), metadata=_fleet(), timeout=5):
            pytest.fail("a lease for a megabyte replica id")

    _typed_refusal(session, "register.replica_id")


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["DrainReplica", "UndrainReplica"])
def test_a_megabyte_replica_id_in_drain_is_refused_typed(stub: Any, method: str) -> None:
    request_class = getattr(control_pb2, f"{method}Request")
    _typed_refusal(
        lambda: getattr(stub, method)(
            request_class(replica_id=MEGABYTE), metadata=_operator(), timeout=5
        ),
        "replica_id",
    )


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["StartRollout", "PromoteRollout", "AbortRollout"])
def test_a_megabyte_model_in_a_rollout_rpc_is_refused_typed(stub: Any, method: str) -> None:
    request_class = getattr(control_pb2, f"{method}Request")
    fields: dict[str, Any] = {"model": MEGABYTE}
    if method == "StartRollout":
        fields["canary_version"] = "v2"
    _typed_refusal(
        lambda: getattr(stub, method)(request_class(**fields), metadata=_operator(), timeout=5),
        "model",
    )


@pytest.mark.e2e
@pytest.mark.parametrize("field", ["window", "max_duration"])
def test_an_int64_max_duration_is_refused_and_nothing_is_stored(stub: Any, field: str) -> None:
    request = control_pb2.StartRolloutRequest(model=e2e.MODEL, canary_version="v2")
    getattr(request.policy, field).CopyFrom(_d(INT64_MAX))
    e2e.wait_for(
        lambda: any(
            m.replica.version == "v2"
            for m in stub.GetState(control_pb2.GetStateRequest(), metadata=_operator()).replicas
        ),
        e2e.START_TIMEOUT_S,
        "the v2 canary to register",
    )
    err = _typed_refusal(
        lambda: stub.StartRollout(request, metadata=_operator(), timeout=5), f"policy.{field}"
    )
    assert "at most" in err.message
    state = stub.GetState(control_pb2.GetStateRequest(), metadata=_operator(), timeout=5)
    assert list(state.rollouts) == []
