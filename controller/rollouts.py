"""The rollout controller: the asyncio shell around the pure canary judge.

What it decides: when the judge looks, what it is shown, and what each decision does to the
world. Per running rollout it owns a :class:`controller.canary.RolloutRun`; about once a second
(``tick_s``) it hands the run the per-arm outcome deltas collected since the previous look
(:class:`controller.rollout_evidence.RolloutEvidence`) and asks it for a decision. A decision is
applied in this order:

1. **stored** — the rollout's new step, weight and state, the decision with its evidence and
   (for a promotion) the new stable version, in one SQLite transaction;
2. **routed** — the canary weight set in the routing table (or the canary cleared, or made
   stable), and the fleet republished, so every gateway has it in the next WatchFleet push;
3. **streamed** — to every ``WatchRolloutDecisions`` watcher.

Storing first means the store never lags what gateways were told: after a crash the controller
resumes from exactly what was last routed. If the write fails, nothing is routed and the run is
rebuilt from the stored state (as after a restart), so memory and disk never disagree.

Resume (ADR 0009): at start every ``progressing`` rollout is re-armed at its stored step and
weight before the first fleet snapshot is served, with fresh evidence (windows and streaks
restart; the evidence from before the crash is gone with the process). The time limit keeps
counting from the rollout's original start. A rollout whose baseline is no longer the model's
stable version (configuration changed while the controller was down) is aborted, because its
comparison no longer means anything.

Operator promote and abort act at once, through the same store-route-stream path. One asyncio
lock serialises every change, so an abort cannot interleave with a judge decision. The judge is
pure and takes readings of the injected clock; the wall clock only stamps stored records.

Gates (issue #20, :mod:`controller.canary.gates`): pause and resume change the run's gates and
are stored as operator decisions (HOLD ``paused`` / ``resumed``); an approval is the run's own
decision (ADVANCE or PROMOTE ``approved``) applied like any judge decision. Every gate is a
column of the rollout, written with the decision that changed it, so a restart re-arms a paused
rollout paused and one awaiting approval still awaiting; ``resumes_in_step`` goes up by one on
every restart (and back to 0 when the step advances) so the judge does not grant a resumed step
a fresh false-alarm budget. An analysis-only rollout routes what the run says (the first step's
share) and its terminal decision (``applied`` False) ends it as ``analyzed``: traffic back to the
baseline, nothing made stable; an operator cannot promote one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from common.clock import Clock
from controller.canary import (
    ArmSummary,
    Decision,
    Gates,
    JudgePolicy,
    RolloutAction,
    RolloutRun,
    normalize_steps,
)
from controller.canary import NotAwaitingApproval as RunNotAwaiting
from controller.convert import WallClock
from controller.decision_feed import DecisionFeed
from controller.fleet_view import FleetView
from controller.metrics import ControllerMetrics
from controller.registry import FleetRegistry
from controller.rollout_errors import (
    AnalysisOnlyRollout,
    DecisionNotStored,
    NoActiveRollout,
    NoCanaryReplica,
    NoStableVersion,
    NotAwaitingApproval,
    RolloutAlreadyPaused,
    RolloutBusy,
    RolloutNotPaused,
    UnknownModel,
)
from controller.rollout_evidence import RolloutEvidence
from controller.rollout_gates import gate_note, gates_of, start_note
from controller.rollout_policy import policy_from_dict, policy_to_dict
from controller.routing_table import MAX_WEIGHT_BP, RoutingTable
from controller.stable_versions import StableRecord, StableSource
from controller.store import (
    ArmSnapshot,
    ControllerStore,
    DecisionAction,
    DecisionRecord,
    RolloutConflict,
    RolloutRecord,
    RolloutStatus,
)

__all__ = [
    "AnalysisOnlyRollout",
    "DecisionNotStored",
    "NoActiveRollout",
    "NoCanaryReplica",
    "NoStableVersion",
    "NotAwaitingApproval",
    "RolloutAlreadyPaused",
    "RolloutBusy",
    "RolloutManager",
    "RolloutNotPaused",
    "StartRequest",
    "UnknownModel",
]

_log = logging.getLogger("halcyon.controller.rollouts")

_ACTION = {
    RolloutAction.ADVANCE: DecisionAction.ADVANCE,
    RolloutAction.HOLD: DecisionAction.HOLD,
    RolloutAction.ROLLBACK: DecisionAction.ROLLBACK,
    RolloutAction.PROMOTE: DecisionAction.PROMOTE,
}
_STATE_AFTER = {
    RolloutAction.ROLLBACK: RolloutStatus.ROLLED_BACK,
    RolloutAction.PROMOTE: RolloutStatus.PROMOTED,
}


@dataclass(frozen=True)
class StartRequest:
    """A validated StartRollout: steps as typed (normalized here), the effective policy."""

    model: str
    canary_version: str
    step_percents: tuple[float, ...]
    policy: JudgePolicy
    gates: Gates = field(default_factory=Gates)


@dataclass
class _Active:
    record: RolloutRecord
    run: RolloutRun


def _snapshot(version: str, arm: ArmSummary) -> ArmSnapshot:
    return ArmSnapshot(
        version=version,
        requests=arm.requests,
        errors=arm.errors,
        shed=arm.shed,
        error_rate=arm.error_rate,
        p50_s=arm.p50_s,
        p95_s=arm.p95_s,
    )


class RolloutManager:
    """Runs every active rollout: judge ticks, decisions stored, routed and streamed."""

    def __init__(
        self,
        *,
        store: ControllerStore,
        routing: RoutingTable,
        registry: FleetRegistry,
        view: FleetView,
        publish: Callable[[], None],
        evidence: RolloutEvidence,
        metrics: ControllerMetrics,
        clock: Clock,
        wall: WallClock,
        configured_stable: Mapping[str, str],
        tick_s: float = 1.0,
    ) -> None:
        if not tick_s > 0.0:
            raise ValueError("tick_s must be positive")
        self._store = store
        self._routing = routing
        self._registry = registry
        self._view = view
        self._publish = publish
        self.evidence = evidence
        self._metrics = metrics
        self._clock = clock
        self._wall = wall
        self._configured = dict(configured_stable)
        self.tick_s = tick_s
        self.feed = DecisionFeed()
        self._active: dict[str, _Active] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    # -- reading ------------------------------------------------------------------------------

    def active(self, model: str) -> RolloutRecord | None:
        """The running rollout of ``model``, as last stored."""
        found = self._active.get(model)
        return None if found is None else found.record

    def active_models(self) -> list[str]:
        return sorted(self._active)

    async def knows_model(self, model: str) -> bool:
        """Whether a replica, the configuration, the routing table or the store names it."""
        if self._view.resolution().for_model(model) is not None:
            return True
        return await asyncio.to_thread(self._store.has_model, model)

    # -- lifecycle ----------------------------------------------------------------------------

    async def resume(self) -> list[RolloutRecord]:
        """Re-arm every stored progressing rollout (before serving); returns those resumed."""
        stored = await asyncio.to_thread(
            self._store.list_rollouts, states=[RolloutStatus.PROGRESSING]
        )
        resumed = []
        async with self._lock:
            for record in stored:
                stable = self._routing.configured_stable(record.model)
                if stable != record.baseline_version:
                    await self._finish_stale(record, stable)
                    continue
                # One more resume of this step: the judge gives it what its budget has left.
                record = replace(record, resumes_in_step=record.resumes_in_step + 1)
                try:
                    run = self._rebuild_run(record)
                except ValueError as exc:
                    await self._finish_stale(record, stable, str(exc))
                    continue
                percent = record.canary_weight_bp / 100.0
                decision = self._decision(
                    record,
                    DecisionAction.HOLD,
                    "resumed",
                    "the controller restarted; resuming at step "
                    f"{record.step_index + 1} of {len(record.step_percents)} "
                    f"({run.canary_percent:g}%) with fresh evidence" + gate_note(record),
                    percent,
                    percent,
                )
                record = replace(record, updated_at=decision.decided_at)
                stored_decision = await asyncio.to_thread(
                    self._store.commit_decision, record, decision
                )
                self._arm(record, run)
                self.feed.publish(stored_decision)
                resumed.append(record)
                _log.info(
                    "rollout resumed",
                    extra={"model": record.model, "rollout_id": record.id,
                           "canary": record.canary_version, "percent": run.canary_percent},
                )  # fmt: skip
        if resumed:
            self._publish()
        return resumed

    def _rebuild_run(self, record: RolloutRecord) -> RolloutRun:
        """A run at the record's step with its gates; the time limit counts from the original
        start."""
        now = self._clock.now()
        elapsed = max(0.0, self._wall.now() - record.started_at)
        return RolloutRun(
            steps=normalize_steps(record.step_percents),
            policy=policy_from_dict(record.policy),
            started_at=now - elapsed,
            step_index=record.step_index,
            resumed_at=now,
            gates=gates_of(record),
            awaiting_approval=record.awaiting_approval,
            resumes_in_step=record.resumes_in_step,
        )

    async def _finish_stale(
        self, record: RolloutRecord, stable: str | None, problem: str | None = None
    ) -> None:
        detail = problem or (
            f"the stable version of {record.model!r} is now {stable or 'unset'}, not the "
            f"rollout's baseline {record.baseline_version}; its comparison no longer holds"
        )
        percent = record.canary_weight_bp / 100.0
        decision = self._decision(
            record, DecisionAction.ABORT, "baseline_changed", detail, percent, 0.0
        )
        finished = replace(
            record, state=RolloutStatus.ABORTED, canary_weight_bp=0, updated_at=self._wall.now()
        )
        stored = await asyncio.to_thread(self._store.commit_decision, finished, decision)
        self.feed.publish(stored)
        _log.warning("rollout not resumed", extra={"model": record.model, "detail": detail})

    def start(self) -> None:
        """Start judging (inside the running loop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._tick_forever(), name="rollout-judge")

    async def close(self) -> None:
        """Stop judging and end every decision stream (before the server stops)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.feed.close()

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.tick()
            except Exception:  # one bad tick must not stop every rollout for good
                _log.exception("rollout tick failed")

    # -- the judge ----------------------------------------------------------------------------

    async def tick(self) -> list[DecisionRecord]:
        """Show every running rollout its new evidence; apply what the judge decides."""
        taken = []
        async with self._lock:
            for model in list(self._active):
                active = self._active[model]
                baseline, canary = self.evidence.take(model)
                now = self._clock.now()
                active.run.observe(baseline, canary, now)
                decision = active.run.tick(now)
                if decision is not None:
                    stored = await self._apply(active, decision)
                    if stored is not None:
                        taken.append(stored)
        return taken

    async def _apply(self, active: _Active, decision: Decision) -> DecisionRecord | None:
        return (await self._apply_run_decision(active, decision))[1]

    async def _apply_run_decision(
        self, active: _Active, decision: Decision
    ) -> tuple[RolloutRecord, DecisionRecord | None]:
        """Store, route and stream a decision of the run; the rollout as it leaves it."""
        record, run = active.record, active.run
        action = _ACTION[decision.action]
        state = _STATE_AFTER.get(decision.action, RolloutStatus.PROGRESSING)
        if state is not RolloutStatus.PROGRESSING and not decision.applied:
            # Analysis only: the verdict is recorded, traffic goes back, nothing is promoted.
            state = RolloutStatus.ANALYZED
        weight = MAX_WEIGHT_BP if state is RolloutStatus.PROMOTED else 0
        if state is RolloutStatus.PROGRESSING:
            weight = run.weight_bp
        updated = replace(
            record,
            step_index=run.step_index,
            canary_weight_bp=weight,
            state=state,
            updated_at=self._wall.now(),
            paused=run.gates.paused,
            auto_rollback=run.gates.auto_rollback,
            awaiting_approval=run.awaiting_approval,
            # A new step starts its budget afresh; the run says so, and so does a moved index.
            resumes_in_step=(run.resumes_in_step if run.step_index == record.step_index else 0),
        )
        row = replace(
            self._decision(
                record,
                action,
                decision.reason,
                decision.detail,
                decision.from_percent,
                decision.to_percent,
            ),
            decided_at=updated.updated_at,
            baseline=_snapshot(record.baseline_version, decision.baseline),
            canary=_snapshot(record.canary_version, decision.canary),
            statistics=dict(decision.statistics),
            needed_requests=decision.needed_requests,
            applied=decision.applied,
        )
        return updated, await self._commit(active, updated, row)

    async def _commit(
        self, active: _Active, updated: RolloutRecord, row: DecisionRecord
    ) -> DecisionRecord | None:
        """Store, then route, then stream one decision (the caller holds the lock)."""
        model = updated.model
        promoted = updated.state is RolloutStatus.PROMOTED
        stable = (
            StableRecord(
                model=model,
                version=updated.canary_version,
                source=StableSource.PROMOTION,
                config_version=self._configured.get(model),
                updated_at=updated.updated_at,
            )
            if promoted
            else None
        )
        try:
            stored = await asyncio.to_thread(self._store.commit_decision, updated, row, stable)
        except Exception:
            _log.exception(
                "cannot store a rollout decision; nothing routed, the rollout continues from "
                "its stored state",
                extra={"model": model, "action": str(row.action), "reason": row.reason},
            )
            with contextlib.suppress(ValueError):
                active.run = self._rebuild_run(active.record)
            return None
        active.record = updated
        if updated.state is RolloutStatus.PROGRESSING:
            self._routing.set_canary(model, updated.canary_version, updated.canary_weight_bp)
        else:
            del self._active[model]
            self.evidence.unwatch(model)
            if promoted:
                self._routing.set_stable(model, updated.canary_version)
            else:
                self._routing.clear_canary(model)
        self._publish()
        self._metrics.count_decision(model, str(row.action), row.reason)
        running = updated.state is RolloutStatus.PROGRESSING
        self._metrics.set_rollout(model, updated.canary_version,
                                  updated.canary_weight_bp if running else None,
                                  len(self._active))  # fmt: skip
        self.feed.publish(stored)
        _log.info(
            "rollout decision",
            extra={"model": model, "rollout_id": updated.id, "action": str(row.action),
                   "reason": row.reason, "from_percent": row.from_percent,
                   "to_percent": row.to_percent, "detail": row.detail},
        )  # fmt: skip
        return stored

    # -- operator actions ---------------------------------------------------------------------

    async def start_rollout(self, request: StartRequest) -> RolloutRecord:
        """Start a rollout; raises UnknownModel, NoStableVersion, NoCanaryReplica, RolloutBusy."""
        model, canary = request.model, request.canary_version
        async with self._lock:
            route = self._view.resolution().for_model(model)
            if route is None and not await self.knows_model(model):
                raise UnknownModel(model, precondition=True)
            if route is None or not route.stable_version:
                versions = tuple(sorted(self._registry.versions_by_model().get(model, ())))
                raise NoStableVersion(model, versions)
            # With the canary registered, a model has a stable version only if one is
            # configured or was promoted (never "the only version registered"), so the
            # baseline is persisted already and survives a restart.
            baseline = route.stable_version
            if not self._live_replicas(model, canary):
                raise NoCanaryReplica(model, canary)
            running = self._active.get(model)
            if running is not None:
                raise RolloutBusy(running.record)
            now = self._clock.now()
            run = RolloutRun(
                steps=normalize_steps(request.step_percents),
                policy=request.policy,
                started_at=now,
                gates=request.gates,
            )
            wall_now = self._wall.now()
            record = RolloutRecord(
                model=model,
                baseline_version=baseline,
                canary_version=canary,
                step_percents=tuple(normalize_steps(request.step_percents)),
                state=RolloutStatus.PROGRESSING,
                started_at=wall_now,
                updated_at=wall_now,
                step_index=run.step_index,
                canary_weight_bp=run.weight_bp,
                policy=policy_to_dict(request.policy),
                approval=str(request.gates.approval),
                analysis_only=request.gates.analysis_only,
            )
            first = self._decision(
                record,
                DecisionAction.START,
                "started",
                f"{canary} against {baseline}: steps "
                f"{', '.join(f'{p:g}' for p in record.step_percents)} % then promote; "
                f"{run.weight_bp / 100:g}% of sessions now go to {canary}"
                + start_note(request.gates),
                0.0,
                run.weight_bp / 100,
            )
            try:
                record, stored = await asyncio.to_thread(self._store.start_rollout, record, first)
            except RolloutConflict:
                # Another controller on the same store file got there first.
                others = await asyncio.to_thread(
                    self._store.list_rollouts, model, [RolloutStatus.PROGRESSING]
                )
                raise RolloutBusy(others[0] if others else record) from None
            self._arm(record, run)
            self._publish()
            self._metrics.count_decision(model, str(DecisionAction.START), "")
            self.feed.publish(stored)
        _log.info(
            "rollout started",
            extra={"model": model, "rollout_id": record.id, "canary": canary,
                   "baseline": baseline, "steps": list(record.step_percents)},
        )  # fmt: skip
        return record

    def _arm(self, record: RolloutRecord, run: RolloutRun) -> None:
        self._active[record.model] = _Active(record, run)
        self.evidence.watch(record.model, record.baseline_version, record.canary_version)
        self._routing.set_canary(record.model, record.canary_version, record.canary_weight_bp)
        self._metrics.set_rollout(
            record.model, record.canary_version, record.canary_weight_bp, len(self._active)
        )

    def _live_replicas(self, model: str, version: str) -> int:
        return sum(
            1
            for m in self._registry.members()
            if m.descriptor.model == model and m.descriptor.version == version and not m.draining
        )

    async def promote(self, model: str) -> RolloutRecord:
        """Make the canary stable now (operator); raises NoActiveRollout / UnknownModel, and
        AnalysisOnlyRollout for a dry run."""
        return await self._operator(model, RolloutStatus.PROMOTED, "operator", "")

    async def abort(self, model: str, why: str) -> RolloutRecord:
        """Send all traffic back to the baseline now (operator)."""
        return await self._operator(model, RolloutStatus.ABORTED, "operator", why)

    async def _operator(
        self, model: str, state: RolloutStatus, reason: str, why: str
    ) -> RolloutRecord:
        async with self._lock:
            active = self._active.get(model)
            if active is None:
                if not await self.knows_model(model):
                    raise UnknownModel(model)
                raise NoActiveRollout(model)
            record = active.record
            percent = record.canary_weight_bp / 100.0
            promote = state is RolloutStatus.PROMOTED
            if promote and record.analysis_only:
                raise AnalysisOnlyRollout(record)
            detail = (
                f"an operator promoted {record.canary_version} from {percent:g}%"
                if promote
                else f"an operator aborted the rollout at {percent:g}%"
                + (f": {why}" if why else "")
            )
            updated = replace(
                record,
                state=state,
                canary_weight_bp=MAX_WEIGHT_BP if promote else 0,
                updated_at=self._wall.now(),
            )
            row = self._decision(
                record,
                DecisionAction.PROMOTE if promote else DecisionAction.ABORT,
                reason,
                detail,
                percent,
                100.0 if promote else 0.0,
            )
            row = replace(row, decided_at=updated.updated_at)
            if await self._commit(active, updated, row) is None:
                raise DecisionNotStored(
                    f"the controller could not store the decision for {model!r}; "
                    "nothing changed, try again"
                )
            return updated

    async def _running(self, model: str) -> _Active:
        """The running rollout of ``model`` (the caller holds the lock), or the error an
        operator action raises for a model with none."""
        active = self._active.get(model)
        if active is None:
            if not await self.knows_model(model):
                raise UnknownModel(model)
            raise NoActiveRollout(model)
        return active

    async def pause(
        self, model: str, *, auto_rollback: bool = True, why: str = ""
    ) -> RolloutRecord:
        """Hold the canary's weight; judging continues (operator). ``auto_rollback``: whether a
        proven regression still rolls back while paused. Raises RolloutAlreadyPaused,
        NoActiveRollout, UnknownModel, DecisionNotStored."""
        async with self._lock:
            active = await self._running(model)
            record = active.record
            if active.run.gates.paused:
                raise RolloutAlreadyPaused(record)
            percent = record.canary_weight_bp / 100.0
            detail = (
                f"an operator paused the rollout at {percent:g}%: the weight holds and the "
                "judge keeps judging; "
                + (
                    "a proven regression still rolls back"
                    if auto_rollback
                    else "auto-rollback is off, a proven regression is held for the operator"
                )
                + (f": {why}" if why else "")
            )
            gates = replace(active.run.gates, paused=True, auto_rollback=auto_rollback)
            return await self._set_gates(active, gates, "paused", detail)

    async def resume_rollout(self, model: str, *, why: str = "") -> RolloutRecord:
        """Lift a pause: the rollout continues from where it was (operator). Raises
        RolloutNotPaused, NoActiveRollout, UnknownModel, DecisionNotStored."""
        async with self._lock:
            active = await self._running(model)
            record = active.record
            if not active.run.gates.paused:
                raise RolloutNotPaused(record)
            detail = (
                f"an operator resumed the rollout at {record.canary_weight_bp / 100:g}%: the "
                "judge moves traffic on its verdicts again" + (f": {why}" if why else "")
            )
            gates = replace(active.run.gates, paused=False, auto_rollback=True)
            return await self._set_gates(active, gates, "resumed", detail)

    async def _set_gates(
        self, active: _Active, gates: Gates, reason: str, detail: str
    ) -> RolloutRecord:
        """Change the run's gates and store it as an operator decision (lock held)."""
        record = active.record
        active.run.set_gates(gates, self._clock.now())
        percent = record.canary_weight_bp / 100.0
        updated = replace(
            record,
            paused=active.run.gates.paused,
            auto_rollback=active.run.gates.auto_rollback,
            awaiting_approval=active.run.awaiting_approval,
            updated_at=self._wall.now(),
        )
        row = replace(
            self._decision(record, DecisionAction.HOLD, reason, detail, percent, percent),
            decided_at=updated.updated_at,
        )
        if await self._commit(active, updated, row) is None:
            raise DecisionNotStored(
                f"the controller could not store the decision for {record.model!r}; "
                "nothing changed, try again"
            )
        return updated

    async def approve(self, model: str) -> tuple[RolloutRecord, DecisionRecord]:
        """Take the move the rollout waits for (operator): the run's ADVANCE or PROMOTE,
        reason ``approved``. Raises NotAwaitingApproval, NoActiveRollout, UnknownModel,
        DecisionNotStored."""
        async with self._lock:
            active = await self._running(model)
            try:
                decision = active.run.approve(self._clock.now())
            except RunNotAwaiting as exc:
                raise NotAwaitingApproval(active.record, str(exc)) from None
            updated, stored = await self._apply_run_decision(active, decision)
            if stored is None:
                raise DecisionNotStored(
                    f"the controller could not store the approval for {model!r}; "
                    "nothing changed, try again"
                )
            return updated, stored

    def _decision(
        self,
        record: RolloutRecord,
        action: DecisionAction,
        reason: str,
        detail: str,
        from_percent: float,
        to_percent: float,
    ) -> DecisionRecord:
        """A decision, stamped now, without evidence (start, resume, operator actions)."""
        return DecisionRecord(
            rollout_id=record.id,
            model=record.model,
            action=action,
            reason=reason,
            detail=detail,
            from_percent=from_percent,
            to_percent=to_percent,
            decided_at=self._wall.now(),
        )
