"""A worker process assembled: host, simulated device, replica, servicer, controller session.

What it decides: the order things happen in a worker's life.

* start: bind (health, reflection, metrics, auth), learn the bound port, fix the replica's
  identity (id ``worker-<port>`` and advertised address default to the bound ones), measure
  the runtime's warm-up batches (``--no-warm-up`` skips it; readiness stays off meanwhile),
  become ready, then register with the controller (if one is configured), warm-up included;
* drain (Drain RPC, the controller's drain command, or SIGTERM): readiness off, refuse new
  batches, finish in-flight ones within the grace — every trigger waits for the same drain.
  The replica stays registered, reporting ``draining``, so it can be put back;
* undrain (Undrain RPC or the controller's undrain command): readiness on, take batches
  again, report it at once — refused once the process is shutting down;
* runtime away (its ``ready()`` False: an OIP backend down or its model unloaded): readiness
  off and deregistered, so gateways stop sending to it; back: readiness on (unless draining)
  and registered again (:meth:`WorkerApp._follow_runtime`);
* stop (SIGTERM after its drain, or :meth:`WorkerApp.stop`): deregister, close the server.

Without ``controller`` the worker runs standalone (gateways can still be pointed at it).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from opentelemetry import trace

from common.auth import AuthPolicy
from common.backoff import Backoff
from common.clock import Clock, MonotonicClock
from common.cost_samples import MAX_WARMUP_SAMPLES, CostSampleValue
from common.rng import SeededRng
from common.serving import (
    ServiceHost,
    ServingOptions,
    TlsOptions,
    format_hostport,
    parse_hostport,
)
from halcyon.v1 import worker_pb2, worker_pb2_grpc
from worker.descriptor import ReplicaIdentity
from worker.faults import FaultInjector
from worker.metrics import WorkerMetrics
from worker.registration import ControllerSession
from worker.replica import DrainResult, Replica, ReplicaShuttingDown
from worker.runtime import ModelRuntime
from worker.runtimes import OipOptions, OnnxOptions, RuntimeKind, SimulatedOptions, build_runtime
from worker.servicer import (
    EXECUTE_BATCH_METHOD,
    SERVICE_NAME,
    ExecuteBatchAdapter,
    WorkerService,
)
from worker.slots import SlotTable

__all__ = ["WorkerApp", "WorkerConfig", "worker_auth_policy"]

_log = logging.getLogger("halcyon.worker")
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def worker_auth_policy(fleet_token: str, operator_token: str | None) -> AuthPolicy:
    """Every WorkerService call needs the fleet credential (common.auth.METHOD_ACCESS); the
    operator credential, when known, is only recognised so that it is refused as WRONG_ROLE."""
    return AuthPolicy(fleet_token=fleet_token, operator_token=operator_token)


@dataclass
class WorkerConfig:
    """Everything a worker is configured with (the ``halcyon worker`` flags)."""

    fleet_token: str
    operator_token: str | None
    replica_id: str | None = None  # None: worker-<bound port>
    model: str = "llama-3-8b"
    version: str = "v1"
    hardware: str = "a10g"
    slots: int = 1
    speed: float = 1.0
    intercept_ms: float = 18.0
    ms_per_token: float = 0.022
    jitter: float = 0.08
    seed: int = 0
    controller: str | None = None  # host:port; None = standalone
    controller_tls: TlsOptions | None = None
    advertise: str | None = None  # None: the bound address
    fail_rate: float = 0.0
    fail_fast_ms: float = 2.0
    slowdown: float = 1.0
    hang_rate: float = 0.0
    # Measure warm-up batches on the runtime before registering (ModelRuntime.warm_up).
    warm_up: bool = True
    runtime: RuntimeKind = RuntimeKind.SIMULATED
    onnx: OnnxOptions | None = None
    oip: OipOptions | None = None
    reconnect: Backoff = field(default_factory=Backoff)
    serving: ServingOptions = field(default_factory=ServingOptions)


class WorkerApp:
    """One worker: start, drain, stop, or run until SIGTERM."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        runtime: ModelRuntime | None = None,
        tracer: trace.Tracer | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self.host = ServiceHost(
            "worker",
            config.serving,
            worker_auth_policy(config.fleet_token, config.operator_token),
            tracer=tracer,
        )
        self.metrics = WorkerMetrics(self.host.registry, model=config.model, version=config.version)
        self.faults = FaultInjector(
            fail_rate=config.fail_rate,
            fail_fast_ms=config.fail_fast_ms,
            slowdown=config.slowdown,
            hang_rate=config.hang_rate,
            rng=SeededRng(config.seed + 1),
        )
        self.runtime: ModelRuntime = (
            runtime
            if runtime is not None
            else build_runtime(
                config.runtime,
                simulated=SimulatedOptions(
                    intercept_ms=config.intercept_ms,
                    ms_per_token=config.ms_per_token,
                    speed=config.speed,
                    jitter=config.jitter,
                    seed=config.seed,
                ),
                onnx=config.onnx,
                oip=config.oip,
                clock=self._clock,
                faults=self.faults if self.faults.active else None,
            )
        )
        self.slots = SlotTable(config.slots, self._clock)
        self.replica = Replica(self.runtime, self.slots)
        self.metrics.track_slots(config.slots, lambda: self.slots.busy)
        self.servicer = WorkerService(
            identity=self._identity_now,
            replica=self.replica,
            drain=self.drain,
            undrain=self.undrain,
            metrics=self.metrics,
        )
        self.host.add_service(
            worker_pb2_grpc.add_WorkerServiceServicer_to_server, self.servicer, SERVICE_NAME
        )
        # ExecuteBatch off its own completion queue where it may attach (ADR 0006), else
        # grpc.aio: one adapter, behind the host's pipeline, either way.
        self.host.add_unary(
            EXECUTE_BATCH_METHOD,
            ExecuteBatchAdapter(self.servicer),
            deserializer=worker_pb2.ExecuteBatchRequest.FromString,
        )
        self.identity: ReplicaIdentity | None = None
        self.session: ControllerSession | None = None
        self._drain_task: asyncio.Task[DrainResult] | None = None
        self._shutting_down = False
        self._signals_in_start = False
        self.warm_up_interrupted = False
        self._follow_task: asyncio.Task[None] | None = None
        self.runtime_away = False  # the runtime said not ready: NOT_SERVING, out of the fleet

    def _identity_now(self) -> ReplicaIdentity:
        if self.identity is None:
            raise RuntimeError("worker not started")
        return self.identity

    def _advertised_address(self) -> str:
        if self.config.advertise:
            return self.config.advertise
        host, port = parse_hostport(self.host.grpc_address)
        if host in _WILDCARD_HOSTS:
            _log.warning(
                "listening on a wildcard address; advertising 127.0.0.1 — pass --advertise",
                extra={"listen": self.host.grpc_address},
            )
            host = "127.0.0.1"
        return format_hostport(host, port)

    async def start(self) -> None:
        # The model first: a model that cannot serve fails the start (RuntimeStartError)
        # before any port is bound or the controller hears of this replica.
        await self.runtime.start()
        await self.host.start()
        cfg = self.config
        self.identity = ReplicaIdentity(
            replica_id=cfg.replica_id or f"worker-{self.host.grpc_port}",
            address=self._advertised_address(),
            model=cfg.model,
            version=cfg.version,
            hardware=cfg.hardware,
            slots=cfg.slots,
            speed=cfg.speed,
            runtime=self.runtime.kind,
        )
        if cfg.warm_up:
            # Ready and registered only once the cost is measured: a gateway then predicts
            # this replica's batches from the first one on (ModelRuntime.warm_up).
            self.identity = replace(self.identity, warmup=await self._warm_up())
            if self.warm_up_interrupted:
                return  # SIGTERM while measuring: serve_until_signal shuts down at once
        self.host.set_ready(True)
        _log.info(
            "worker ready",
            extra={
                "replica_id": self.identity.replica_id,
                "address": self.identity.address,
                "model": cfg.model,
                "version": cfg.version,
                "slots": cfg.slots,
                "speed": cfg.speed,
                "runtime": self.runtime.kind,
                "faults": self.faults.active,
            },
        )
        if cfg.controller:
            self.session = self._new_session()
            self.session.start()
        else:
            _log.info("no --controller given: running standalone, not registered in a fleet")
        self._follow_task = asyncio.get_running_loop().create_task(
            self._follow_runtime(), name="worker-follow-runtime"
        )

    async def _warm_up(self) -> tuple[CostSampleValue, ...]:
        """The runtime's warm-up, logged. Under :meth:`run_until_signal` a SIGTERM/SIGINT
        meanwhile ends it at once (a 30 s device's warm-up takes a minute) and shuts down."""
        started = self._clock.now()
        measuring = asyncio.ensure_future(self.runtime.warm_up())
        installed = self._interrupt_on_signal(measuring) if self._signals_in_start else []
        try:
            samples = tuple(await measuring)[:MAX_WARMUP_SAMPLES]
        except asyncio.CancelledError:
            if not self.warm_up_interrupted:
                raise
            _log.info("warm-up interrupted by a signal: shutting down, not registering")
            return ()
        finally:
            loop = asyncio.get_running_loop()
            for sig in installed:
                loop.remove_signal_handler(sig)
        _log.info(
            "warm-up measured",
            extra={
                "runtime": self.runtime.kind,
                "took_s": round(self._clock.now() - started, 3),
                "batches": [
                    {"tokens": s.batch_tokens, "items": s.items, "seconds": round(s.seconds, 6)}
                    for s in samples
                ],
            },
        )
        return samples

    def _interrupt_on_signal(
        self, measuring: asyncio.Future[tuple[CostSampleValue, ...]]
    ) -> list[signal.Signals]:
        def interrupt(sig: signal.Signals) -> None:
            _log.info("signal received during warm-up", extra={"signal": sig.name})
            self.warm_up_interrupted = True
            measuring.cancel()
            self.host.request_shutdown()

        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, interrupt, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        return installed

    def _new_session(self) -> ControllerSession:
        """A (not yet started) session with the controller: at start, and again each time the
        runtime comes back after being away (:meth:`_follow_runtime`)."""
        cfg = self.config
        assert cfg.controller is not None
        identity = self._identity_now()
        return ControllerSession(
            target=cfg.controller,
            fleet_token=cfg.fleet_token,
            descriptor=identity.to_proto,
            load=lambda: self.replica.load().to_proto(),
            on_drain=lambda reason: self.drain(self.config.serving.grace_s, reason),
            on_undrain=self.undrain,
            channel_credentials=(
                cfg.controller_tls.channel_credentials() if cfg.controller_tls else None
            ),
            backoff=cfg.reconnect,
            rng=SeededRng(cfg.seed + 2),
            metrics=self.metrics,
        )

    async def drain(self, grace_s: float, reason: str = "drain requested") -> DrainResult:
        """Readiness off, finish or cancel in-flight batches; stay registered as draining.

        Idempotent until :meth:`undrain`: every trigger waits for the same drain.
        """
        if self._drain_task is None:
            _log.info("draining", extra={"reason": reason, "grace_s": grace_s})
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(grace_s))
        return await asyncio.shield(self._drain_task)

    async def _drain(self, grace_s: float) -> DrainResult:
        self.host.set_ready(False)
        self.metrics.draining.set(1)
        self.replica.stop_accepting()
        if self.session is not None:
            self.session.send_heartbeat_now()  # tell the controller now, not at the next beat
        result = await self.replica.drain(grace_s)
        _log.info(
            "drained",
            extra={
                "finished": result.batches_finished,
                "cancelled": result.batches_cancelled,
                "registered": self.session is not None and self.session.connected,
            },
        )
        return result

    async def undrain(self, reason: str = "undrain requested") -> bool:
        """Take work again after a drain; False if there was none to undo.

        Raises :class:`ReplicaShuttingDown` once the process is stopping: that drain is final.
        """
        if self._shutting_down:
            raise ReplicaShuttingDown(
                "the worker is shutting down; start a new worker process instead"
            )
        if not self.replica.undrain():
            return False
        self._drain_task = None
        self.metrics.draining.set(0)
        self.host.set_ready(not self.runtime_away)
        if self.session is not None:
            self.session.send_heartbeat_now()  # gateways route to it again from this beat
        _log.info("undrained", extra={"reason": reason})
        return True

    async def stop(self) -> None:
        self._shutting_down = True
        await self._stop_following()
        if self.session is not None:
            await self.session.close()
        await self.host.stop()
        await self.runtime.close()

    async def run_until_signal(self, after_start: Callable[[], None] | None = None) -> None:
        """Start, serve until SIGTERM/SIGINT, then drain within the grace and stop."""
        self._signals_in_start = True  # a signal during the warm-up ends it (see _warm_up)
        await self.start()
        if after_start is not None:
            after_start()
        await self.host.serve_until_signal(
            on_shutdown=lambda: self._drain_for_shutdown(self.config.serving.grace_s)
        )
        await self._stop_following()
        if self.session is not None:
            await self.session.close()
        await self.runtime.close()

    async def _drain_for_shutdown(self, grace_s: float) -> None:
        self._shutting_down = True
        await self.drain(grace_s, "shutting down")
        if self.session is not None:
            await self.session.close()  # deregister: the controller removes it at once

    # -- following the runtime's readiness (a remote backend's) ------------------------------

    async def _follow_runtime(self, interval_s: float = 0.2) -> None:
        """Readiness follows the runtime's (an OIP backend's; in-process runtimes are always
        ready). When it goes away: health readiness NOT_SERVING and the session is closed —
        a clean deregistration, so the controller drops the replica at once and gateways stop
        sending to it. When it is back: SERVING again (unless draining) and a new session
        registers the same replica. In-flight batches are not touched: a backend that died
        under them fails them as device faults, and the gateway retries them elsewhere."""
        while not self._shutting_down:
            await asyncio.sleep(interval_s)
            ready = self.runtime.ready()
            if ready != self.runtime_away or self._shutting_down:
                continue  # no change
            self.runtime_away = not ready
            if not ready:
                _log.warning(
                    "model runtime not ready: leaving the fleet until it is back",
                    extra={"runtime": self.runtime.kind},
                )
                self.host.set_ready(False)
                session, self.session = self.session, None
                if session is not None:
                    await session.close()
                continue
            _log.info("model runtime ready again: rejoining", extra={"runtime": self.runtime.kind})
            self.host.set_ready(self._drain_task is None)
            if self.config.controller and self.session is None and not self._shutting_down:
                self.session = self._new_session()
                self.session.start()

    async def _stop_following(self) -> None:
        task, self._follow_task = self._follow_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
