"""A SQLite session store opened read-only, for ``contextpipe ui --db FILE``.

The file is opened with SQLite's ``mode=ro`` (or ``immutable=1`` when even the write-ahead log's
index cannot be created, as on a read-only mount), nothing is created, and expired sessions read as
absent instead of being deleted. Any write is refused by SQLite itself.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from ..errors import StoreError
from ..stores._common import SCHEMA_VERSION
from ..stores.sqlite import SQLiteStore

__all__ = ["ReadOnlySQLiteStore"]

T = TypeVar("T")


def _open(path: str) -> sqlite3.Connection:
    target = Path(path)
    if not target.is_file():
        raise StoreError(f"no session database at {path}", backend="sqlite")
    uri = "file:" + quote(str(target.resolve()))
    last: sqlite3.Error | None = None
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(f"{uri}?{flags}", uri=True, isolation_level=None, check_same_thread=False)
            row = conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            last = exc
            continue
        if row is None:
            conn.close()
            raise StoreError(f"{path} is not a contextpipe session database", backend="sqlite")
        if int(row[0]) > SCHEMA_VERSION:
            conn.close()
            raise StoreError(f"{path} was written by a newer contextpipe (schema {row[0]}, this release reads "
                             f"{SCHEMA_VERSION}); upgrade contextpipe", backend="sqlite")
        return conn
    message = "is not a contextpipe session database" if "no such table" in str(last) or \
        "not a database" in str(last) else f"cannot be read: {last}"
    raise StoreError(f"{path} {message}", backend="sqlite")


class ReadOnlySQLiteStore(SQLiteStore):
    """`SQLiteStore` for reading only (see the module docstring)."""

    @staticmethod
    def check(path: str) -> None:
        """Raise `StoreError` saying what is wrong unless `path` is a readable session database."""
        _open(path).close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = _open(self.path)
        return self._conn

    def _row(self, conn: sqlite3.Connection, tenant: str, session_id: str, now: float) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = conn.execute(
            "SELECT version, last_seq, lease_owner, lease_token, lease_expires, expires_at, state, created_at, ttl "
            "FROM cp_sessions WHERE tenant = ? AND session_id = ?", (tenant, session_id)).fetchone()
        if row is not None and row[5] is not None and row[5] <= now:
            return None
        return row

    @staticmethod
    def _tx(conn: sqlite3.Connection, body: Callable[[], T]) -> T:
        return body()
