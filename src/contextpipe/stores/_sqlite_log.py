"""How `SQLiteStore` reads a session's log: streamed as JSON arrays, row by row, or by message id.

The plain read is one query returning one ``(seq, message_id, body)`` row per message, each row
decoded on its own (`read_log_rows`, `decode_rows_one_by_one`). The streamed read asks SQLite to
join the bodies of a few thousand consecutive messages into one JSON array (``group_concat``), a
`GroupConcatArray`: one Python value per array instead of three per message. The store's worker
thread hands each array to the event loop as soon as it is read (`_ArrayHandoff`), and the loop
decodes it while the thread reads the next one, all inside one read transaction (`stream_log`).

Both reads return the same messages in the same order (a property test pins them together,
``tests/stores/test_sqlite_log.py``); whenever an array fails a check, the log is read row by row,
so a damaged message is still named by its sequence. Reads by id answer whether the log holds a
message already: `existing_ids` for idempotent appends, `message_seq` for a retried run's input.
"""

from __future__ import annotations

import asyncio
import functools
import operator
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

from ..errors import CodecError
from ..messages import Message
from ..session import SessionKey
from ._fastdecode import loads_arrays
from ._rows import decode_message
from .base import MessagePage

T = TypeVar("T")

LogRows: TypeAlias = "list[tuple[int, str, str]]"
"""A log read row by row: one ``(seq, message_id, body)`` row per message, oldest first."""


@dataclass(frozen=True, slots=True)
class GroupConcatArray:
    """Consecutive messages of a log read as one JSON array made by SQL ``group_concat`` (not one row each)."""

    first_seq: int
    """Sequence of the first message."""
    count: int
    """How many messages (sequences ``first_seq`` to ``first_seq + count - 1``, checked by the reader)."""
    bodies: bytes
    """Their stored bodies as one JSON array in UTF-8: ``"[" + ",".join(bodies) + "]"``, in sequence order."""
    ids: str
    """The ids their rows are indexed under, joined by NUL characters."""


ArraySink: TypeAlias = "Callable[[GroupConcatArray], bool]"
"""Where a streamed read hands each array (on the store's thread); False when nobody listens any more."""

_FIRST_ARRAY_ROWS: Final = 256
"""Messages in the first array of a streamed read: few, so that decoding starts at once (each next one doubles)."""

_MAX_ARRAY_ROWS: Final = 4096
"""Most messages in one array: few Python objects per message, and a bounded string per read."""

_GROUP_CONCAT_SQL: Final = (
    "SELECT CAST('[' || group_concat(body, ',') || ']' AS BLOB), group_concat(seq - ?), "
    "group_concat(message_id, char(0)), count(*) FROM (SELECT seq, message_id, body FROM cp_messages "
    "WHERE tenant = ? AND session_id = ? AND seq > ? AND seq <= ? ORDER BY seq)")

_message_id: Final = operator.attrgetter("id")


# --- the reference: one plain query, each row decoded on its own ---------------------------------------


def read_log_rows(conn: sqlite3.Connection, key: SessionKey, after: int, end: int, limit: int | None) -> LogRows:
    """Return ``(seq, message_id, body)`` after `after` up to `end`, oldest first (the newest `limit` of them)."""
    cursor = conn.cursor()
    cursor.row_factory = None  # plain tuples: a log may have many rows
    where = "FROM cp_messages WHERE tenant = ? AND session_id = ? AND seq > ? AND seq <= ?"
    if limit is None:
        return cursor.execute(f"SELECT seq, message_id, body {where} ORDER BY seq",
                              (key.tenant, key.id, after, end)).fetchall()
    rows: LogRows = cursor.execute(f"SELECT seq, message_id, body {where} ORDER BY seq DESC LIMIT ?",
                                   (key.tenant, key.id, after, end, limit)).fetchall()
    rows.reverse()
    return rows


