"""SQLiteStore reads a log a few thousand messages per value: the same pages as row by row, damage still named."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import CorruptRecord, FunctionCall, FunctionResult, Message, StoreError
from contextpipe.codec import dumps
from contextpipe.session import SessionKey
from contextpipe.stores import SQLiteStore
from contextpipe.stores import _sqlite_log as log_module
from contextpipe.stores._rows import decode_checkpoint
from contextpipe.stores.base import Checkpoint
from message_strategies import anatomy, wide_ints


def log_of(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        if i % 5 == 3:
            out.append(Message("assistant", (FunctionCall(f"c{i}", "lookup", '{"q": 1}'),)))
        elif i % 5 == 4:
            out.append(Message("tool", (FunctionResult(f"c{i - 1}", "ok"),)))
        else:
            out.append(Message.user(f"m{i} é ☃", metadata={"i": i} if i % 7 == 0 else {}))
    return out


def rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the store read row by row (the reference the joined reads must match)."""
    read = log_module.read_log
    monkeypatch.setattr(log_module, "read_log", lambda conn, key, after, end, limit, sink: read(
        conn, key, after, end, limit, None))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 23), chunk=st.integers(1, 7), first=st.integers(1, 7), limit=st.none() | st.integers(1, 25),
       after=st.none() | st.integers(0, 25), before=st.none() | st.integers(1, 26),
       checkpoint=st.integers(0, 23))
async def test_joined_reads_match_row_reads_at_every_chunk_boundary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, chunk: int, first: int, limit: int | None,
        after: int | None, before: int | None, checkpoint: int) -> None:
    path = tmp_path / f"s-{n}-{chunk}-{first}-{limit}-{after}-{before}-{checkpoint}.db"
    path.unlink(missing_ok=True)
    log = log_of(n)
    async with SQLiteStore(path) as store:
        if log:
            await store.append("t", "s", log)
        if 1 <= checkpoint <= n:
            await store.save_checkpoint("t", "s", Checkpoint(checkpoint, Message.system("summary"), 1.0))
        with monkeypatch.context() as patch:
            patch.setattr(log_module, "_MAX_ARRAY_ROWS", chunk)
            patch.setattr(log_module, "_FIRST_ARRAY_ROWS", first)  # pieces first, 2 * first, ... up to chunk
            page = await store.load("t", "s", limit=limit, after=after, before=before)
            context = await store.load_context("t", "s", limit=limit)
        with monkeypatch.context() as patch:
            rows_only(patch)
            assert page == await store.load("t", "s", limit=limit, after=after, before=before)
            assert context == await store.load_context("t", "s", limit=limit)
    lo = after or 0
    hi = n if before is None else min(n, before - 1)
    expected = log[lo:hi] if lo < hi else []
    if limit is not None:
        expected = expected[-limit:]
    assert page.messages == expected
    assert [type(m) for m in page.messages] == [Message] * len(expected)


# --- streamed loads equal the plain reference read (one query, each row decoded on its own) ---------------

REAL_THRESHOLDS = (log_module._FIRST_ARRAY_ROWS, log_module._MAX_ARRAY_ROWS)

message = st.one_of(
    st.builds(lambda text, meta: Message.user(text, metadata={"k": meta} if meta is not None else {}),
              st.text(max_size=12), st.none() | st.integers() | wide_ints),  # integers past 64 bits on purpose
    st.builds(lambda name, args: Message("assistant", (FunctionCall("c", name, args),)),
              st.sampled_from(["lookup", "book"]), st.sampled_from(['{"q": 1}', "{not json", ""])),
    st.builds(lambda out, error: Message("tool", (FunctionResult("c", out, is_error=error),)),
              st.text(max_size=8), st.booleans()),
    st.builds(Message.assistant, st.text(max_size=12)),
)


async def plain_load(store: SQLiteStore, limit: int | None, before: int | None, after: int | None) -> Any:
    """`SQLiteStore.load` by the reference read."""
    key = SessionKey("t", "s")
    end, rows = await store._run(store._load_rows, key, limit, before, after, None)
    return log_module.decode_rows_one_by_one(store.backend, key, end, rows or [])


async def plain_load_context(store: SQLiteStore, limit: int | None) -> Any:
    """`SQLiteStore.load_context` by the reference read."""
    key = SessionKey("t", "s")
    body, _, end, rows = await store._run(store._context_rows, key, limit, None)
    checkpoint = decode_checkpoint(store.backend, key, body) if body is not None else None
    return checkpoint, log_module.decode_rows_one_by_one(store.backend, key, end, rows or [])


