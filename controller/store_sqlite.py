"""The controller store's SQLite connection: one file, stdlib ``sqlite3``, WAL journal.

What it decides: how the file is opened — autocommit mode with explicit transactions, usable
from any thread (the store serialises calls), a 5 s wait for another writer's lock, WAL so
readers never block the writer, ``synchronous=NORMAL`` (durable across a process crash, the
last transactions may go with a power loss), foreign keys enforced. Errors stay ``sqlite3``'s
own: a file is always there to be reached, so there is no "unavailable" to report.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from controller.store_dialect import SQLITE, Result
from controller.store_records import StoreError

__all__ = ["SqliteConnection"]


class SqliteConnection:
    """A :class:`controller.store_dialect.StoreConnection` on one SQLite file."""

    dialect = SQLITE
    integrity_error = sqlite3.IntegrityError
    database_error = sqlite3.DatabaseError

    def __init__(self, path: str) -> None:
        try:
            self._db = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=5.0
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from exc
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"cannot use store {path}: {exc}") from exc

    def execute(self, query: str, params: Sequence[Any] = ()) -> Result:
        cur = self._db.execute(query, params)
        return Result([tuple(r) for r in cur], cur.rowcount)

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        self._db.executemany(query, rows)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._db.execute(SQLITE.begin_write)
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()
