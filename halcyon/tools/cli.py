"""The ``halcyon`` command: one console entry point with a subcommand per job.

Each subcommand lives in its own module exposing ``configure(parser)`` and ``run(args) -> int``;
modules are imported only when their subcommand runs, so ``halcyon bench`` never pays for gRPC
server imports and ``halcyon --help`` is instant. How every subcommand parses its flags and
reports a failure (defaults in ``--help``, one-line errors, exit codes) is the command frame,
:mod:`bench.command_frame`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from bench.command_frame import CommandParser, run_subcommand
from halcyon import __version__

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "controller": ("controller.main", "run the controller (fleet registry, rollouts, store)"),
    "gateway": ("gateway.main", "run a gateway (InferService)"),
    "worker": (
        "worker.main",
        "run a worker replica: simulated device, ONNX Runtime or an OIP backend (WorkerService)",
    ),
    "stack": (
        "halcyon.tools.stack",
        "run controller, gateway and a heterogeneous fleet on loopback",
    ),
    "bench": (
        "bench.cli",
        "seeded discrete-event benchmarks (batching, fleet, herd, rollout, quotas)",
    ),
    "loadtest": ("halcyon.tools.loadtest", "drive real load at a running gateway and report"),
    "sweep": (
        "halcyon.tools.sweep",
        "the loadtest sweep: offered rates x batching strategies, each on a fresh stack",
    ),
    "rollout": (
        "halcyon.tools.rollout",
        "ship a new model version: start, status, watch, verify, …",
    ),
    "fleet": ("halcyon.tools.fleet_cmd", "see the fleet; drain a replica and undrain it, by name"),
    "model": ("halcyon.tools.model_cmd", "generate the ONNX model an ONNX Runtime worker serves"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="halcyon",
        description="Halcyon: admission, version, batching and routing for ML inference fleets.",
    )
    parser.add_argument("--version", action="version", version=f"halcyon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (_module, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] not in SUBCOMMANDS:
        # Top-level --help, --version, or an unknown command: argparse explains.
        parser.parse_args(args)
        return 2
    name, rest = args[0], args[1:]
    module_name, help_text = SUBCOMMANDS[name]
    return run_subcommand(name, importlib.import_module(module_name), help_text, rest)


if __name__ == "__main__":
    raise SystemExit(main())
