"""A throwaway PostgreSQL server for tests: its own cluster in a temp dir, on a free port.

What it decides: how a test gets a real server without touching the machine's own clusters.
:func:`postgres_cluster` runs ``initdb`` (trust authentication, superuser ``postgres``) into a
fresh temp dir, starts it with ``pg_ctl`` on 127.0.0.1 and a free port with its socket in that
dir, and at exit stops it (``-m immediate``: nothing there is worth a checkpoint) and removes
the dir. PostgreSQL refuses to run as root, so as root every server command runs as the
``postgres`` system user Debian's package creates (``runuser``), and the dir is chowned to it;
as anyone else they run directly. Starting a cluster costs seconds, so a test module shares
one and takes a fresh database per test (:meth:`PostgresCluster.create_database`).

The programs come from the caller (``require_tool("initdb")``, ``require_tool("pg_ctl")``), so
a machine without the package skips with the line :mod:`tests.support.tools` prints.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

__all__ = ["PostgresCluster", "postgres_cluster"]

SERVER_USER = "postgres"
START_TIMEOUT_S = 30


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` user when this process is root."""
    return ["runuser", "-u", SERVER_USER, "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PostgresCluster:
    """A running test cluster: its data dir, port, and the databases tests made on it."""

    pg_ctl: str
    root: Path
    port: int = field(default_factory=_free_port)
    _numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres", *, password: str | None = None) -> str:
        user = SERVER_USER if password is None else f"{SERVER_USER}:{password}"
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A new empty database ``t_<n>``; returns its URL."""
        name = f"t_{next(self._numbers)}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def password_user(self, role: str, password: str) -> str:
        """A login role that must give ``password`` over TCP (scram, ahead of the trust rule)
        and a new database it owns; returns that database's URL, without the password."""
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            hba = Path(admin.execute("SHOW hba_file").fetchall()[0][0])
            hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
            admin.execute("SELECT pg_reload_conf()")
            name = f"t_{next(self._numbers)}"
            admin.execute(f"CREATE DATABASE {name} OWNER {role}")
        return f"postgresql://{role}@127.0.0.1:{self.port}/{name}"

    def _pg_ctl(self, *args: str) -> None:
        argv = _as_server_user([self.pg_ctl, "-D", str(self.data_dir), *args])
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"pg_ctl {args[-1]} failed: {proc.stdout}{proc.stderr}\n{tail}")

    def start(self) -> None:
        """Start (or restart after :meth:`stop`) the server; returns once it accepts."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg_ctl(
            "-o", options, "-l", str(self.root / "server.log"), "-t", str(START_TIMEOUT_S),
            "-w", "start",
        )  # fmt: skip

    def stop(self) -> None:
        """Stop the server at once, as a crash would (every connection is cut)."""
        self._pg_ctl("-m", "immediate", "-w", "stop")


@contextmanager
def postgres_cluster(initdb: str, pg_ctl: str) -> Iterator[PostgresCluster]:
    """A started cluster in a new temp dir, stopped and removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="halcyon-pg-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, SERVER_USER, SERVER_USER)
        cluster = PostgresCluster(pg_ctl=pg_ctl, root=root)
        subprocess.run(
            _as_server_user([initdb, "-D", str(cluster.data_dir), "--auth=trust",
                             "-U", SERVER_USER, "--no-sync", "--no-instructions"]),
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        cluster.start()
        try:
            yield cluster
        finally:
            with suppress(RuntimeError):  # a test left it stopped
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
