"""What a running ``halcyon stack`` prints: its processes, and commands that work when pasted.

What it decides: the how-to-call text. Every command is ready to paste into a fresh shell
(absolute paths to ``halcyon`` and ``grpcurl`` next to the running interpreter), and the
operator token is never printed, only the file (mode 0600) that holds it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

from halcyon.tools.stack_layout import MODEL, OPERATOR_TOKEN_FILE
from halcyon.tools.stack_supervisor import Stack


def describe_stack(stack: Stack) -> str:
    by_name = {c.name: c.ready or {} for c in stack.children}
    gateway = by_name["gateway"].get("grpc", stack.args.gateway_listen)
    gateway_metrics = by_name["gateway"].get("metrics", stack.args.gateway_metrics_listen)
    # Several gateways (--gateways N): loadtest spreads its clients over all of them.
    others = [str((g.ready or {}).get("grpc", "?")) for g in stack.gateways[1:]]
    load_target = ",".join([gateway, *others])
    controller = by_name["controller"].get("grpc", stack.args.controller_listen)
    console = by_name["controller"].get("console_url") or "(not started: see controller.log)"
    grpcurl, halcyon = _tool("grpcurl"), _tool("halcyon")
    token_file = shlex.quote(str(stack.state_dir / OPERATOR_TOKEN_FILE))
    rows = [f"  {'process':<12} {'gRPC':<22} {'metrics':<22} pid"]
    for c in stack.children:
        r = c.ready or {}
        pid = c.proc.pid if c.proc else "-"
        grpc_at, metrics_at = r.get("grpc", "?"), r.get("metrics", "-")
        rows.append(f"  {c.name:<12} {grpc_at:<22} {metrics_at:<22} {pid}")
    body = json.dumps({"model": MODEL, "input": "hello", "max_output_tokens": 64, "timeout": "2s"})
    victim = next((c for c in stack.workers if c.name == "replica-b"), None)
    victim_pid = victim.proc.pid if victim and victim.proc else "PID"
    return "\n".join(
        [
            "Halcyon stack is up (Ctrl-C stops everything; a process that dies is restarted).",
            "",
            *rows,
            "",
            f"Operator console: {console}",
            f"  (read-only as it is; to promote, abort or drain, sign in with the operator "
            f"token from {token_file})",
            "",
            f"State and logs: {stack.state_dir}"
            + ("" if stack.args.state_dir else " (removed when the stack stops)"),
            "",
            "Send one request:",
            f"  {grpcurl} -plaintext -H 'x-api-key: demo-key-premium' \\",
            f"    -d '{body}' \\",
            f"    {gateway} halcyon.v1.InferService/Infer",
            "",
            "Drive real load:",
            f"  {halcyon} loadtest --target {load_target} --gateway-metrics {gateway_metrics} "
            "--clients 32 --seconds 20",
            "",
            f"Inspect the control plane (the operator token is in {token_file}, mode 0600):",
            f'  {grpcurl} -plaintext -H "authorization: Bearer $(cat {token_file})" \\',
            f"    {controller} halcyon.v1.ControlService/GetState",
            "",
            *(
                [
                    "Ship v2 on evidence (with load running; `rollout --help` for more):",
                    f"  {halcyon} rollout start {MODEL} v2 --steps 20,50,100 --window 5 "
                    f"--watch --controller {controller} --operator-token-file {token_file}",
                    "",
                ]
                if stack.args.canary
                else []
            ),
            "Break something (the stack restarts it; the gateway routes around it):",
            f"  kill -9 {victim_pid}",
            "",
            f'Health: {grpcurl} -plaintext -d \'{{"service":"readiness"}}\' '
            f"{gateway} grpc.health.v1.Health/Check",
        ]
    )


def _tool(name: str) -> str:
    """An absolute, shell-quoted path to ``name`` next to this interpreter (the venv's bin)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return shlex.quote(str(beside))
    if name == "halcyon":
        return f"{shlex.quote(sys.executable)} -m halcyon"
    return shlex.quote(shutil.which(name) or name)
