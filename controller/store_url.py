"""Where the controller's store lives: a ``--store`` URL (or ``--db`` path) read into a location.

What it decides: which backend a store location names and how it is shown. ``sqlite:///abs/file.db``
(``sqlite://rel/file.db`` for a relative path) or a plain path is an SQLite file, the zero-setup
default; ``postgresql://user@host:port/dbname`` (or ``postgres://``) is a PostgreSQL database,
handed to libpq as it is, so every libpq URI parameter works and a password may come from the
standard ``PGPASSWORD`` / ``PGPASSFILE`` instead of the URL. Anything else with a ``scheme://``
is refused rather than taken for a file name. :attr:`StoreLocation.display` is the location
with any password masked: the only form that may reach a log line or an error message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["Backend", "StoreLocation", "mask_password", "parse_store_location"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES_SCHEMES = ("postgresql", "postgres")
_MASK = "***"


class Backend(StrEnum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store location: the backend, what its driver opens, and the loggable form."""

    backend: Backend
    target: str  # the SQLite file's path, or the libpq connection URI
    display: str  # ``target`` with any password masked

    def __str__(self) -> str:
        return self.display


def mask_password(url: str) -> str:
    """``url`` with the password of its user part and any ``password=`` parameter masked."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:{_MASK}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            masked = [(k, _MASK if k == "password" else v) for k, v in pairs]
            query = urlencode(masked, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def parse_store_location(location: str | Path) -> StoreLocation:
    """Read a ``--store`` URL or a plain path; raises ValueError (with the URL masked)."""
    if isinstance(location, Path):
        return StoreLocation(Backend.SQLITE, str(location), str(location))
    text = location.strip()
    match = _SCHEME.match(text)
    if match is None:
        if not text:
            raise ValueError("the store location is empty")
        return StoreLocation(Backend.SQLITE, text, text)
    scheme = match.group(1).lower()
    if scheme == "sqlite":
        path = text[match.end() :]
        if not path:
            raise ValueError(f"store URL {text!r} names no file: use sqlite:///path/file.db")
        return StoreLocation(Backend.SQLITE, path, path)
    display = mask_password(text)
    if scheme in _POSTGRES_SCHEMES:
        return StoreLocation(Backend.POSTGRESQL, text, display)
    raise ValueError(
        f"store URL {display!r}: unknown scheme {scheme!r}; use sqlite:///path/file.db, "
        "postgresql://user@host:port/dbname or a plain file path"
    )
