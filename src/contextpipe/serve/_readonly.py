"""A SQLite session store opened read-only, for ``contextpipe ui --db FILE``.

The file is opened with SQLite's ``mode=ro`` (or ``immutable=1`` when even the write-ahead log's
index cannot be created, as on a read-only mount), nothing is created, and expired sessions read as
absent instead of being deleted. Any write is refused by SQLite itself.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from ..errors import StoreError
from ..session import SessionKey
from ..stores.sqlite import _SESSION, SQLITE_SCHEMA_VERSION, SQLiteStore

__all__ = ["ReadOnlySQLiteStore"]


def _open(path: str) -> sqlite3.Connection:
    target = Path(path)
    if not target.is_file():
        raise StoreError(f"no session database at {path}", backend="sqlite")
    uri = "file:" + quote(str(target.resolve()))
    last: sqlite3.Error | None = None
    for flags in ("mode=ro", "mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(f"{uri}?{flags}", uri=True, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row  # rows are read by name, as the writer reads them
            row = conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            last = exc
            continue
        if row is None:
            conn.close()
            raise StoreError(f"{path} is not a contextpipe session database", backend="sqlite")
        if int(row[0]) > SQLITE_SCHEMA_VERSION:
            conn.close()
            raise StoreError(f"{path} was written by a newer contextpipe (schema {row[0]}, this release reads "
                             f"{SQLITE_SCHEMA_VERSION}); upgrade contextpipe", backend="sqlite")
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

    def _session_row(self, conn: sqlite3.Connection, key: SessionKey, now: float) -> sqlite3.Row | None:
        row: sqlite3.Row | None = conn.execute(_SESSION, (key.tenant, key.id)).fetchone()
        if row is not None and row["expires_at"] is not None and row["expires_at"] <= now:
            return None  # expired: absent, but not deleted (nothing is written)
        return row

    def _get_row(self, conn: sqlite3.Connection, key: SessionKey) -> sqlite3.Row | None:
        return self._session_row(conn, key, self._clock())
