"""What the SQLite-backed stores share: refusing another application's file, and switching a file to WAL mode."""

from __future__ import annotations

import sqlite3
import time
from typing import Final

from .errors import StoreError, shorten


def use_wal(conn: sqlite3.Connection, busy_ms: int) -> None:
    """Put the database of `conn` in WAL mode, retrying for up to `busy_ms` while another connection holds it.

    Several processes opening a new file at once race to switch it from the rollback journal, and
    SQLite can answer the losers "database is locked" without waiting for the busy timeout. The mode
    is kept in the file, so once one connection has switched it the statement returns at once for
    every other.
    """
    deadline = time.monotonic() + busy_ms / 1000
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


CONTEXTPIPE_TABLES: Final = ("cp_meta", "cp_vectors")
"""The tables that show a file holds contextpipe data: the session store's and the vector store's."""


def refuse_other_applications(conn: sqlite3.Connection, path: str) -> None:
    """Raise `StoreError` when the file holds tables of another application and no contextpipe data.

    Opening it would add contextpipe's ``cp_*`` tables to another application's database (and switch
    it to WAL mode): a mistyped ``--db`` or path, more likely than a wish. A new (empty) file and a
    file with contextpipe's tables pass; the stores' ``allow_other_tables=True`` skips the check.
    """
    tables = sorted(row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite^_%' ESCAPE '^'"))
    if not tables or any(name in CONTEXTPIPE_TABLES for name in tables):
        return
    names = ", ".join(shorten(name, 40) for name in tables[:5])
    if len(tables) > 5:
        names += f" and {len(tables) - 5} more"
    raise StoreError(f"{path} holds another application's tables ({names}) and no contextpipe data; use a new "
                     "file, or pass allow_other_tables=True to add contextpipe's cp_* tables to this one",
                     backend="sqlite", server=path)