def streamed_only(patch: pytest.MonkeyPatch, thresholds: tuple[int, int]) -> list[bool]:
    """Set the array sizes; return a list noting, per array decoded, whether it decoded (no fall-back)."""
    decoded: list[bool] = []
    decode = log_module.decode_array

    def noting(array: Any) -> Any:
        part = decode(array)
        decoded.append(part is not None)
        return part

    patch.setattr(log_module, "_FIRST_ARRAY_ROWS", thresholds[0])
    patch.setattr(log_module, "_MAX_ARRAY_ROWS", thresholds[1])
    patch.setattr(log_module, "decode_array", noting)
    return decoded


async def assert_streamed_equals_plain(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch,
                                       thresholds: tuple[int, int], windows: list[tuple[Any, Any, Any]]) -> None:
    for limit, before, after in windows:
        with monkeypatch.context() as patch:
            decoded = streamed_only(patch, thresholds)
            page = await store.load("t", "s", limit=limit, before=before, after=after)
            context = await store.load_context("t", "s", limit=limit)
        assert all(decoded)  # a healthy log is never read row by row
        assert decoded or not page.messages  # and messages read came from arrays, not from a fall-back
        plain, plain_context = await plain_load(store, limit, before, after), await plain_load_context(store, limit)
        assert page == plain, (limit, before, after)
        assert context == plain_context, limit
        # Type for type too: a float equal to an integer past 64 bits (2**64) is equal, but not what was stored.
        assert [anatomy(m) for m in page.messages] == [anatomy(m) for m in plain.messages]
        assert [anatomy(m) for m in context[1].messages] == [anatomy(m) for m in plain_context[1].messages]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
async def test_streamed_loads_equal_plain_loads_on_generated_logs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: st.DataObject) -> None:
    small = data.draw(st.booleans(), "small arrays")
    if small:  # arrays of a few messages: many cross the largest size within a short log
        first = data.draw(st.integers(1, 4), "first array")
        thresholds, batch = (first, data.draw(st.integers(first, 9), "largest array")), 12
    else:  # the store's own sizes: logs of 200 to 1,600 messages cross the first array (256), many the second
        thresholds, batch = REAL_THRESHOLDS, 400
    least, appends = (1, 0) if small else (200, 1)
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "g.db"  # a new file for every example, replays included
    log: list[Message] = []
    async with SQLiteStore(path) as store:
        for _ in range(data.draw(st.integers(appends, 4), "appends")):
            fresh = data.draw(st.lists(message, min_size=least, max_size=batch), "batch")
            retried = log[-data.draw(st.integers(0, 3), "retried"):] if log else []  # already stored: skipped
            await store.append("t", "s", retried + fresh)
            log += fresh
            if log and data.draw(st.booleans(), "checkpoint?"):
                seq = data.draw(st.integers(1, len(log)), "checkpoint")
                await store.save_checkpoint("t", "s", Checkpoint(seq, Message.system(f"up to {seq}"), 1.0))
        n = len(log)
        bound = st.none() | st.integers(0, n + 2)
        windows = [(data.draw(st.none() | st.integers(1, n + 2), "limit"), data.draw(st.none() | st.integers(1, n + 2),
                    "before"), data.draw(bound, "after")) for _ in range(3)]
        await assert_streamed_equals_plain(store, monkeypatch, thresholds, [(None, None, None), *windows])
        assert [dumps(m) for m in (await store.load("t", "s")).messages] == [dumps(m) for m in log]  # as stored


