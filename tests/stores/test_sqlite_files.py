"""The SQLite file itself: one read-only path, one schema-version check, damage named by its sequence."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Literal

import pytest

from contextpipe import Agent, CorruptRecord, FunctionCall, Message, Session, StoreError, tool
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore
from contextpipe.stores import sqlite as sqlite_module
from contextpipe.testing import ScriptedModel, tool_call
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


def _take_away(path: Path, how: str) -> None:
    """Delete, replace or move the database file under an open store, the way a user or a script might."""
    if how == "deleted":
        path.unlink()
    elif how == "replaced":  # a copy (a backup restored) renamed onto the path: a file of its own
        copy = path.with_name("copy.db")
        with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(copy)) as target:
            source.backup(target)
        copy.replace(path)
    else:  # with its write-ahead log, as ``mv agent.db* elsewhere/`` does
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{path}{suffix}").exists():
                Path(f"{path}{suffix}").rename(path.with_name(f"moved.db{suffix}"))


@pytest.mark.parametrize("how", ["deleted", "replaced", "moved"])
@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_a_file_taken_away_under_an_open_store_fails_the_next_write_and_loses_nothing_acknowledged(
        tmp_path: Path, how: str, synchronous: Literal["FULL", "NORMAL"]) -> None:
    path = tmp_path / "agent.db"
    gone = "deleted or moved away"
    said = {"deleted": gone, "replaced": "replaced by another file", "moved": gone}
    acknowledged: list[str] = []
    async with SQLiteStore(path, synchronous=synchronous) as store:
        for i in range(3):
            await store.append("default", "s1", [Message.user(f"before {i}", id=f"b{i}")])
            acknowledged.append(f"b{i}")
        _take_away(path, how)
        for i in range(3):  # the first write after it fails, and so does every later one: none is acknowledged
            with pytest.raises(StoreError, match=f"the database file this store opened was {said[how]} while") as info:
                await store.append("default", "s1", [Message.user(f"after {i}", id=f"a{i}")])
            assert "open a new store" in str(info.value) and info.value.server == str(path)
        with pytest.raises(StoreError, match="the database file this store opened"):
            await store.load("default", "s1")
        with pytest.raises(StoreError):
            await store.acquire_lease("default", "s2", owner="w")
    # What the path holds: every acknowledged message the user did not delete, and nothing else.
    kept = {"deleted": [], "replaced": acknowledged, "moved": []}[how]
    async with SQLiteStore(path) as reopened:
        assert [m.id for m in (await reopened.load("default", "s1")).messages] == kept
        await reopened.append("default", "s1", [Message.user("fresh", id="f")])  # a new store on the path works
    if how == "moved":  # the moved file holds what was acknowledged, and not the refused writes
        async with SQLiteStore(tmp_path / "moved.db") as moved:
            assert [m.id for m in (await moved.load("default", "s1")).messages] == acknowledged


async def test_a_store_that_has_not_written_yet_opens_whatever_is_at_the_path(tmp_path: Path) -> None:
    path = await written(tmp_path / "w.db")
    store = SQLiteStore(path)
    try:
        path.rename(tmp_path / "elsewhere.db")  # before the store's first operation: nothing was opened
        assert (await store.load("default", "s1")).messages == []
        await store.append("default", "s1", [Message.user("new")])
    finally:
        await store.close()


async def test_a_relative_path_stays_the_file_opened_when_the_working_directory_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    async with SQLiteStore("agent.db") as store:
        await store.append("default", "s1", [Message.user("one")])
        monkeypatch.chdir(tmp_path / "b")  # "agent.db" now names nothing: the store's file is still there
        await store.append("default", "s1", [Message.user("two")])
        assert [m.text for m in (await store.load("default", "s1")).messages] == ["one", "two"]


@pytest.mark.parametrize("how", ["deleted", "replaced", "moved"])
async def test_a_vector_file_taken_away_fails_the_next_upsert_and_delete(tmp_path: Path, how: str) -> None:
    path = tmp_path / "agent.db"
    vectors = SQLiteVectorStore(path)
    try:
        await vectors.upsert("docs", [VectorRecord("a", [1.0, 0.0], "first")])
        assert [h.id for h in await vectors.vector_search("docs", [1.0, 0.0], k=1)] == ["a"]
        _take_away(path, how)
        with pytest.raises(StoreError, match="the database file this store opened"):
            await vectors.upsert("docs", [VectorRecord("b", [0.0, 1.0], "second")])
        with pytest.raises(StoreError, match="the database file this store opened"):
            await vectors.upsert("docs", [VectorRecord("c", [0.0, 1.0], "third")])
        with pytest.raises(StoreError, match="the database file this store opened"):
            await vectors.delete("docs", ids=["a"])
        with pytest.raises(StoreError, match="the database file this store opened"):
            await vectors.vector_search("docs", [1.0, 0.0], k=1)
    finally:
        await vectors.close()
    index_dir = tmp_path / "agent.db.vectors"  # its indexes are not saved beside the file now at the path
    assert (list(index_dir.iterdir()) if index_dir.exists() else []) == []


async def test_a_run_whose_database_file_is_deleted_mid_run_stops_at_its_next_write(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"

    @tool
    def clean_up() -> str:
        """Delete the database file, as a cleanup script might while a run goes on."""
        path.unlink()
        return "cleaned"

    model = ScriptedModel([tool_call("clean_up"), "finished"])
    async with SQLiteStore(path) as store:
        agent = Agent(model, tools=[clean_up], providers=[History(store)])
        session = await agent.session("s1")
        with pytest.raises(StoreError, match="deleted or moved away"):
            await agent.run("go", session=session)
    assert len(model.requests) == 1  # the tool's result could not be kept: no model call was made after it


@pytest.mark.parametrize("name", ["file::memory:", "file::memory:?cache=shared", ":memory:"])
async def test_an_in_memory_database_named_by_a_uri_has_no_file_to_lose(name: str) -> None:
    # (SQLite reads such names as URIs: there is no file at a path "file::memory:" to check)
    async with SQLiteStore(name) as store:
        await store.append("default", "s1", [Message.user("kept", id="k")])
        assert [m.id for m in (await store.load("default", "s1")).messages] == ["k"]
    vectors = SQLiteVectorStore(name)
    try:
        await vectors.upsert("docs", [VectorRecord("a", [1.0, 0.0], "first")])
        assert [h.id for h in await vectors.vector_search("docs", [1.0, 0.0], k=1)] == ["a"]
    finally:
        await vectors.close()


async def test_a_file_opened_by_a_uri_is_checked_like_one_opened_by_its_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with SQLiteStore("file:agent.db?mode=rwc") as store:
        await store.append("default", "s1", [Message.user("one")])
        (tmp_path / "agent.db").unlink()
        with pytest.raises(StoreError, match="deleted or moved away"):
            await store.append("default", "s1", [Message.user("two")])
