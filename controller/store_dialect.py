"""The few ways SQLite and PostgreSQL differ for the controller's store, in one place.

What it decides: every query and migration is written once (:mod:`controller.store_sql`), with
``?`` placeholders and ``{token}`` column types; a :class:`Dialect` turns that text into what
its database runs — placeholders (``?`` or ``%s``), the auto-numbered key (``INTEGER PRIMARY KEY
AUTOINCREMENT`` or ``BIGINT GENERATED ALWAYS AS IDENTITY``; PostgreSQL's ``REAL`` is 4 bytes, so
floats there are ``DOUBLE PRECISION``), how a write transaction starts, how a migration keeps a
second controller out, and how the tables are listed. Both databases accept the rest as is
(``ON CONFLICT … DO UPDATE``, ``RETURNING``, partial unique indexes), so the store has no second
copy of any query.

:class:`StoreConnection` is what the store needs from a driver; :mod:`controller.store_sqlite` and
:mod:`controller.store_postgres` implement it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

__all__ = ["POSTGRESQL", "SQLITE", "Dialect", "Result", "StoreConnection"]

_TOKEN = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Dialect:
    """How one database spells the store's SQL."""

    name: str
    paramstyle: str  # what replaces each ``?``
    types: Mapping[str, str]  # ``{token}`` in a migration -> the column type
    begin_write: str  # starts a transaction that will write
    # Runs first in each migration's transaction: holds off another controller migrating the
    # same database at once ("" where begin_write already does).
    migration_lock: str
    list_tables: str

    def ddl(self, statement: str) -> str:
        """A migration statement with its ``{token}`` types filled in (other braces, such as
        a ``'{}'`` default, are left alone)."""
        return _TOKEN.sub(lambda m: self.types.get(m.group(1), m.group(0)), statement)

    def sql(self, query: str) -> str:
        """``query`` with this database's placeholders."""
        return _translate(query, self.paramstyle)


@lru_cache(maxsize=512)
def _translate(query: str, paramstyle: str) -> str:
    if paramstyle == "?":
        return query
    # The store's SQL has no string literal holding a "?" or a "%".
    return query.replace("%", "%%").replace("?", paramstyle)


SQLITE = Dialect(
    name="sqlite",
    paramstyle="?",
    types={"id_pk": "INTEGER PRIMARY KEY AUTOINCREMENT", "id_ref": "INTEGER", "real": "REAL"},
    # IMMEDIATE takes the write lock up front: two writers never both read then deadlock.
    begin_write="BEGIN IMMEDIATE",
    migration_lock="",
    list_tables="SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'sqlite_sequence'",
)

POSTGRESQL = Dialect(
    name="postgresql",
    paramstyle="%s",
    types={
        "id_pk": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
        "id_ref": "BIGINT",
        "real": "DOUBLE PRECISION",
    },
    begin_write="BEGIN",
    # A transaction-scoped advisory lock (released at COMMIT/ROLLBACK): CREATE TABLE IF NOT
    # EXISTS is not safe against a concurrent one. The key is b"halcyon" as a big-endian int.
    migration_lock="SELECT pg_advisory_xact_lock(29380515731173230)",
    list_tables=(
        "SELECT table_name FROM information_schema.tables "
        "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
    ),
)


class Result(NamedTuple):
    """What a statement returned: its rows (if any) and how many rows it changed."""

    rows: list[tuple[Any, ...]]
    rowcount: int


class StoreConnection(Protocol):
    """One database connection as the store uses it (the store serialises the calls).

    Errors: a violated constraint raises :attr:`integrity_error`, any other refusal by the
    database a :attr:`database_error`; a database that cannot be reached raises
    :class:`controller.store_records.StoreUnavailable`.
    """

    @property
    def dialect(self) -> Dialect: ...

    @property
    def integrity_error(self) -> type[Exception]: ...

    @property
    def database_error(self) -> type[Exception]: ...

    def execute(self, query: str, params: Sequence[Any] = ()) -> Result: ...

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def transaction(self) -> AbstractContextManager[None]:
        """BEGIN (``dialect.begin_write``) … COMMIT, or ROLLBACK when the block raises."""
        ...

    def close(self) -> None: ...
