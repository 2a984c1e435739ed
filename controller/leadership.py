"""Which of several controllers on one PostgreSQL store leads: a session-level advisory lock.

What it decides: leader election (issue #22) with a proven part — PostgreSQL's
``pg_try_advisory_lock`` — and no consensus of our own. The lock is held on a session of its
own (:func:`controller.store_postgres.open_session`, the store's settings), never the store's:
PostgreSQL releases a session lock the moment that session ends, so a killed leader's socket
closing frees it at once, and TCP keepalives plus a TCP user timeout end the session within a
few seconds when the leader's machine vanishes without closing anything — on both ends: libpq's
(so the leader learns it lost the server) and the server's, set for this session (so the server
drops a vanished leader and frees its lock).

A standby retries every :data:`RETRY_S`. The controller that gets the lock writes its
advertised address and the next epoch into ``controller_leader`` (migration 5) and only then
acts; standbys read that row to tell clients where the leader is. While leading, the lock's
session is checked every :data:`CHECK_S`: a lost one means another controller may lead now, so
the owner's ``on_lost`` must stop this process acting at once (``controller.main`` exits
non-zero and its supervisor restarts it as a standby). SQLite stores have no election.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from controller.store_postgres import Session, open_session, session_params
from controller.store_records import StoreUnavailable
from controller.store_url import StoreLocation

__all__ = ["CHECK_S", "LOCK_KEY", "RETRY_S", "Leadership"]

_log = logging.getLogger("halcyon.controller.leadership")

# The advisory lock every Halcyon controller of one database contends for (an arbitrary
# constant, distinct from the store's migration lock).
LOCK_KEY = 29380515731173231
RETRY_S = 0.5  # how often a standby tries the lock
CHECK_S = 0.5  # how often the leader checks that its lock session is alive
# A vanished peer: keepalive probes after 2 s idle, every 1 s, give up after 2 unanswered;
# unacknowledged writes give up after 3 s.
_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": 3000,
}
# The same for the server's end of the session (PostgreSQL settings any user may set).
_SERVER_KEEPALIVES = (
    "-c tcp_keepalives_idle=2 -c tcp_keepalives_interval=1 -c tcp_keepalives_count=2 "
    "-c tcp_user_timeout=3000"
)
_TAKE_OVER = (
    "INSERT INTO controller_leader (id, epoch, address, since) VALUES (1, 1, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET epoch = controller_leader.epoch + 1, "
    "address = EXCLUDED.address, since = EXCLUDED.since RETURNING epoch"
)


class Leadership:
    """One controller's side of the election; the lock methods block (call them off the loop
    or through :meth:`acquire`/:meth:`watch`)."""

    def __init__(
        self,
        location: StoreLocation,
        advertise: str,
        *,
        wall: Callable[[], float] = time.time,
        retry_s: float = RETRY_S,
        check_s: float = CHECK_S,
    ) -> None:
        self._location = location
        params = session_params(location)
        options = f"{params.get('options', '')} {_SERVER_KEEPALIVES}".strip()
        self._params: dict[str, Any] = {**params, **_KEEPALIVES, "options": options}
        self.advertise = advertise
        self._wall = wall
        self._retry_s = retry_s
        self._check_s = check_s
        self._session: Session | None = None  # the lock's session (also reads the row)
        self.epoch: int | None = None  # set once this controller leads
        # The leader's advertised address as last read (by a standby's attempts), so that
        # refusing a call never waits for the database.
        self.leader_address: str | None = None

    @property
    def leading(self) -> bool:
        return self.epoch is not None

    def _connected(self) -> Session:
        if self._session is None or self._session.closed or self._session.broken:
            self._session = open_session(self._location, self._params)
        return self._session

    def try_acquire(self) -> bool:
        """One attempt: True once this controller holds the lock and has recorded itself as
        leader (``epoch`` set). A store that cannot be reached is a failed attempt."""
        if self.leading:
            return True
        try:
            session = self._connected()
            ((held,),) = session.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,))
            if not held:
                self.leader_address = self._read_leader(session)
                return False
            row = session.execute(_TAKE_OVER, (self.advertise, self._wall())).fetchone()
        except (StoreUnavailable, psycopg.Error) as exc:
            _log.warning("cannot reach the store for the leader lock", extra={"error": str(exc)})
            self._drop()
            return False
        assert row is not None  # RETURNING always yields the row written
        self.epoch = int(row[0])
        self.leader_address = self.advertise
        return True

    async def acquire(self) -> int:
        """Wait until this controller leads; returns its epoch."""
        while True:  # polling is the protocol: PostgreSQL does not notify a lock's release
            if await asyncio.to_thread(self.try_acquire):
                break
            await asyncio.sleep(self._retry_s)
        assert self.epoch is not None
        return self.epoch

    @staticmethod
    def _read_leader(session: Session) -> str | None:
        rows = session.execute("SELECT address FROM controller_leader").fetchall()
        return str(rows[0][0]) if rows else None

    def alive(self) -> bool:
        """While leading: whether the lock's session still answers (it holds the lock as long
        as it lives)."""
        session = self._session
        if session is None or session.closed or session.broken:
            return False
        try:
            session.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    async def watch(self, on_lost: Callable[[], None]) -> None:
        """While leading: call ``on_lost`` (and return) the moment the lock session is gone."""
        while True:  # a dead session is found only by using it
            if not await asyncio.to_thread(self.alive):
                break
            await asyncio.sleep(self._check_s)
        on_lost()

    def _drop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def close(self) -> None:
        """Release the lock (by ending its session)."""
        self._drop()
        self.epoch = None
