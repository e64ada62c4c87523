"""The chat's /undo, /retry, /fork and /history, driven through the prompt, checked against the stored log and view."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contextpipe import Agent
from contextpipe.providers import History
from contextpipe.rewind import read_log
from contextpipe.stores import MemoryStore, SessionStore
from contextpipe.stores.sqlite import SQLiteStore
from contextpipe.testing import ScriptedModel
from helpers import chat


def texts(agent: Agent, session: str) -> tuple[list[str], list[tuple[str, bool]]]:
    """The session's view (role: text) and its raw log (role: text, rewound), as stored."""
    async def read() -> tuple[list[str], list[tuple[str, bool]]]:
        view = await agent.history(await agent.session(session))
        log = await read_log(agent.store, "default", session)
        return [f"{m.role}: {m.text}" for m in view], [(f"{e.message.role}: {e.message.text}", e.rewound) for e in log]
    return asyncio.run(read())


def agent_on(store: SessionStore, replies: list[str]) -> Agent:
    return Agent(ScriptedModel(replies), providers=[History(store)], store=store)


def test_undo_takes_back_the_last_exchange_and_the_next_message_follows_the_view() -> None:
    model = ScriptedModel(["Paris.", "Rome.", "Madrid."])
    store = MemoryStore()
    agent = Agent(model, providers=[History(store)], store=store)
    shown, errors, _ = chat(agent, ["Capital of France?", "Capital of Italy?", "/undo", "Capital of Spain?"])
    assert "undone: your message 'Capital of Italy?' and what followed it" in "\n".join(shown), errors
    view, log = texts(agent, "s")
    assert view == ["user: Capital of France?", "assistant: Paris.", "user: Capital of Spain?", "assistant: Madrid."]
    assert [(t, r) for t, r in log if r and not t.startswith("system")] == [
        ("user: Capital of Italy?", True), ("assistant: Rome.", True)]  # kept in the log, rewound
    # The model never saw the undone exchange in the call after it.
    assert [m.text for m in model.requests[-1].messages] == ["Capital of France?", "Paris.", "Capital of Spain?"]


def test_retry_answers_the_last_message_again_and_the_first_answer_is_rewound(tmp_path: object) -> None:
    async def make() -> SQLiteStore:
        return SQLiteStore(f"{tmp_path}/chat.db")
    store = asyncio.run(make())
    model = ScriptedModel(["A dull answer.", "A better answer."])
    agent = Agent(model, providers=[History(store)], store=store)
    shown, errors, _ = chat(agent, ["Tell me a joke.", "/retry"])
    assert shown[-1] == "assistant> A better answer.", (shown, errors)
    view, log = texts(agent, "s")
    assert view == ["user: Tell me a joke.", "assistant: A better answer."]
    assert ("assistant: A dull answer.", True) in log and ("user: Tell me a joke.", False) in log
    assert [m.text for m in model.requests[-1].messages] == ["Tell me a joke."]


def test_fork_goes_on_in_a_new_session_and_leaves_the_old_one_as_it_was() -> None:
    store = MemoryStore()
    agent = agent_on(store, ["Hi.", "In the fork.", "In the second fork."])
    shown, errors, last = chat(agent, ["Hello", "/fork", "Go on", "/fork branch-b", "And on"])
    assert last == "branch-b"
    assert "forked 's' at message 2 into 's-fork-1'; now chatting in 's-fork-1' ('s' stays as it was)" in shown, errors
    assert "forked 's-fork-1' at message 4 into 'branch-b'" in "\n".join(shown)
    assert texts(agent, "s")[0] == ["user: Hello", "assistant: Hi."]
    assert texts(agent, "s-fork-1")[0] == ["user: Hello", "assistant: Hi.", "user: Go on", "assistant: In the fork."]
    assert texts(agent, "branch-b")[0][-2:] == ["user: And on", "assistant: In the second fork."]
    # Forking into a session that has messages is refused, and the chat stays where it was.
    shown, errors, last = chat(agent, ["/fork s"], session="branch-b")
    assert last == "branch-b" and "cannot fork into default/s: it has messages already" in errors


@pytest.mark.parametrize("command", ["/undo", "/retry", "/fork"])
def test_nothing_to_undo_retry_or_fork_says_so_and_writes_nothing(command: str) -> None:
    store = MemoryStore()
    agent = agent_on(store, [])
    _, errors, last = chat(agent, [command])
    what = command.removeprefix("/")
    assert f"nothing to {what}:" in errors and last == "s"
    assert texts(agent, "s") == ([], [])
    # After undoing the only exchange there is nothing left to undo, and nothing more is written.
    agent = agent_on(store, ["Hi."])
    _, errors, _ = chat(agent, ["Hello", "/undo", "/undo"])
    assert errors.count("nothing to undo: the session holds no message of yours") == 1
    assert texts(agent, "s")[0] == [] and sum(1 for t, _ in texts(agent, "s")[1] if t.startswith("system")) == 1


def test_history_shows_the_view_and_marks_where_rewound_messages_are_left_out() -> None:
    store = MemoryStore()
    agent = agent_on(store, ["One.", "Two.", "Three."])
    shown, _, _ = chat(agent, ["First", "Second", "/undo", "Third", "/history"])
    history = [line.strip() for line in shown[shown.index("you> /history") + 1:]]
    assert history == ["1 user      First", "2 assistant One.",
                       "… 3-5 rewound (undone or retried; not seen by the model)", "6 user      Third",
                       "7 assistant Three."]
    assert not any("[rewound:" in line for line in shown)  # the marker is not shown as a system message


def test_sessions_show_marks_rewound_messages_and_rewind_markers(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"

    async def write() -> None:
        async with SQLiteStore(db) as store:
            agent = agent_on(store, ["A dull answer.", "A better answer."])
            session = await agent.session("s")
            await agent.run("Tell me a joke.", session=session)
            await agent.regenerate("s")

    asyncio.run(write())
    cli = [sys.executable, "-m", "contextpipe.cli", "sessions", "show", "s", "--db", str(db)]
    shown = subprocess.run(cli, capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"})
    assert [" ".join(line.split()) for line in shown.stdout.splitlines()] == [
        "1 user Tell me a joke.", "2 assistant (rewound) A dull answer.",
        "3 rewind the messages after 1 up to here are rewound (undone or retried; not seen by the model)",
        "4 assistant A better answer."]
    listed = json.loads(subprocess.run([*cli, "--json", "--last", "3"], capture_output=True, text=True,
                                       check=True).stdout)["messages"]
    assert [(e["seq"], e.get("rewound", False), e.get("rewind_to")) for e in listed] == [
        (2, True, None), (3, True, 1), (4, False, None)]
