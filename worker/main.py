"""``halcyon worker``: run one model replica on a simulated device, ONNX Runtime, or a
remote Open Inference Protocol backend.

What it decides: the command-line surface of a worker (flags, defaults, help) and the
process lifecycle around :class:`~worker.app.WorkerApp`: JSON logs, tracing, serve until
SIGTERM/SIGINT, then readiness off, drain in-flight batches within ``--shutdown-grace``,
deregister, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from common.argtypes import hostport, non_negative, positive, probability
from common.backoff import Backoff
from common.controller_targets import controller_addresses
from common.credentials import CredentialError, add_credential_arguments, load_credentials
from common.gc_tuning import tune_for_serving
from common.logs import configure_logging
from common.parent_death import die_with_parent
from common.serving import (
    ServingFailed,
    add_serving_arguments,
    outgoing_tls_from_args,
    serving_options_from_args,
)
from common.thread_scheduling import add_helper_threads_argument, tune_threads
from common.tracing import configure_tracing
from worker.app import WorkerApp, WorkerConfig
from worker.runtime import RuntimeStartError
from worker.runtimes import OipOptions, OnnxOptions, RuntimeKind

__all__ = ["configure", "run"]

_log = logging.getLogger("halcyon.worker")

_EPILOG = """\
examples:
  halcyon worker --dev-mode --controller 127.0.0.1:50050
  halcyon worker --listen 127.0.0.1:50061 --metrics-listen 127.0.0.1:9461 \\
      --fleet-token-file /run/secrets/fleet \\
      --replica-id straggler --speed 0.6 --controller 127.0.0.1:50050
  halcyon worker --dev-mode --version v2 --fail-rate 0.2 --controller 127.0.0.1:50050  # bad canary
  halcyon model generate --out model.onnx        # a small byte-level decoder, seeded
  halcyon worker --dev-mode --runtime onnx --model-file model.onnx --threads 2 \
      --controller 127.0.0.1:50050
  halcyon worker --dev-mode --runtime oip --backend 127.0.0.1:8081 --backend-model decoder \
      --controller 127.0.0.1:50050                  # Triton, KServe, MLServer, OVMS

