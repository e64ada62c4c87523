"""What the SQLite-backed stores share: refusing another application's file, WAL mode, noticing a file gone."""

from __future__ import annotations

import os
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


class OpenedFile:
    """The database file a connection opened, told apart from whatever is at its path later.

    SQLite keeps writing into the file it opened, even after that file was deleted, replaced (a
    backup restored over it, another file renamed onto its path) or moved: every such write would be
    acknowledged, and lost to whoever opens the path next. The file's identity (device and inode) is
    taken when it is opened; `check`, before and after each commit, compares it with the file at the
    path now (one ``stat`` each: a one-message append, the cheapest write, takes 1.016x as long with
    both, ``bench/results/sqlite_file.json``). Once they differ, every later `check` fails too: the
    store is no longer usable.
    """

    __slots__ = ("_absolute", "_identity", "_lost", "path")

    def __init__(self, path: str, file: str) -> None:
        self.path = path
        """The path the file was opened by (as the store was given it: what errors name)."""
        self._absolute = file  # the absolute file name SQLite opened (a relative path resolved once, at open)
        self._identity = _identity(self._absolute)
        self._lost: str | None = None

    @property
    def lost(self) -> bool:
        """Whether a `check` found that the file at the path is no longer the one opened."""
        return self._lost is not None

    def check(self) -> None:
        """Raise `StoreError` unless the file at the path is still the one opened (``stat`` it)."""
        if self._lost is None:
            try:
                now = _identity(self._absolute)
            except FileNotFoundError:
                self._lost = "was deleted or moved away"
            except OSError as exc:
                self._lost = f"can no longer be found ({exc.strerror})"
            else:
                if now == self._identity:
                    return
                self._lost = "was replaced by another file"
        self.refuse()

    def refuse(self) -> None:
        """Raise the `StoreError` of a lost file (once `check` found it lost)."""
        if self._lost is None:
            return
        raise StoreError(
            f"{self.path}: the database file this store opened {self._lost} while the store was open, so what it "
            "writes can no longer be read from that path; this write and every later one are refused. Close the "
            "store; put the file back (or restore it from a backup) and open a new store on the path, or open a new "
            "store to start an empty database there", backend="sqlite", server=self.path)


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def opened_file(conn: sqlite3.Connection, path: str) -> OpenedFile | None:
    """Return the `OpenedFile` of the database `conn` just opened by `path` (None when it has no file).

    The file is the one SQLite names (``PRAGMA database_list``): an absolute path, also for a ``file:``
    URI, and none for an in-memory or temporary database (``:memory:``, ``file::memory:?cache=shared``).
    """
    file = conn.execute("PRAGMA database_list").fetchone()[2]
    return OpenedFile(path, file) if file else None
