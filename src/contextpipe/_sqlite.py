"""What the SQLite-backed stores share: switching a file to WAL mode while other processes open it too."""

from __future__ import annotations

import sqlite3
import time


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
