"""FactMemory histories as users read them: `contextpipe inspect SESSION --facts` and the server's facts route."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import jsonschema

from contextpipe import Agent
from contextpipe.providers import FactMemory, History
from contextpipe.session import set_user_id
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.testing import ScriptedModel
from contextpipe.vectors import HashEmbedder, MemoryVectorStore
from helpers import Clock, changes, known_ids


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "contextpipe.cli", "inspect", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})


async def test_contextpipe_inspect_shows_each_facts_history_and_its_source_messages(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    async with SQLiteStore(db) as store:
        vectors = store.vectors()
        clock = Clock(1_700_000_000.0)
        extractor = ScriptedModel([changes(add=("Alice lives in Lisbon.",)),
                                   lambda r: changes(update={next(iter(known_ids(r))): "Alice lives in Porto."})])
        agent = Agent(ScriptedModel(["Noted.", "Nice."]),
                      providers=[History(store), FactMemory(extractor, vectors, HashEmbedder(), clock=clock)])
        session = await agent.session("alice-1")
        set_user_id(session, "alice")
        first = await agent.run("I live in Lisbon.", session=session)
        clock.now += 3600
        second = await agent.run("I moved to Porto.", session=session)
        await agent.session("nobody")
        await vectors.close()

    shown = inspect("alice-1", "--facts", "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "facts about user 'alice' (collection 'facts'): 1 fact(s), 2 version(s)"
    versions = [line for line in lines if line.startswith(("  1. ", "  2. "))]
    assert versions[0].startswith("  1. 2023-11-14 22:13:20 UTC -> 2023-11-14 23:13:20 UTC  Alice lives in Lisbon.")
    assert versions[1].startswith("  2. 2023-11-14 23:13:20 UTC -> now  Alice lives in Porto.")
    sources = [line.strip() for line in lines if line.startswith("       from ")]
    assert sources == [f"from {first.input[0].id} #1 user: I live in Lisbon.",
                       f"from {first.messages[0].id} #2 assistant: Noted.",
                       f"from {second.input[0].id} #3 user: I moved to Porto.",
                       f"from {second.messages[0].id} #4 assistant: Nice."]
    assert f"       ended by {second.input[0].id}, {second.messages[0].id}" in lines

    as_json = json.loads(inspect("alice-1", "--facts", "--json", "--db", str(db)).stdout)
    [fact] = as_json["facts"]
    assert [v["text"] for v in fact["versions"]] == ["Alice lives in Lisbon.", "Alice lives in Porto."]
    assert fact["versions"][1]["source_messages"][0] == {"id": second.input[0].id, "seq": 3, "role": "user",
                                                         "text": "I moved to Porto."}
    assert fact["versions"][0]["valid_to"] == fact["versions"][1]["valid_from"] == 1_700_003_600.0

    nobody = inspect("nobody", "--facts", "--db", str(db))
    assert nobody.returncode == 1 and "session 'nobody' belongs to no user" in nobody.stderr
    both = inspect("alice-1", "--facts", "--call", "1", "--db", str(db))
    assert both.returncode == 1 and "give one of them" in both.stderr


async def test_contextpipe_inspect_facts_of_a_file_without_vectors_adds_nothing_to_it(tmp_path: Path) -> None:
    db = tmp_path / "plain.db"
    async with SQLiteStore(db) as store:
        session = await store.load_or_create("default", "s")
        set_user_id(session, "bo")
        await store.save_session(session)
    shown = inspect("s", "--facts", "--db", str(db))
    assert shown.returncode == 0 and shown.stdout.startswith("no facts about user 'bo' in collection 'facts'")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'cp_vector%'").fetchone() == (0,)


async def test_the_server_gives_each_facts_history_with_its_source_message_ids() -> None:
    import httpx2 as httpx

    from contextpipe.serve import ApiKeys, create_app

    store = MemoryStore()
    clock = Clock(100.0)
    extractor = ScriptedModel([changes(add=("Alice lives in Lisbon.",)),
                               lambda r: changes(update={next(iter(known_ids(r))): "Alice lives in Porto."})])
    agent = Agent(ScriptedModel(["Noted.", "Nice."]),
                  providers=[History(store), FactMemory(extractor, MemoryVectorStore(), HashEmbedder(), clock=clock)])
    session = await agent.session("alice-1", tenant="acme")
    set_user_id(session, "alice")
    first = await agent.run("I live in Lisbon.", session=session)
    clock.now = 200.0
    second = await agent.run("I moved to Porto.", session=session)
    keys = ApiKeys()
    keys.add("acme", "cp_acme_key")
    auth = {"Authorization": "Bearer cp_acme_key"}
    served = []
    for app in (create_app(agent, keys=keys), create_app(None, keys=keys, store=store)):  # (the second: no agent)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            body = (await c.get("/v1/sessions/alice-1/facts", headers=auth)).json()
            assert body["user_id"] == "alice"
            document = (await c.get("/openapi.json")).json()  # the answer is the one the document describes
            jsonschema.validate(body, {**document["components"]["schemas"]["FactList"],
                                       "components": document["components"]})
            served.append(body["memories"])
            assert (await c.get("/v1/sessions/nope/facts", headers=auth)).status_code == 404
            assert (await c.get("/v1/sessions/alice-1/facts")).status_code == 401
    [[memory], []] = served
    [fact] = memory["facts"]
    assert (memory["source_id"], memory["collection"]) == ("facts", "facts")
    assert [(v["text"], v["valid_from"], v["valid_to"]) for v in fact["versions"]] == [
        ("Alice lives in Lisbon.", 100.0, 200.0), ("Alice lives in Porto.", 200.0, None)]
    assert [v["sources"] for v in fact["versions"]] == [[m.id for m in [*run.input, *run.messages]]
                                                        for run in (first, second)]

    # Another tenant's key: acme's session is absent to it, and its own session of that id and user shows
    # only its own facts (a fact's scope is tenant and user).
    keys.add("globex", "cp_globex_key")
    other = {"Authorization": "Bearer cp_globex_key"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(agent, keys=keys)),
                                 base_url="http://test") as c:
        assert (await c.get("/v1/sessions/alice-1/facts", headers=other)).status_code == 404
        theirs = await agent.session("alice-1", tenant="globex")
        set_user_id(theirs, "alice")
        await store.save_session(theirs)
        answer = (await c.get("/v1/sessions/alice-1/facts", headers=other)).json()
        assert answer == {"user_id": "alice", "memories": [{"source_id": "facts", "collection": "facts", "facts": []}]}