@pytest.mark.parametrize("n", [255, 256, 257, 768, 769, 7936, 7937, 8200])
async def test_streamed_loads_equal_plain_loads_across_the_real_array_sizes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    log = log_of(n)
    async with SQLiteStore(tmp_path / "big.db") as store:
        await store.append("t", "s", log)
        await store.save_checkpoint("t", "s", Checkpoint(n // 3, Message.system("summary"), 1.0))
        back = n - 4000 if n > 4000 else n // 2  # a window that holds messages at every size
        windows = [(None, None, None), (1000, None, None), (None, back, 7), (257, n, n // 2), (n, None, 1)]
        await assert_streamed_equals_plain(store, monkeypatch, REAL_THRESHOLDS, windows)


async def test_integers_beyond_64_bits_load_as_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by the property above: an integer orjson reads as a float, at message 200 of a streamed read.
    log = log_of(300)
    log[199] = Message.user("x", metadata={"k": -14136784903946279993})
    log[260] = Message.user("y", metadata={"k": 2**64, "f": 2.0**64})  # equal to its float: compared by type
    async with SQLiteStore(tmp_path / "w.db") as store:
        await store.append("t", "s", log)
        await assert_streamed_equals_plain(store, monkeypatch, REAL_THRESHOLDS, [(None, None, None), (150, None, None)])
        for page in (await store.load("t", "s"), (await store.load_context("t", "s"))[1],
                     await plain_load(store, None, None, None)):
            assert [dumps(m) for m in page.messages] == [dumps(m) for m in log]  # an int written as 1.8e19 differs
            wide, equal = page.messages[199].metadata, page.messages[260].metadata
            assert (wide["k"], type(wide["k"]), type(equal["k"]), type(equal["f"])) == (log[199].metadata["k"], int,
                                                                                         int, float)


LOG = log_of(10)


async def damaged(tmp_path: Path, sql: str, *args: object) -> SQLiteStore:
    store = SQLiteStore(tmp_path / "d.db")
    await store.append("t", "s", LOG)
    with sqlite3.connect(store.path) as conn:
        conn.execute(sql, args)
    return store


@pytest.mark.parametrize("body", [
    '{"v": 1, "role": ',  # cut short
    '{"v": 1, "id": "x", "role": "user", "parts": [], "created_at": 1.0}, {"v": 1}',  # two values in one row
    "",  # empty
    "[1, 2",  # opens the array the rows are joined into
    "1], [2",  # closes it
])
@pytest.mark.parametrize("pieces", [(256, 4096), (1, 2), (2, 3)])  # damage in the only piece, or a later one
async def test_a_damaged_row_is_still_named_by_its_sequence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            body: str, pieces: tuple[int, int]) -> None:
    monkeypatch.setattr(log_module, "_FIRST_ARRAY_ROWS", pieces[0])
    monkeypatch.setattr(log_module, "_MAX_ARRAY_ROWS", pieces[1])
    store = await damaged(tmp_path, "UPDATE cp_messages SET body = ? WHERE seq = 6", body)
    async with store:
        for load in (store.load("t", "s"), store.load_context("t", "s")):
            with pytest.raises(CorruptRecord, match=r"message 6 of session 's'") as info:
                await load
            assert info.value.sequence == 6
        assert len((await store.load("t", "s", limit=4)).messages) == 4  # the rows after it still load


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 15), data=st.data(), first=st.integers(1, 5), chunk=st.integers(1, 6),
       body=st.sampled_from(['{"v": 1, "role": ', "", "[1, 2", "1], [2", '{"v": 1}']))
async def test_damage_anywhere_in_any_piece_is_named_by_its_sequence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, data: st.DataObject, first: int, chunk: int,
        body: str) -> None:
    bad = data.draw(st.integers(1, n))
    path = tmp_path / f"a-{n}-{bad}-{first}-{chunk}-{len(body)}.db"
    path.unlink(missing_ok=True)
    log = log_of(n)
    async with SQLiteStore(path) as store:
        await store.append("t", "s", log)
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE cp_messages SET body = ? WHERE seq = ?", (body, bad))
        with monkeypatch.context() as patch:
            patch.setattr(log_module, "_FIRST_ARRAY_ROWS", first)
            patch.setattr(log_module, "_MAX_ARRAY_ROWS", chunk)
            for load in (store.load("t", "s"), store.load_context("t", "s")):
                with pytest.raises(CorruptRecord) as info:
                    await load
                assert info.value.sequence == bad
            assert (await store.load("t", "s", after=bad)).messages == log[bad:]  # the rest still loads


async def test_a_body_indexed_under_another_id_is_named(tmp_path: Path) -> None:
    store = await damaged(tmp_path, "UPDATE cp_messages SET message_id = 'other' WHERE seq = 2")
    async with store:
        with pytest.raises(CorruptRecord, match=r"indexed as 'other'"):
            await store.load("t", "s")


@pytest.mark.parametrize("pieces", [(256, 4096), (1, 2)])  # found in the only piece, or after pieces were decoded
async def test_rows_missing_from_the_log_are_read_row_by_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             pieces: tuple[int, int]) -> None:
    monkeypatch.setattr(log_module, "_FIRST_ARRAY_ROWS", pieces[0])
    monkeypatch.setattr(log_module, "_MAX_ARRAY_ROWS", pieces[1])
    store = await damaged(tmp_path, "DELETE FROM cp_messages WHERE seq = 4")
    async with store:
        page = await store.load("t", "s")
        _, context = await store.load_context("t", "s")
    assert page.messages == context.messages == LOG[:3] + LOG[4:]  # as before: the rows that are there, in order


async def test_ids_holding_nul_and_values_over_sqlites_limit_still_load(tmp_path: Path) -> None:
    log = [Message.user("a", id="x\0y"), Message.user("b" * 3000), Message.user("c", id="x"), Message.user("d")]
    async with SQLiteStore(tmp_path / "n.db") as store:
        await store.append("t", "s", log)
        assert (await store.load("t", "s")).messages == log
        # A joined value larger than SQLite allows (many large messages): read row by row instead.
        store._connection().setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 3500)
        assert (await store.load("t", "s")).messages == log
        assert (await store.load_context("t", "s"))[1].messages == log