def decode_rows_one_by_one(backend: str, key: SessionKey, end: int, rows: LogRows) -> MessagePage:
    """Return the page of `rows` (read by `read_log_rows`), each decoded on its own: what a streamed read must equal."""
    messages = [decode_message(backend, key, int(seq), body, mid) for seq, mid, body in rows]
    return page_from(messages, int(rows[0][0]) if rows else None, end)


def page_from(messages: list[Message], first: int | None, end: int) -> MessagePage:
    """Return the page of `messages` from sequence `first` (None when empty: one past `end`, the range's last)."""
    start = first or end + 1
    return MessagePage(messages, start, start > 1)


# --- the streamed read ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _counting(count: int) -> str:
    """``"1,2,...,count"``."""
    return ",".join(map(str, range(1, count + 1)))


def read_log(conn: sqlite3.Connection, key: SessionKey, after: int, end: int, limit: int | None,
             sink: ArraySink | None) -> LogRows | None:
    """Read the messages after `after` up to `end` (the newest `limit` of them), oldest first.

    With a `sink` (streamed), a few thousand messages come as one `GroupConcatArray` each, handed
    to `sink` as soon as it is read, and None is returned; the first arrays are small, so the
    reader can start decoding at once. Sequences are contiguous, so the range is known; each read
    is checked to hold exactly its sequences, in order (SQLite does not promise the order in which
    ``group_concat`` sees rows), and the log is read row by row (and returned) when one does not or
    when an array would exceed SQLite's largest value. Bodies come as UTF-8 bytes, which the JSON
    parser reads as they are (no text object to make first). When the sink stops listening, the
    read ends there (None). Without a sink, the log is read row by row.
    """
    if sink is None:
        return read_log_rows(conn, key, after, end, limit)
    low = after if limit is None else max(after, end - limit)
    cursor = conn.cursor()
    cursor.row_factory = None
    size = min(_FIRST_ARRAY_ROWS, _MAX_ARRAY_ROWS)
    while low < end:
        high = min(low + size, end)
        try:
            bodies, seqs, ids, count = cursor.execute(_GROUP_CONCAT_SQL,
                                                      (low, key.tenant, key.id, low, high)).fetchone()
        except sqlite3.DataError:  # too big for one value
            return read_log_rows(conn, key, after, end, limit)
        if count != high - low or seqs != _counting(count):  # sequences low + 1, low + 2, ... in order
            return read_log_rows(conn, key, after, end, limit)
        if not sink(GroupConcatArray(low + 1, count, bodies, ids)):
            return None
        low = high
        size = min(size * 2, _MAX_ARRAY_ROWS)
    return None


def decode_array(array: GroupConcatArray) -> list[Message] | None:
    """Decode one `GroupConcatArray`, or return None when the log must be read row by row.

    Each body is one JSON value, so an array decodes to exactly `count` messages whose ids are the
    indexed ones. Anything else (a damaged body, a body that is not one JSON value, a mismatched id,
    an id holding a NUL) returns None: the caller reads the rows one by one, and the row decoder
    names the first that cannot be read, as it always has.
    """
    try:
        [part] = loads_arrays([array.bodies])
    except CodecError:
        return None
    if len(part) != array.count:
        return None
    ids = "\0".join(map(_message_id, part))
    # Equal texts with count - 1 separators: neither side has a NUL inside an id, so the ids are equal.
    if ids != array.ids or ids.count("\0") != array.count - 1:
        return None
    return part


