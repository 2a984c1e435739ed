"""``halcyon worker``: run one model replica on a simulated device.

What it decides: the command-line surface of a worker (flags, defaults, help) and the
process lifecycle around :class:`~worker.app.WorkerApp`: JSON logs, tracing, serve until
SIGTERM/SIGINT, then readiness off, drain in-flight batches within ``--shutdown-grace``,
deregister, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from common.argtypes import hostport, non_negative, positive, probability
from common.auth import (
    DEV_FLEET_TOKEN,
    DEV_OPERATOR_TOKEN,
    FLEET_TOKEN_ENV,
    OPERATOR_TOKEN_ENV,
    token_from_env_or_default,
)
from common.backoff import Backoff
from common.gc_tuning import tune_for_serving
from common.logs import configure_logging
from common.serving import (
    ServingFailed,
    TlsOptions,
    add_serving_arguments,
    serving_options_from_args,
)
from common.thread_scheduling import add_helper_threads_argument, tune_threads
from common.tracing import configure_tracing
from worker.app import WorkerApp, WorkerConfig

__all__ = ["configure", "run"]

_log = logging.getLogger("halcyon.worker")

_EPILOG = """\
examples:
  halcyon worker --controller 127.0.0.1:50050
  halcyon worker --listen 127.0.0.1:50061 --metrics-listen 127.0.0.1:9461 \\
      --replica-id straggler --speed 0.6 --controller 127.0.0.1:50050
  halcyon worker --version v2 --fail-rate 0.2 --controller 127.0.0.1:50050   # a bad canary

The device time of a batch is (intercept-ms + ms-per-token * tokens) / speed * (1 +/- jitter),
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
        type=hostport,
        metavar="HOST:PORT",
        help="controller to register with; without it the worker runs standalone",
    )
    fleet.add_argument(
        "--advertise",
        type=hostport,
        metavar="HOST:PORT",
        help="address gateways should dial (default: the bound --listen address)",
    )
    fleet.add_argument(
        "--fleet-token",
        metavar="TOKEN",
        help=f"fleet credential (default ${FLEET_TOKEN_ENV}, else the insecure dev token)",
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
    add_serving_arguments(
        parser, default_listen="127.0.0.1:50060", default_metrics_listen="127.0.0.1:9460"
    )
    add_helper_threads_argument(parser, default="normal")


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The :class:`WorkerConfig` the parsed flags describe (warns about dev credentials)."""
    fleet_token, fleet_dev = token_from_env_or_default(
        args.fleet_token, FLEET_TOKEN_ENV, DEV_FLEET_TOKEN
    )
    operator_token, _ = token_from_env_or_default(None, OPERATOR_TOKEN_ENV, DEV_OPERATOR_TOKEN)
    if fleet_dev:
        _log.warning(
            "using the built-in dev fleet credential; set --fleet-token or "
            f"${FLEET_TOKEN_ENV} outside development"
        )
    serving = serving_options_from_args(args)
    controller_tls = (
        TlsOptions(cert=args.tls_cert, key=args.tls_key, client_ca=args.tls_ca)
        if serving.tls is not None
        else None
    )
    return WorkerConfig(
        fleet_token=fleet_token,
        operator_token=operator_token,
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
        reconnect=Backoff(initial_s=min(0.2, args.reconnect_max_s), max_s=args.reconnect_max_s),
        serving=serving,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, drain, exit 0."""
    configure_logging("worker", args.log_level)
    configure_tracing("worker")
    config = config_from_args(args)

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
    except OSError as exc:
        _log.error("worker failed to start", extra={"error": str(exc)})
        return 1
    return 0
