"""A SQLite file written before the compact form (schema 2) is upgraded in place and read exactly.

``tests/fixtures/stores/sqlite-schema2.db`` was written by contextpipe d394e9a (the last release
storing every message in the full JSON form), from `old_log` below:

    git archive d394e9a | tar -x -C /tmp/cp-d394e9a
    PYTHONPATH=/tmp/cp-d394e9a/src python tests/stores/test_sqlite_upgrade.py tests/fixtures/stores/sqlite-schema2.db
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from contextpipe import CorruptRecord, FunctionCall, FunctionResult, Message, StoreError
from contextpipe.messages import DataPart, ReasoningPart, Source, TextPart, UnknownPart, UriPart
from contextpipe.stores import SQLiteStore
from contextpipe.stores import sqlite as sqlite_module
from contextpipe.stores.base import Checkpoint

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "stores" / "sqlite-schema2.db"
PREVIOUS_SCHEMA = 2
"""The schema version the release that wrote the fixture knows (and refuses anything newer than)."""


def old_log() -> list[Message]:
    """Every kind of message and part, then a long plain conversation (read in several joined pieces)."""
    t = 1_700_000_000.0
    varied = [
        Message.system("You are a support agent.", id="m-sys", created_at=t),
        Message.user("Where is order A-1?", id="m-u1", created_at=t + 1.25, author_name="Ann",
                     source=Source("input")),
        Message("assistant", (ReasoningPart("Look it up.", "enc==", "openai.reasoning", "rs_1"),
                              TextPart("Checking."), FunctionCall("c1", "get_order", '{"id": "A-1"}'),
                              FunctionCall("c2", "get_invoice", "{not json")),
                id="m-a1", created_at=t + 2, source=Source("model", "gpt-x"), metadata={"usage": {"in": 10}}),
        Message("tool", (FunctionResult("c1", '{"status": "shipped"}'),
                         FunctionResult("c2", "bad arguments", is_error=True)),
                id="m-t1", created_at=t + 3, source=Source("tool", "get_order")),
        Message("tool", (FunctionResult("c3", "A chart.", parts=(DataPart(b"\x89PNG\r\n", "image/png"),
                                                                  UriPart("https://example.com/a.wav", "audio/wav"))),),
                id="m-t2", created_at=t + 4),
        Message("assistant", (UnknownPart("future", {"x": [1, 2]}), TextPart("é ☃ \u2028 \"quoted\"")),
                id="m-a2", created_at=t + 5, source=Source("context", None), metadata={"k": None}),
        Message("user", (), id="m-empty", created_at=t + 6),
        Message.assistant("", id="m-blank", created_at=7),
    ]
    plain: list[Message] = []
    for i in range(300):
        at = t + 10 + i
        if i % 4 == 1:
            plain.append(Message("assistant", (FunctionCall(f"k{i}", "lookup", f'{{"q": {i}}}'),), id=f"p{i}",
                                 created_at=at, source=Source("model", "gpt-x") if i % 8 == 1 else None))
        elif i % 4 == 2:
            plain.append(Message("tool", (FunctionResult(f"k{i - 1}", f"result {i}"),), id=f"p{i}", created_at=at))
        else:
            plain.append(Message("user" if i % 4 == 0 else "assistant", (TextPart(f"turn {i} é"),), id=f"p{i}",
                                 created_at=at, source=Source("input") if i % 3 == 0 else None))
    return varied + plain


def new_log() -> list[Message]:
    return [Message.user("And the invoice?", id="n1", created_at=1_800_000_000.5, source=Source("input")),
            Message("assistant", (FunctionCall("c9", "get_invoice", "{}"),), id="n2", created_at=1_800_000_001.0),
            Message.assistant("Sent.", id="n3", created_at=1_800_000_002.0, author_name="Bot", metadata={"a": 1})]


@pytest.fixture
def upgraded(tmp_path: Path) -> Path:
    path = tmp_path / "agent.db"
    shutil.copy(FIXTURE, path)
    return path


def raw(path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def test_the_fixture_was_written_in_the_full_form_at_schema_2() -> None:
    assert raw(FIXTURE, "SELECT value FROM cp_meta WHERE key = 'schema_version'") == [(str(PREVIOUS_SCHEMA),)]
    bodies = [str(b) for (b,) in raw(FIXTURE, "SELECT body FROM cp_messages ORDER BY seq")]
    assert len(bodies) == len(old_log()) and all(b.startswith("{") for b in bodies)


async def test_an_old_file_is_read_exactly_and_new_messages_go_in_the_compact_form(upgraded: Path) -> None:
    log, added = old_log(), new_log()
    async with SQLiteStore(upgraded) as store:
        assert (await store.load("default", "s1")).messages == log
        await store.append("default", "s1", added)
        page = await store.load("default", "s1")
        assert page.messages == log + added
        assert [m.source for m in page.messages] == [m.source for m in log + added]
        assert [type(p) for m in page.messages for p in m.parts] == [type(p) for m in log + added for p in m.parts]
        assert (await store.load("default", "s1", limit=5)).messages == (log + added)[-5:]
        checkpoint, tail = await store.load_context("default", "s1")
        assert checkpoint is not None and checkpoint.summary.text == "Summary so far." and checkpoint.seq == 8
        assert tail.messages == (log + added)[8:] and tail.first_seq == 9
    # Upgraded: a release that knows only schema 2 refuses the file ("upgrade contextpipe") instead of
    # failing on its compact messages.
    version = sqlite_module.SQLITE_SCHEMA_VERSION
    assert raw(upgraded, "SELECT value FROM cp_meta WHERE key = 'schema_version'") == [(str(version),)]
    assert version > PREVIOUS_SCHEMA
    bodies = [str(b) for (b,) in raw(upgraded, "SELECT body FROM cp_messages ORDER BY seq")]
    assert [b[0] for b in bodies] == ["{"] * len(log) + ["["] * len(added)
    async with SQLiteStore(upgraded, read_only=True) as reader:
        assert (await reader.load("default", "s1")).messages == log + added


@pytest.mark.parametrize("body", [
    '[2,"n2",1.0,null,5]',
    '[2,"n2",1' + "0" * 400 + ',null,"beyond a float"]',
    '{"v":1,"id":"n2","role":"assistant","parts":[{"kind":"text","text":"x"}],"created_at":1' + "0" * 400 + '}',
])
async def test_a_damaged_compact_row_is_named_by_its_sequence(upgraded: Path, body: str) -> None:
    async with SQLiteStore(upgraded) as store:
        await store.append("default", "s1", new_log())
    n = len(old_log()) + 2
    with sqlite3.connect(upgraded) as conn:
        conn.execute("UPDATE cp_messages SET body = ? WHERE seq = ?", (body, n))
    async with SQLiteStore(upgraded) as store:
        for read in (store.load, store.load_context):
            with pytest.raises(CorruptRecord, match=f"message {n}") as caught:
                await read("default", "s1")
            assert caught.value.sequence == n


async def test_a_file_of_a_newer_schema_is_refused(upgraded: Path) -> None:
    with sqlite3.connect(upgraded) as conn:
        conn.execute("UPDATE cp_meta SET value = ? WHERE key = 'schema_version'",
                     (str(sqlite_module.SQLITE_SCHEMA_VERSION + 1),))
    with pytest.raises(StoreError, match=r"newer contextpipe.*upgrade contextpipe"):
        async with SQLiteStore(upgraded) as store:
            await store.load("default", "s1")
    with pytest.raises(StoreError, match="upgrade contextpipe"):
        async with SQLiteStore(upgraded, read_only=True) as store:
            await store.load("default", "s1")


async def _write_fixture(path: Path) -> None:  # run by the release before the compact form (module docstring)
    async with SQLiteStore(path) as store:
        await store.append("default", "s1", old_log())
        await store.save_checkpoint("default", "s1", Checkpoint(8, Message.system("Summary so far.", id="ck",
                                                                                   created_at=1.0), 2.0))
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("VACUUM")


if __name__ == "__main__":
    asyncio.run(_write_fixture(Path(sys.argv[1])))
