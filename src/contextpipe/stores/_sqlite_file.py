"""The SQLite session file: its tables, its schema version, and opening it for writing or for reading only.

`SQLiteStore` keeps one connection per store, on its worker thread; this module makes it. A file of
another schema version than this release's is refused, by the writer and the reader alike, with one
`StoreError` saying what to do.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final, Literal
from urllib.parse import quote

from .._sqlite import refuse_other_applications, use_wal
from ..errors import StoreError, shorten
from ._artifacts import SQLITE_ARTIFACTS, SQLITE_FRESH
from ._outbox import SQLITE_OUTBOX
from ._queue import SQLITE_QUEUE

SQLITE_SCHEMA_VERSION: Final = 4
"""Version of the SQLite layout written by this release (cp_meta ``schema_version``).

3 stores messages in the compact form (`contextpipe.stores._fastdecode.dumps_compact`); 4 adds each lease's
ttl (``lease_ttl``), which bounds a lease however the clock moved. A file of version 3 is read as it is and
upgraded in place when opened for writing (one added column; an older contextpipe then refuses to open the
file and says to upgrade, but one that already had it open goes on writing leases without their ttl, which
may leave another lease's ttl on them: the guide says to stop those processes first). A file of another
version is refused with a `StoreError` saying what to do; nothing in it is changed. The outbox, queue and
artifact tables (``cp_outbox``, ``cp_queue``, ``cp_artifacts``: `contextpipe.stores._outbox`, `._queue`,
`._artifacts`) are additions, not a new layout: a writer creates them in a file that has none.
"""

_UPGRADABLE_VERSION: Final = 3
"""The earlier version this release reads as it is and upgrades when it writes."""

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS cp_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cp_sessions (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT '{}',
    version INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ttl REAL,
    expires_at REAL,
    last_seq INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_token INTEGER NOT NULL DEFAULT 0,
    lease_expires REAL NOT NULL DEFAULT 0,
    lease_ttl REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, session_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS cp_sessions_recent ON cp_sessions (tenant, updated_at DESC, session_id);
CREATE INDEX IF NOT EXISTS cp_sessions_expiry ON cp_sessions (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS cp_messages (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, session_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS cp_messages_id ON cp_messages (tenant, session_id, message_id);
CREATE TABLE IF NOT EXISTS cp_checkpoints (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cp_traces (
    tenant TEXT NOT NULL,
    session_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, session_id, n)
) WITHOUT ROWID;
"""


def open_for_writing(path: str, busy_ms: int, synchronous: Literal["FULL", "NORMAL"],
                     allow_other_tables: bool = False) -> sqlite3.Connection:
    """Open (or create) the database in WAL mode; its folder is created when missing.

    A file holding another application's tables and no contextpipe data is refused unless
    `allow_other_tables` (`refuse_other_applications`), before anything in it changes.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'cp_meta'").fetchone():
            schema_version(conn, path)  # a file of another schema is refused before anything in it changes
        elif not allow_other_tables:
            refuse_other_applications(conn, path)
        use_wal(conn, busy_ms)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn


def create_tables(conn: sqlite3.Connection, path: str) -> None:
    """Create the tables that are missing and mark a new file with this release's schema (in a transaction)."""
    for statement in (_SCHEMA + SQLITE_OUTBOX + SQLITE_QUEUE + SQLITE_ARTIFACTS).split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(SQLITE_FRESH)
    version = schema_version(conn, path)
    if version == _UPGRADABLE_VERSION:  # leases written before it have no ttl (0: unbounded) until renewed
        conn.execute("ALTER TABLE cp_sessions ADD COLUMN lease_ttl REAL NOT NULL DEFAULT 0")
    if version != SQLITE_SCHEMA_VERSION:  # a new file, or one just upgraded
        conn.execute("INSERT OR REPLACE INTO cp_meta VALUES ('schema_version', ?)", (str(SQLITE_SCHEMA_VERSION),))


def open_read_only(path: str, busy_ms: int) -> sqlite3.Connection:
    """Open an existing database for reading only, checking that it is a contextpipe database.

    A WAL database in a folder the user cannot write cannot get its shared-memory file; when no
    write-ahead log is pending, the main file holds everything, so it is read as immutable.
    """
    target = f"file:{quote(str(Path(path).resolve()))}"
    conn = sqlite3.connect(f"{target}?mode=ro", uri=True, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        try:
            tables = _tables(conn, path)
        except sqlite3.OperationalError as exc:
            wal = Path(f"{path}-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise StoreError(f"{path} cannot be read: its write-ahead log holds recent writes, which SQLite can "
                                 f"only read with write access to the folder ({exc})", backend="sqlite") from exc
            conn.close()
            conn = sqlite3.connect(f"{target}?mode=ro&immutable=1", uri=True, isolation_level=None,
                                   check_same_thread=False)
            tables = _tables(conn, path)
        conn.row_factory = sqlite3.Row  # rows read by name or position, like the writer's
        if "cp_meta" not in tables:
            raise StoreError(f"{path} is not a contextpipe session database", backend="sqlite")
        schema_version(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _tables(conn: sqlite3.Connection, path: str) -> set[str]:
    """Return the database's tables (`OperationalError` when it cannot be opened; other damage: `StoreError`)."""
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError:
        raise
    except sqlite3.DatabaseError as exc:  # not a database at all, or a damaged one
        raise StoreError(f"{path} is not a contextpipe session database ({exc})", backend="sqlite") from exc


def schema_version(conn: sqlite3.Connection, path: str) -> int | None:
    """Return the file's schema version (None when it has none yet), or raise `StoreError` saying what to do.

    A file of another version is refused: a newer one needs a newer contextpipe, an older one was
    written by an unreleased development version.
    """
    row = conn.execute("SELECT value FROM cp_meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        return None
    if not str(row[0]).isdigit():
        raise StoreError(f"{path}: unreadable schema version {shorten(row[0])}", backend="sqlite", server=path)
    if int(row[0]) > SQLITE_SCHEMA_VERSION:
        raise StoreError(f"{path} was written by a newer contextpipe (schema {row[0]}, this release knows "
                         f"{SQLITE_SCHEMA_VERSION}); upgrade contextpipe", backend="sqlite", server=path)
    if int(row[0]) < _UPGRADABLE_VERSION:
        raise StoreError(f"{path} was written by an earlier, unreleased contextpipe (schema {row[0]}, this release "
                         f"reads only {_UPGRADABLE_VERSION} and {SQLITE_SCHEMA_VERSION}): export its sessions with the "
                         "contextpipe that wrote it (contextpipe sessions export), or start a new database file",
                         backend="sqlite", server=path)
    return int(row[0])
