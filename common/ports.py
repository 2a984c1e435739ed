"""Who is listening on a TCP port: the answer a "port already in use" error should give.

What it decides: nothing; it reads Linux's ``/proc/net/tcp`` and ``/proc/net/tcp6`` for
listening sockets on a port, then ``/proc/*/fd`` for the processes holding those sockets, so
an error can say "held by pid 4242 (halcyon gateway …)" instead of leaving the user to guess.
Processes of other users cannot be inspected without privileges; they are reported as such.
Off Linux (no ``/proc``) it finds nothing and callers fall back to the bare error.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PortHolder", "describe_port_holders", "listening_inodes", "port_holders"]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_CMDLINE_CHARS = 120


@dataclass(frozen=True)
class PortHolder:
    """A process holding a listening socket (``pid`` None: not visible to this user)."""

    pid: int | None
    command: str


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[int]:
    """Socket inodes listening on ``port`` (any address, IPv4 or IPv6)."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            _, _, port_hex = fields[1].rpartition(":")
            if int(port_hex, 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def _command(pid_dir: Path) -> str:
    try:
        raw = (pid_dir / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return text if len(text) <= _CMDLINE_CHARS else text[: _CMDLINE_CHARS - 1] + "…"


def port_holders(port: int, proc: Path = Path("/proc")) -> list[PortHolder]:
    """The processes listening on ``port``; one entry with ``pid=None`` for sockets whose
    owner this user cannot see."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return []
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found: list[PortHolder] = []
    seen: set[str] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(pid_dir / "fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target in wanted:
                        seen.add(target)
                        found.append(PortHolder(int(pid_dir.name), _command(pid_dir)))
                        break
    if len(seen) < len(wanted) and not found:
        found.append(PortHolder(None, "a process this user cannot inspect"))
    return found


def describe_port_holders(port: int) -> str:
    """``"held by pid 42 (python -m halcyon gateway …)"``, or ``""`` when nothing is known."""
    holders = port_holders(port)
    if not holders:
        return ""
    parts = [f"pid {h.pid} ({h.command})" if h.pid is not None else h.command for h in holders]
    return "held by " + ", ".join(parts)