async def test_a_body_that_is_not_utf8_fails_as_row_by_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await damaged(tmp_path, "UPDATE cp_messages SET body = CAST(X'7b22ff227d' AS TEXT) WHERE seq = 5")
    async with store:
        with pytest.raises(StoreError) as joined:
            await store.load("t", "s")
        rows_only(monkeypatch)
        with pytest.raises(StoreError) as rows:
            await store.load("t", "s")
    assert str(joined.value) == str(rows.value) and "UTF-8" in str(joined.value)


class Paced:
    """Hold the store's thread after it hands over its first piece until the test says go (progress signals)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.handed = threading.Event()  # the first piece went to the event loop
        self.go = threading.Event()
        self.decoded = threading.Event()  # the event loop decoded a piece
        self.seen_decoded = False  # the loop decoded the first piece while the thread was still reading
        self.answers: list[bool] = []  # what each hand-over answered (False: nobody listens any more)
        read, part = log_module.read_log, log_module.decode_array

        def paced_read(conn: sqlite3.Connection, key: Any, after: int, end: int, limit: int | None,
                       sink: Any) -> Any:
            def paced_sink(piece: Any) -> bool:
                self.answers.append(sink(piece))
                if len(self.answers) == 1:
                    self.handed.set()
                    self.go.wait(30)  # a bound against a hung test only: the test sets it
                    self.seen_decoded = self.decoded.is_set()
                return self.answers[-1]
            return read(conn, key, after, end, limit, paced_sink if sink is not None else None)

        def decoding(piece: Any) -> Any:
            out = part(piece)
            self.decoded.set()
            return out

        monkeypatch.setattr(log_module, "read_log", paced_read)
        monkeypatch.setattr(log_module, "decode_array", decoding)
        monkeypatch.setattr(log_module, "_FIRST_ARRAY_ROWS", 2)
        monkeypatch.setattr(log_module, "_MAX_ARRAY_ROWS", 3)


@pytest.mark.parametrize("method", ["load", "load_context"])
async def test_the_loop_decodes_a_piece_while_the_thread_reads_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    paced = Paced(monkeypatch)
    async with SQLiteStore(tmp_path / "p.db") as store:
        await store.append("t", "s", LOG)
        task = asyncio.ensure_future(getattr(store, method)("t", "s"))
        await asyncio.to_thread(paced.decoded.wait, 30)  # the first piece is decoded before the read goes on
        paced.go.set()
        result = await task
    page = result if method == "load" else result[1]
    assert page.messages == LOG and paced.seen_decoded and paced.answers == [True] * 4  # pieces of 2, 3, 3, 2


@pytest.mark.parametrize("method", ["load", "load_context"])
async def test_a_read_cancelled_midway_ends_its_transaction_and_the_store_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    paced = Paced(monkeypatch)
    async with SQLiteStore(tmp_path / "c.db") as store:
        await store.append("t", "s", LOG)
        task = asyncio.ensure_future(getattr(store, method)("t", "s"))
        await asyncio.to_thread(paced.handed.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        paced.go.set()
        more = [Message.user("after")]
        await store.append("t", "s", more)  # a write transaction: the read's snapshot was committed
        assert paced.answers == [True, False]  # the read stopped at its next piece
        paced.answers.clear()
        assert (await store.load("t", "s")).messages == LOG + more
    assert paced.answers == [True] * 4  # pieces of 2, 3, 3, 3


@pytest.mark.parametrize("method", ["load", "load_context"])
async def test_a_driver_error_midway_through_the_read_is_a_store_error_and_the_store_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    read = log_module.read_log
    handed: list[object] = []

    def failing_read(conn: sqlite3.Connection, key: Any, after: int, end: int, limit: int | None, sink: Any) -> Any:
        def failing_sink(piece: Any) -> bool:
            handed.append(piece)
            if len(handed) == 2:
                raise sqlite3.OperationalError("disk I/O error")
            return bool(sink(piece))
        return read(conn, key, after, end, limit, failing_sink if sink is not None else None)

    monkeypatch.setattr(log_module, "_FIRST_ARRAY_ROWS", 2)
    monkeypatch.setattr(log_module, "_MAX_ARRAY_ROWS", 3)
    async with SQLiteStore(tmp_path / "e.db") as store:
        await store.append("t", "s", LOG)
        with monkeypatch.context() as patch:
            patch.setattr(log_module, "read_log", failing_read)
            with pytest.raises(StoreError, match="disk I/O error"):
                await getattr(store, method)("t", "s")
        await store.append("t", "s", [Message.user("after")])  # the read's transaction ended
        assert len((await store.load("t", "s")).messages) == len(LOG) + 1