class _ArrayHandoff:
    """Arrays of a streamed read, handed from the store's thread to the event loop as they are read.

    The thread appends under a lock and wakes the loop only when it waits for an array: a loop busy
    decoding finds the next array there when it asks, and the thread goes on to its next read
    without giving the interpreter lock to the loop first (a wake-up writes to the loop's socket,
    which would let the loop take the lock, and the thread wait for it until the loop lets go).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._arrays: deque[GroupConcatArray | None] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def put(self, array: GroupConcatArray) -> bool:
        """Hand `array` over (on the store's thread); return False when the loop no longer listens."""
        with self._lock:
            if self._closed:
                return False
            self._arrays.append(array)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            try:
                self._loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the event loop is closed: nobody is listening
                return False
        return True

    def end(self, job: asyncio.Future[Any]) -> None:
        """Mark the read ended (on the loop, when its job is done; its outcome is taken where it is awaited)."""
        if not job.cancelled():
            job.exception()  # retrieved here too: a cancelled reader no longer awaits the job
        with self._lock:
            self._arrays.append(None)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    def close(self) -> None:
        """Stop listening: the thread ends its read at its next array."""
        with self._lock:
            self._closed = True

    async def get(self) -> GroupConcatArray | None:
        """Return the next array, or None once the read has ended."""
        while True:
            with self._lock:
                if self._arrays:
                    return self._arrays.popleft()
                waiter = self._waiter = self._loop.create_future()
            await waiter


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def stream_log(executor: Executor, job: Callable[[ArraySink], T]) -> tuple[T, list[Message] | None, int | None]:
    """Run ``job(sink)`` on the store's thread, decoding each array it hands to `sink` as it arrives.

    The read stays one job in one transaction; as the thread finishes an array, it hands it to the
    event loop, which decodes it while the thread reads the next (SQLite works without the
    interpreter lock). Returns the job's result, the decoded messages (None when an array could not
    be decoded: the reader was told to stop, and the log must be read row by row) and the first
    array's sequence. When the job read rows instead (an array failed its checks on the thread),
    whatever was decoded is to be discarded by the caller.

    Cancelled, the loop stops listening; the thread ends the read after its current array and
    commits, so the store stays usable.
    """
    loop = asyncio.get_running_loop()
    arrived = _ArrayHandoff(loop)
    future = loop.run_in_executor(executor, job, arrived.put)
    future.add_done_callback(arrived.end)
    messages: list[Message] | None = []
    first: int | None = None
    try:
        while (array := await arrived.get()) is not None:
            if messages is None:
                continue
            part = decode_array(array)
            if part is None:
                arrived.close()  # the log will be read row by row: the rest of this read is not needed
                messages = None
            else:
                first = array.first_seq if first is None else first
                messages += part
        result = await future
    finally:
        arrived.close()
    return result, messages, first


def existing_ids(conn: sqlite3.Connection, key: SessionKey, ids: list[str]) -> set[str]:
    """Return which of `ids` the session's log holds already (in chunks of 500, under SQLite's variable limit)."""
    known: set[str] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        marks = ",".join("?" * len(chunk))
        known.update(r["message_id"] for r in conn.execute(
            f"SELECT message_id FROM cp_messages WHERE tenant = ? AND session_id = ? AND message_id IN ({marks})",
            (key.tenant, key.id, *chunk)))
    return known


def message_seq(conn: sqlite3.Connection, key: SessionKey, message_id: str, now: float) -> int | None:
    """Return the sequence of the message with this id in a live (unexpired) session, or None."""
    row = conn.execute(
        "SELECT m.seq FROM cp_messages m JOIN cp_sessions s USING (tenant, session_id) "
        "WHERE m.tenant = ? AND m.session_id = ? AND m.message_id = ? AND (s.expires_at IS NULL OR s.expires_at > ?)",
        (key.tenant, key.id, message_id, now)).fetchone()
    return None if row is None else int(row["seq"])


def queue_waiting(conn: sqlite3.Connection, key: SessionKey) -> bool:
    """Return whether the session's queue (`_queue`) holds entries not settled (inside the caller's transaction)."""
    return conn.execute("SELECT 1 FROM cp_queue WHERE tenant = ? AND session_id = ? AND settled_at IS NULL LIMIT 1",
                        (key.tenant, key.id)).fetchone() is not None
