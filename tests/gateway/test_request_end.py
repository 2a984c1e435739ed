"""Every way an Infer call ends is recorded once: one RequestEnd, one outcome counted.

Each case drives ``InferPath.admit`` (and, for admitted requests, ``settle`` or
``settle_cancelled``) directly and checks that exactly one end was recorded, that exactly one
request was counted — under the expected ``outcome`` label — that a shed was counted by reason
and priority only for a shed, that the controller heard of the end only when it is evidence,
and that no admission ticket was left unfinished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from common.errors import RichError
from gateway.admission import Priority
from gateway.admission.quota import QuotaExceeded
from gateway.admission.shedder import Overloaded
from gateway.app import Admitted, GatewayApp
from gateway.request_end import Ending, RequestEnd
from halcyon.v1 import infer_pb2

MODEL = "llama-3-8b"
STANDARD_KEY = "demo-key-standard"
FLEET = "gateway-test-fleet-token"  # the fleet credential of the test gateway (conftest)
KEY = (("x-api-key", STANDARD_KEY),)

Setup = Callable[[Any, Any, pytest.MonkeyPatch], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    setup: str
    outcome: str
    ending: Ending
    shed: bool = False  # counted in halcyon_gateway_shed_total (priority standard)
    evidence: int = 0  # outcomes reported to the controller


async def _serving(gw: Any, start_worker: Any, _: pytest.MonkeyPatch) -> None:
    gw.apply([await start_worker()])


async def _closing(gw: Any, start_worker: Any, mp: pytest.MonkeyPatch) -> None:
    await _serving(gw, start_worker, mp)
    mp.setattr(gw.app, "_closing", True)


async def _no_fleet(gw: Any, start_worker: Any, mp: pytest.MonkeyPatch) -> None:
    pass


async def _no_routing(gw: Any, start_worker: Any, mp: pytest.MonkeyPatch) -> None:
    gw.apply([await start_worker()], routing={})


async def _no_replica(gw: Any, start_worker: Any, mp: pytest.MonkeyPatch) -> None:
    gw.apply([await start_worker(version="v1")], routing={MODEL: ("v2", "", 0)})


def _admission_answers(answer: Callable[..., object]) -> Setup:
    async def setup(gw: Any, start_worker: Any, mp: pytest.MonkeyPatch) -> None:
        await _serving(gw, start_worker, mp)
        mp.setattr(gw.app.admission, "admit", answer)

    return setup


def _over_quota(*_: object) -> QuotaExceeded:
    return QuotaExceeded("standard", 25.0, 1.0, 1.0, 40.0)


def _overloaded(*_: object) -> Overloaded:
    return Overloaded(Priority.STANDARD, 10, 10, 8, 0.05)


def _broken(*_: object) -> object:
    raise RuntimeError("a bug in admission")


class _BrokenGuard:
    def watch(self, item: object, after_s: float) -> None:
        raise RuntimeError("a bug after admission")


async def _broken_after_admission(gw: Any, start_worker: Any, mp: pytest.MonkeyPatch) -> None:
    await _serving(gw, start_worker, mp)
    mp.setattr(gw.app, "_guard", _BrokenGuard())


SETUPS: dict[str, Setup] = {
    "serving": _serving,
    "closing": _closing,
    "no_fleet": _no_fleet,
    "no_routing": _no_routing,
    "no_replica": _no_replica,
    "over_quota": _admission_answers(_over_quota),
    "overloaded": _admission_answers(_overloaded),
    "broken_admission": _admission_answers(_broken),
    "broken_after_admission": _broken_after_admission,
}

# (request fields, metadata) per case id; the default is a well-formed request with the key.
REQUESTS: dict[str, tuple[dict[str, Any], tuple[tuple[str, str], ...]]] = {
    "missing_key": ({}, ()),
    "wrong_role": ({}, (("x-api-key", FLEET),)),
    "invalid": ({"max_output_tokens": 5000}, KEY),
    "unknown_model": ({"model": "no-such-model"}, KEY),
}

REFUSALS = {
    "shutting_down": Case("closing", "shutting_down", Ending.REFUSED),
    "missing_key": Case("serving", "unauthenticated", Ending.REFUSED),
    "wrong_role": Case("serving", "wrong_role", Ending.REFUSED),
    "invalid": Case("serving", "invalid_argument", Ending.REFUSED),
    "no_fleet_yet": Case("no_fleet", "no_capacity", Ending.REFUSED, shed=True, evidence=1),
    "unknown_model": Case("serving", "unknown_model", Ending.REFUSED),
    "no_stable_version": Case("no_routing", "no_capacity", Ending.REFUSED, shed=True, evidence=1),
    "no_replica": Case("no_replica", "no_capacity", Ending.REFUSED, shed=True, evidence=1),
    "quota": Case("over_quota", "quota_exceeded", Ending.REFUSED, shed=True),
    "overloaded": Case("overloaded", "overloaded", Ending.REFUSED, shed=True, evidence=1),
    "bug_in_admission": Case("broken_admission", "internal", Ending.REFUSED),
    "bug_after_admission": Case("broken_after_admission", "internal", Ending.FAILED, evidence=1),
}


class Recorded:
    """The gateway's ends and controller reports, spied on."""

    def __init__(self, app: GatewayApp, mp: pytest.MonkeyPatch) -> None:
        self.ends: list[RequestEnd] = []
        self.reports: list[tuple[object, ...]] = []
        record = app._record_end
        assert app.link is not None

        def spy_end(end: RequestEnd) -> None:
            self.ends.append(end)
            record(end)

        def spy_report(*args: object) -> None:
            self.reports.append(args)

        mp.setattr(app, "_record_end", spy_end)
        mp.setattr(app.link, "record_request", spy_report)


