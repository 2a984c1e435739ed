"""The real grpcurl binary against a ServiceHost: reflection and health need no proto files."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

GRPCURL = shutil.which("grpcurl", path=str(Path(sys.executable).parent)) or shutil.which("grpcurl")

pytestmark = pytest.mark.skipif(GRPCURL is None, reason="grpcurl is not installed")


async def grpcurl(*args: str) -> tuple[int, str, str]:
    assert GRPCURL is not None
    proc = await asyncio.create_subprocess_exec(
        GRPCURL,
        "-plaintext",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_list_describe_and_health_check(make_host: Any, echo: SimpleNamespace) -> None:
    host = await make_host(auth=echo.policy())
    addr = host.grpc_address

    rc, out, err = await grpcurl(addr, "list")
    assert rc == 0, err
    assert set(out.split()) >= {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }

    rc, out, err = await grpcurl(addr, "describe", "grpc.health.v1.Health")
    assert rc == 0, err
    assert "rpc Check" in out and "rpc Watch" in out

    rc, out, err = await grpcurl(
        "-d", '{"service":"readiness"}', addr, "grpc.health.v1.Health/Check"
    )
    assert rc == 0, err
    assert json.loads(out) == {"status": "NOT_SERVING"}
    host.set_ready(True)
    rc, out, err = await grpcurl(
        "-d", '{"service":"readiness"}', addr, "grpc.health.v1.Health/Check"
    )
    assert rc == 0, err
    assert json.loads(out) == {"status": "SERVING"}