On the simulated device (the default runtime) a batch takes
(intercept-ms + ms-per-token * tokens) / speed * (1 +/- jitter),
where tokens = sum(input_tokens + max_output_tokens) over its items. All slots busy is
answered at once with RESOURCE_EXHAUSTED / REPLICA_BUSY and a computed retry delay.
"""


def _slots(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("a replica needs at least one slot")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``halcyon worker`` flags to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    ident = parser.add_argument_group("replica")
    ident.add_argument(
        "--replica-id", metavar="ID", help="unique replica id (default worker-<grpc port>)"
    )
    ident.add_argument("--model", default="llama-3-8b", help="model served (default %(default)s)")
    ident.add_argument("--version", default="v1", help="model version served (default %(default)s)")
    ident.add_argument(
        "--hardware", default="a10g", help="accelerator label for operators (default %(default)s)"
    )
    ident.add_argument(
        "--slots",
        type=_slots,
        default=1,
        help="batches executed concurrently; more are refused as busy (default %(default)s)",
    )
    runtime = parser.add_argument_group("model runtime")
    runtime.add_argument(
        "--runtime",
        choices=[k.value for k in RuntimeKind],
        default=RuntimeKind.SIMULATED.value,
        help="what executes a batch: the calibrated simulated device, an ONNX model in this "
        "process, or a remote Open Inference Protocol server (default %(default)s)",
    )
    runtime.add_argument(
        "--model-file",
        metavar="PATH.onnx",
        help="--runtime onnx: the ONNX model (see the README's model contract); "
        "'halcyon model generate' makes one",
    )
    runtime.add_argument(
        "--threads",
        type=_slots,
        default=1,
        metavar="N",
        help="--runtime onnx: ONNX Runtime intra-op threads (default %(default)s)",
    )
    runtime.add_argument(
        "--backend",
        type=hostport,
        metavar="HOST:PORT",
        help="--runtime oip: the backend's KServe v2 gRPC (GRPCInferenceService) address",
    )
    runtime.add_argument(
        "--backend-model", metavar="NAME", help="--runtime oip: the model name on the backend"
    )
    runtime.add_argument(
        "--backend-model-version",
        default="",
        metavar="VERSION",
        help="--runtime oip: the model version on the backend (default: the backend's choice)",
    )
    runtime.add_argument(
        "--input-tensor",
        default="text_input",
        metavar="NAME",
        help="--runtime oip: BYTES input holding each prompt (default %(default)s)",
    )
    runtime.add_argument(
        "--max-tokens-tensor",
        default="max_tokens",
        metavar="NAME",
        help="--runtime oip: INT32 input holding each max output tokens (default %(default)s)",
    )
    runtime.add_argument(
        "--output-tensor",
        default="text_output",
        metavar="NAME",
        help="--runtime oip: BYTES output holding each generated text (default %(default)s)",
    )
    runtime.add_argument(
        "--backend-start-timeout",
        type=positive,
        default=30.0,
        metavar="SECONDS",
        help="--runtime oip: how long to wait at start for the backend and its model to be "
        "ready before exiting with an error (default %(default)s)",
    )
    runtime.add_argument(
        "--backend-timeout",
        type=positive,
        default=120.0,
        metavar="SECONDS",
        help="--runtime oip: timeout of one ModelInfer call; a cancelled batch (deadline, "
        "hedge) cancels its call sooner (default %(default)s)",
    )
    device = parser.add_argument_group("simulated device")
    device.add_argument(
        "--speed",
        type=positive,
        default=1.0,
        help="relative device speed; 0.6 is a straggler (default %(default)s)",
    )
    device.add_argument(
        "--intercept-ms",
        type=non_negative,
        default=18.0,
        metavar="MS",
        help="fixed cost per batch at speed 1 (default %(default)s)",
    )
    device.add_argument(
        "--ms-per-token",
        type=non_negative,
        default=0.022,
        metavar="MS",
        help="marginal cost per work token at speed 1 (default %(default)s)",
    )
    device.add_argument(
        "--jitter",
        type=probability,
        default=0.08,
        metavar="FRACTION",
        help="uniform noise on device time, +/- this fraction (default %(default)s)",
    )
    device.add_argument(
        "--seed", type=int, default=0, help="seed for jitter and faults (default %(default)s)"
    )
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--controller",
        type=controller_addresses,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="controller to register with; several (comma-separated) for controllers that "
        "elect a leader: a standby's refusal or a lost one moves the worker to the next "
        "(default: none; the worker runs standalone and only gateways told its address can "
        "use it)",
    )
    fleet.add_argument(
        "--advertise",
        type=hostport,
        metavar="HOST:PORT",
        help="address gateways should dial (default: the bound --listen address)",
    )
    fleet.add_argument(
        "--warm-up",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before registering, run a few small batches on the runtime and send what they "
        "cost with the registration, so gateways predict this replica's batches (and give a "
        "slow device the time it needs) from its first request on; it costs about two of the "
        "device's fixed batch costs — a device whose batches take 5 s registers ~10 s after "
        "start (default: on; --no-warm-up registers at once and the gateway learns the cost "
        "from the first batch)",
    )
    fleet.add_argument(
        "--reconnect-max-s",
        type=positive,
        default=10.0,
        metavar="SECONDS",
        help="ceiling of the controller reconnect backoff (default %(default)s)",
    )
    faults = parser.add_argument_group("fault injection")
    faults.add_argument(
        "--fail-rate",
        type=probability,
        metavar="RATE",
        default=0.0,
        help="fraction of batches that fail fast with INTERNAL / DEVICE_FAULT (default 0)",
    )
    faults.add_argument(
        "--fail-fast-ms",
        type=non_negative,
        default=2.0,
        metavar="MS",
        help="how long a failing batch takes to fail (default %(default)s)",
    )
    faults.add_argument(
        "--slowdown",
        type=positive,
        default=1.0,
        metavar="FACTOR",
        help="multiply every batch's device time, e.g. 3 for a degraded GPU (default 1)",
    )
    faults.add_argument(
        "--hang-rate",
        type=probability,
        metavar="RATE",
        default=0.0,
        help="fraction of batches that hang until cancelled (default 0)",
    )
    add_credential_arguments(
        parser, fleet_use="presented to the controller and required of gateways"
    )
    add_serving_arguments(
        parser, default_listen="127.0.0.1:50060", default_metrics_listen="127.0.0.1:9460"
    )
    add_helper_threads_argument(parser, default="normal")


class RuntimeFlagError(Exception):
    """The runtime flags do not describe a runtime (a missing --model-file, --backend ...)."""


def _runtime_options(
    args: argparse.Namespace,
) -> tuple[RuntimeKind, OnnxOptions | None, OipOptions | None]:
    kind = RuntimeKind(args.runtime)
    onnx: OnnxOptions | None = None
    oip: OipOptions | None = None
    if kind is RuntimeKind.ONNX:
        model_file = args.model_file
        if model_file is None and str(args.model).endswith(".onnx"):
            # `--runtime onnx --model PATH.onnx`: the file, served under its stem's name.
            model_file = args.model
            args.model = Path(model_file).stem
        if model_file is None:
            raise RuntimeFlagError(
                "--runtime onnx needs --model-file PATH.onnx ('halcyon model generate' makes one)"
            )
        onnx = OnnxOptions(model_file=model_file, threads=args.threads)
    elif kind is RuntimeKind.OIP:
        if not args.backend or not args.backend_model:
            raise RuntimeFlagError(
                "--runtime oip needs --backend HOST:PORT and --backend-model NAME"
            )
        oip = OipOptions(
            backend=args.backend,
            backend_model=args.backend_model,
            backend_version=args.backend_model_version,
            input_name=args.input_tensor,
            max_tokens_name=args.max_tokens_tensor,
            output_name=args.output_tensor,
            start_timeout_s=args.backend_start_timeout,
            call_timeout_s=args.backend_timeout,
        )
    return kind, onnx, oip


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The :class:`WorkerConfig` the parsed flags describe (raises CredentialError,
    RuntimeFlagError)."""
    kind, onnx, oip = _runtime_options(args)
    credentials = load_credentials(
        args, fleet_required=True, operator_required=False, listen=args.listen
    )
    serving = serving_options_from_args(args)
    controller_tls = outgoing_tls_from_args(args)
    return WorkerConfig(
        fleet_token=credentials.fleet or "",
        operator_token=credentials.operator,
        replica_id=args.replica_id,
        model=args.model,
        version=args.version,
        hardware=args.hardware,
        slots=args.slots,
        speed=args.speed,
        intercept_ms=args.intercept_ms,
        ms_per_token=args.ms_per_token,
        jitter=args.jitter,
        seed=args.seed,
        controller=args.controller,
        controller_tls=controller_tls,
        advertise=args.advertise,
        fail_rate=args.fail_rate,
        fail_fast_ms=args.fail_fast_ms,
        slowdown=args.slowdown,
        hang_rate=args.hang_rate,
        warm_up=args.warm_up,
        runtime=kind,
        onnx=onnx,
        oip=oip,
        reconnect=Backoff(initial_s=min(0.2, args.reconnect_max_s), max_s=args.reconnect_max_s),
        serving=serving,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, drain, exit 0."""
    die_with_parent()  # a launcher's child: gone with the launcher (SIGKILL too)
    configure_logging("worker", args.log_level)
    configure_tracing("worker")
    try:
        config = config_from_args(args)
    except (CredentialError, RuntimeFlagError) as exc:
        _log.error(str(exc))
        return 2

    def after_start() -> None:
        tune_for_serving()
        tune_threads(args.helper_threads)

    async def main() -> None:
        # Built inside the loop: grpc.aio binds a server to the loop current at construction.
        await WorkerApp(config).run_until_signal(after_start=after_start)

    try:
        asyncio.run(main())
    except ServingFailed:
        return 1  # logged when the completion-queue path failed
    except RuntimeStartError as exc:
        _log.error("the model runtime cannot serve", extra={"error": str(exc)})
        return 2
    except OSError as exc:
        _log.error("worker failed to start", extra={"error": _start_error(exc)})
        return 1
    return 0


def _start_error(exc: OSError) -> str:
    """What went wrong at start-up and what to do about it, in one line."""
    if exc.filename is not None:  # a TLS file that cannot be read
        return (
            f"cannot read {exc.filename}: {exc.strerror or exc}; check --tls-cert, --tls-key "
            "and --tls-ca"
        )
    return f"{exc}; check --listen and --metrics-listen (port 0 picks a free port)"