def _counted(gw: Any) -> dict[str, float]:
    """Requests counted so far by outcome (every tenant, model and version)."""
    counts: dict[str, float] = {}
    for family in gw.app.host.registry.collect():
        for s in family.samples:
            if s.name == "halcyon_gateway_requests_total" and s.value:
                counts[s.labels["outcome"]] = counts.get(s.labels["outcome"], 0) + s.value
    return counts


def _check(gw: Any, rec: Recorded, case: Case) -> None:
    assert [end.ending for end in rec.ends] == [case.ending]
    assert _counted(gw) == {case.outcome: 1}
    sheds = gw.sample("halcyon_gateway_shed_total")
    assert sheds == (1 if case.shed else 0)
    if case.shed:
        assert gw.sample("halcyon_gateway_shed_total", {"priority": "standard"}) == 1
    assert len(rec.reports) == case.evidence
    assert gw.app.admission.limiter.inflight == 0  # every ticket finished


@pytest.mark.parametrize("name", sorted(REFUSALS))
async def test_every_exit_of_admit_records_one_end(
    start_worker: Any, start_gateway: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    case = REFUSALS[name]
    gw = await start_gateway()
    await SETUPS[case.setup](gw, start_worker, monkeypatch)
    rec = Recorded(gw.app, monkeypatch)
    fields, metadata = REQUESTS.get(name, ({}, KEY))

    with pytest.raises(RichError) as info:
        gw.app.admit(gw.request(**fields), metadata, 5.0)

    assert rec.ends[0].error is info.value
    _check(gw, rec, case)


async def _answered(admitted: Admitted) -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not done.done():
            done.set_result(None)

    admitted.pending.when_answered(wake)
    await asyncio.wait_for(done, 5.0)


async def test_an_answer_records_one_end(
    start_worker: Any, start_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    rec = Recorded(gw.app, monkeypatch)

    admitted = gw.app.admit(gw.request(), KEY, 5.0)
    await _answered(admitted)
    answer = gw.app.settle(admitted)

    assert isinstance(answer, infer_pb2.InferResponse)
    _check(gw, rec, Case("serving", "ok", Ending.ANSWERED, evidence=1))
    assert gw.sample("halcyon_gateway_request_seconds_count") == 1
    assert gw.sample("halcyon_gateway_goodput_total") == 1


async def test_a_batcher_refusal_records_one_end(
    start_worker: Any, start_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker(intercept_ms=150.0)])
    rec = Recorded(gw.app, monkeypatch)

    # Admitted, then refused by the batcher: a 1 ms deadline cannot be met.
    admitted = gw.app.admit(gw.request(), KEY, 0.001)
    await _answered(admitted)
    err = gw.app.settle(admitted)

    assert isinstance(err, RichError)
    outcome = str(err.reason).lower()
    assert outcome in ("deadline_unreachable", "deadline_missed")
    _check(gw, rec, Case("serving", outcome, Ending.FAILED, shed=True, evidence=1))


async def test_a_cancelled_call_records_one_end(
    start_worker: Any, start_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = await start_gateway()
    gw.apply([await start_worker()])
    rec = Recorded(gw.app, monkeypatch)

    admitted = gw.app.admit(gw.request(), KEY, 5.0)
    admitted.pending.cancel()
    gw.app.settle_cancelled(admitted)

    _check(gw, rec, Case("serving", "cancelled", Ending.CANCELLED))
