"""The SQLite file itself: one read-only path, one schema-version check, damage named by its sequence."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from contextpipe import CorruptRecord, FunctionCall, Message, Session, StoreError
from contextpipe.stores import SQLiteStore
from contextpipe.stores import sqlite as sqlite_module
from contextpipe.vectors import SQLiteVectorStore, VectorRecord

from .backends import FakeClock


def raw(path: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    """Run `sql` on its own connection, committed and closed (so the write-ahead log is folded into the file)."""
    with closing(sqlite3.connect(path)) as conn, conn:
        return conn.execute(sql, args).fetchall()


async def written(path: Path) -> Path:
    async with SQLiteStore(path) as store:
        await store.append("default", "s1", [Message.user("hi", id="a"), Message.assistant("hello", id="b")])
    return path


async def test_read_only_an_expired_session_reads_as_absent_and_stays_in_the_file(tmp_path: Path) -> None:
    clock = FakeClock()
    async with SQLiteStore(tmp_path / "e.db", clock=clock) as store:
        await store.save_session(Session("old", "default", {"k": 1}, ttl=10))
        await store.append("default", "old", [Message.user("bye")])
    clock.advance(60)
    before = (tmp_path / "e.db").read_bytes()
    async with SQLiteStore(tmp_path / "e.db", clock=clock, read_only=True) as reader:
        assert await reader.get_session("default", "old") is None
        assert (await reader.load("default", "old")).messages == []
        assert (await reader.list_sessions("default")).sessions == []
        with pytest.raises(StoreError, match="readonly database"):
            await reader.append("default", "old", [Message.user("more")])
    assert (tmp_path / "e.db").read_bytes() == before
    assert raw(tmp_path / "e.db", "SELECT session_id FROM cp_sessions") == [("old",)]


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_file_of_a_newer_schema_is_refused_with_one_message(tmp_path: Path, read_only: bool) -> None:
    path = await written(tmp_path / "n.db")
    newer = sqlite_module.SQLITE_SCHEMA_VERSION + 1
    raw(path, "UPDATE cp_meta SET value = ? WHERE key = 'schema_version'", str(newer))
    with pytest.raises(StoreError) as refused:
        async with SQLiteStore(path, read_only=read_only) as store:
            await store.load("default", "s1")
    assert str(refused.value) == (f"{path} was written by a newer contextpipe (schema {newer}, this release knows "
                                  f"{sqlite_module.SQLITE_SCHEMA_VERSION}); upgrade contextpipe")


@pytest.mark.parametrize("read_only", [False, True])
async def test_a_file_of_an_older_schema_is_refused_and_left_as_it_was(tmp_path: Path, read_only: bool) -> None:
    path = await written(tmp_path / "o.db")
    raw(path, "UPDATE cp_meta SET value = '2' WHERE key = 'schema_version'")
    before = path.read_bytes()
    with pytest.raises(StoreError) as refused:
        async with SQLiteStore(path, read_only=read_only) as store:
            await store.load("default", "s1")
    assert str(refused.value) == (
        f"{path} was written by an earlier, unreleased contextpipe (schema 2, this release reads only 3 and "
        f"{sqlite_module.SQLITE_SCHEMA_VERSION}): export its sessions with the contextpipe that wrote it "
        "(contextpipe sessions export), or start a new database file")
    assert path.read_bytes() == before and raw(path, "SELECT value FROM cp_meta") == [("2",)]


async def test_an_older_file_in_rollback_journal_mode_is_refused_unchanged(tmp_path: Path) -> None:
    # Refused before the store switches it to write-ahead logging (which rewrites the file's header).
    path = tmp_path / "journal.db"
    raw(path, "CREATE TABLE cp_meta (key TEXT PRIMARY KEY, value TEXT)")
    raw(path, "INSERT INTO cp_meta VALUES ('schema_version', '2')")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="schema 2"):
        async with SQLiteStore(path) as store:
            await store.load("default", "s1")
    assert path.read_bytes() == before


async def test_a_new_file_gets_this_releases_schema_version(tmp_path: Path) -> None:
    path = await written(tmp_path / "v.db")
    assert raw(path, "SELECT value FROM cp_meta WHERE key = 'schema_version'") == [
        (str(sqlite_module.SQLITE_SCHEMA_VERSION),)]
    async with SQLiteStore(path) as store:  # opened again: the same version, the same messages
        assert [m.id for m in (await store.load("default", "s1")).messages] == ["a", "b"]


@pytest.mark.parametrize("content", [b"name,email\nann,ann@example.com\n", b""])
async def test_a_file_that_is_not_a_session_database_says_so_read_only(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="is not a contextpipe session database"):
        async with SQLiteStore(path, read_only=True) as store:
            await store.list_sessions("default")
    assert path.read_bytes() == content


@pytest.mark.parametrize("body", [
    '[2,"n2",1.0,null,5]',
    '[2,"n2",1' + "0" * 400 + ',null,"beyond a float"]',
    '{"v":1,"id":"n2","role":"assistant","parts":[{"kind":"text","text":"x"}],"created_at":1' + "0" * 400 + '}',
])
async def test_a_damaged_compact_row_is_named_by_its_sequence(tmp_path: Path, body: str) -> None:
    log = [Message.user("And the invoice?", id="n1", created_at=1_800_000_000.5),
           Message("assistant", (FunctionCall("c9", "get_invoice", "{}"),), id="n2", created_at=1_800_000_001.0),
           Message.assistant("Sent.", id="n3", created_at=1_800_000_002.0, author_name="Bot", metadata={"a": 1})]
    async with SQLiteStore(tmp_path / "c.db") as store:
        await store.append("default", "s1", log)
    raw(tmp_path / "c.db", "UPDATE cp_messages SET body = ? WHERE seq = 2", body)
    async with SQLiteStore(tmp_path / "c.db") as store:
        for read in (store.load, store.load_context):
            with pytest.raises(CorruptRecord, match="message 2") as caught:
                await read("default", "s1")
            assert caught.value.sequence == 2


def another_application(path: Path) -> Path:
    raw(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
    raw(path, "INSERT INTO users (email) VALUES ('ann@example.com')")
    return path


async def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = another_application(tmp_path / "app.db")
    before = path.read_bytes()
    with pytest.raises(StoreError) as refused:
        async with SQLiteStore(path) as store:
            await store.append("default", "s1", [Message.user("hi")])
    assert str(refused.value) == (
        f"{path} holds another application's tables ('users') and no contextpipe data; use a new file, or pass "
        "allow_other_tables=True to add contextpipe's cp_* tables to this one")
    vectors = SQLiteVectorStore(path)
    with pytest.raises(StoreError, match="another application's tables"):
        await vectors.upsert("notes", [VectorRecord("n1", [1.0, 0.0], "a note")])
    await vectors.close()
    assert path.read_bytes() == before  # no table added
    assert raw(path, "PRAGMA journal_mode") == [("delete",)]  # not switched to WAL


async def test_allow_other_tables_shares_the_file_and_then_it_is_ours(tmp_path: Path) -> None:
    path = another_application(tmp_path / "app.db")
    async with SQLiteStore(path, allow_other_tables=True) as store:
        await store.append("default", "s1", [Message.user("hi")])
        vectors = store.vectors()
        await vectors.upsert("notes", [VectorRecord("n1", [1.0, 0.0], "a note")])
        await vectors.close()
    assert raw(path, "SELECT email FROM users") == [("ann@example.com",)]
    async with SQLiteStore(path) as store:  # it holds contextpipe's tables now: opened without the flag
        assert [m.text for m in (await store.load("default", "s1")).messages] == ["hi"]


async def test_a_vector_file_alone_and_an_empty_file_open_as_usual(tmp_path: Path) -> None:
    vectors = SQLiteVectorStore(tmp_path / "v.db")
    await vectors.upsert("notes", [VectorRecord("n1", [1.0, 0.0], "a note")])
    await vectors.close()
    async with SQLiteStore(tmp_path / "v.db") as store:  # a contextpipe file: the sessions go beside the vectors
        await store.append("default", "s1", [Message.user("hi")])
    (tmp_path / "empty.db").write_bytes(b"")
    async with SQLiteStore(tmp_path / "empty.db") as store:
        await store.append("default", "s1", [Message.user("hi")])
    vectors = SQLiteVectorStore(tmp_path / "empty.db")
    await vectors.upsert("notes", [VectorRecord("n1", [1.0, 0.0], "a note")])
    assert [h.id for h in await vectors.search("notes", [1.0, 0.0], k=1)] == ["n1"]
    await vectors.close()
