"""The controller store's PostgreSQL connection (psycopg 3): one session, reopened when lost.

What it decides: how a ``postgresql://`` location becomes a session and what a lost one looks
like to the store. The URL goes to libpq as it is, so ``PGPASSWORD``, ``PGPASSFILE``,
``PGSSLMODE`` and every other libpq setting apply; a connect timeout (5 s unless the URL sets
``connect_timeout``) keeps a vanished server from hanging the controller at open.

A connection that breaks — the server stopped or restarted, the network cut — raises
:class:`controller.store_records.StoreUnavailable` (a :class:`StoreError`) from the call that
found it; that call changed nothing (its transaction died with the session — unless the break
came while COMMIT itself was under way, when it may have landed), and the next call connects
again. Nothing is retried silently: a write is not known to be idempotent, and the
caller (the rollout manager, the event writer) already decides what to do with a failed one.

:func:`open_session` is the one way to get a session, so a second connection-level concern (a
leader lease held with ``pg_try_advisory_lock`` on a session of its own) can open one beside the
store's with the same settings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from controller.store_dialect import POSTGRESQL, Result
from controller.store_records import StoreError, StoreUnavailable
from controller.store_url import StoreLocation

__all__ = ["PostgresConnection", "open_session", "session_params"]

CONNECT_TIMEOUT_S = 5
APPLICATION_NAME = "halcyon-controller"
Session = psycopg.Connection[tuple[Any, ...]]


def session_params(location: StoreLocation) -> dict[str, Any]:
    """libpq parameters for ``location``; raises StoreError for a URL libpq cannot read."""
    try:
        params: dict[str, Any] = conninfo_to_dict(location.target)
    except psycopg.ProgrammingError as exc:
        raise StoreError(f"store URL {location.display}: {_first_line(exc)}") from None
    params.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    params.setdefault("application_name", APPLICATION_NAME)
    return params


def open_session(location: StoreLocation, params: dict[str, Any]) -> Session:
    """A new autocommit session (transactions are explicit); raises StoreUnavailable."""
    try:
        return psycopg.connect(autocommit=True, **params)
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"cannot connect to the store {location.display}: {_first_line(exc)}"
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _storable(params: Sequence[Any]) -> tuple[Any, ...]:
    """``params`` with every NUL in a string replaced by U+FFFD: PostgreSQL's text cannot hold
    one, and a replica id or an operator's reason with one in it must not fail the write (and
    with it a whole batch of fleet events). SQLite stores it as it is."""
    return tuple(p.replace("\x00", "\ufffd") if isinstance(p, str) else p for p in params)


class PostgresConnection:
    """A :class:`controller.store_dialect.StoreConnection` on a PostgreSQL database."""

    dialect = POSTGRESQL
    integrity_error = psycopg.IntegrityError
    database_error = psycopg.DatabaseError

    def __init__(self, location: StoreLocation) -> None:
        self._location = location
        self._params = session_params(location)
        self._session: Session | None = open_session(location, self._params)
        self._in_transaction = False

    def _current(self) -> Session:
        if self._session is None or self._session.closed:
            if self._in_transaction:  # never carry on a transaction on a new session
                raise StoreUnavailable(f"lost the connection to the store {self._location}")
            self._session = open_session(self._location, self._params)
        return self._session

    @contextmanager
    def _lost_is_unavailable(self) -> Iterator[None]:
        """A broken session becomes StoreUnavailable (and is dropped); other errors pass."""
        try:
            yield
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            session = self._session
            if session is not None and not (session.broken or session.closed):
                raise  # the server refused this statement; the session is fine
            self._drop()
            raise StoreUnavailable(
                f"lost the connection to the store {self._location}: {_first_line(exc)}"
            ) from exc

    def _drop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def execute(self, query: str, params: Sequence[Any] = ()) -> Result:
        with self._lost_is_unavailable():
            cur = self._current().execute(POSTGRESQL.sql(query), _storable(params))
            rows = cur.fetchall() if cur.description is not None else []
            return Result(rows, cur.rowcount)

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._lost_is_unavailable():
            self._current().cursor().executemany(POSTGRESQL.sql(query), map(_storable, rows))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.execute(POSTGRESQL.begin_write)
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self._in_transaction = False
            if self._session is not None:
                with suppress(StoreUnavailable):  # the block's own error is the one to raise
                    self.execute("ROLLBACK")
            raise
        self._in_transaction = False
        self.execute("COMMIT")

    def close(self) -> None:
        self._drop()
