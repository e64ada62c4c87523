"""The official AG-UI TypeScript client (``@ag-ui/client`` from npm) against a real server.

Needs node, and ``npm ci`` in tests/serve/agui_client (scripts/test.sh does it when npm is there).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from contextpipe.rewind import is_marker, read_log
from contextpipe.serve._agui import STATE_KEY
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, tool_call

from .conftest import KEYS, GateModel, ThinkingModel, agent_app, make_app, serving

CLIENT = Path(__file__).parent / "agui_client"
NODE = shutil.which("node")
HANG = 120.0
"""A hang guard only: the client's exit is the progress signal."""


async def run_node(script: str, url: str, thread: str) -> tuple[bytes, bytes]:
    """Run `script` of the client against the server at `url`, on `thread`; return its output and its warnings."""
    assert NODE is not None
    assert (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir(), \
        f"the AG-UI client is not installed: run `npm ci` in {CLIENT}"
    node = await asyncio.create_subprocess_exec(NODE, script, url, KEYS["acme"], thread, cwd=CLIENT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(node.communicate(), HANG)
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
    assert node.returncode == 0, err.decode()
    return out, err


@pytest.mark.skipif(NODE is None and not os.environ.get("CI"),
                    reason="NO NODE: the official AG-UI client test runs under node, not installed")
async def test_the_official_client_resends_its_history_and_the_session_stores_it_once() -> None:
    assert NODE is not None, "CI must run every test: install node (and npm) for the official AG-UI client's test"
    model = ThinkingModel()
    store = MemoryStore()
    async with serving(make_app(store, model)) as url:
        out, err = await run_node("conversation.mjs", url, "t-node")
    # The client only warns when it drops an event it does not know or a field the protocol lacks.
    assert err == b"", err.decode()
    seen = json.loads(out)
    answers = [[text.strip() for text in turn] for turn in seen["turns"]]
    assert answers == [["Let me think.", "reply 1 to one"], ["Let me think.", "reply 2 to two"], ["reply 2 to two"]]
    assert [role for role, _ in seen["messages"]] == ["user", "reasoning", "assistant", "user", "reasoning",
                                                      "assistant", "assistant"]
    stored = (await store.load("acme", "t-node")).messages
    assert [(m.role, m.text) for m in stored] == [("user", "one"), ("assistant", "reply 1 to one"),
                                                   ("user", "two"), ("assistant", "reply 2 to two")]
    assert model.calls == 2


@pytest.mark.skipif(NODE is None and not os.environ.get("CI"),
                    reason="NO NODE: the official AG-UI client test runs under node, not installed")
async def test_the_official_client_applies_the_state_snapshot_and_the_delta_a_tool_made() -> None:
    assert NODE is not None, "CI must run every test: install node (and npm) for the official AG-UI client's test"
    model = ScriptedModel([tool_call("add_todo", item="eggs"), "Added eggs.", "Two items."])
    store = MemoryStore()
    async with serving(agent_app(model, store)) as url:
        out, err = await run_node("state.mjs", url, "t-state")
    assert err == b"", err.decode()  # a patch the client cannot apply, or an event its schema refuses, is a warning
    first, second = json.loads(out)
    start, changed = {"items": ["milk"], "theme": "dark"}, {"items": ["milk", "eggs"], "theme": "dark"}
    assert first == {"applied": [["STATE_SNAPSHOT", start],
                                 ["STATE_DELTA", [{"op": "replace", "path": "/items", "value": ["milk", "eggs"]}]]],
                     "state": changed}
    assert second == {"applied": [["STATE_SNAPSHOT", changed]], "state": changed}
    assert (await store.get_session("acme", "t-state")).state[STATE_KEY] == changed  # type: ignore[union-attr]


@pytest.mark.skipif(NODE is None and not os.environ.get("CI"),
                    reason="NO NODE: the official AG-UI client test runs under node, not installed")
async def test_the_official_client_runs_a_front_end_tool_and_the_next_run_continues_with_its_result() -> None:
    assert NODE is not None, "CI must run every test: install node (and npm) for the official AG-UI client's test"
    model = ScriptedModel([tool_call("user_location", precise=True), lambda request: "You are in " + next(
        r.result for m in request.messages for r in m.function_results) + "."])
    store = MemoryStore()
    async with serving(agent_app(model, store)) as url:
        out, err = await run_node("frontend_tools.mjs", url, "t-tools")
    assert err == b"", err.decode()  # an event the client's schema refuses, or one out of order, is a warning
    seen = json.loads(out)
    first, second = seen["runs"]
    assert first["events"] == ["RUN_STARTED", "STATE_SNAPSHOT", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END",
                               "RUN_FINISHED"]
    assert first["finished"]["result"]["stop_reason"] == "client_tool_calls"
    assert first["finished"]["pendingToolCallIds"] == ["call_1"]
    [call_message] = first["newMessages"]
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in call_message["toolCalls"]] == [("call_1", "user_location", {"precise": True})]
    assert "TOOL_CALL_START" not in second["events"] and second["events"][-1] == "RUN_FINISHED"
    assert second["finished"]["result"] == {"text": "You are in Suzhou, 31.3N 120.6E.", "stop_reason": "completed"}
    assert [m[0] for m in seen["messages"]] == ["user", "assistant", "tool", "assistant"]
    stored = (await store.load("acme", "t-tools")).messages
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]  # the result once, no duplicate
    assert stored[1].id == call_message["id"]  # the client's assistant message is the stored one (parentMessageId)
    assert stored[2].function_results[0].result == "Suzhou, 31.3N 120.6E"
    model.assert_done()


@pytest.mark.skipif(NODE is None and not os.environ.get("CI"),
                    reason="NO NODE: the official AG-UI client test runs under node, not installed")
async def test_the_official_client_regenerates_and_edits_and_the_log_keeps_the_old_answers_rewound() -> None:
    assert NODE is not None, "CI must run every test: install node (and npm) for the official AG-UI client's test"
    model = GateModel()
    store = MemoryStore()
    async with serving(make_app(store, model, agui_rewinds=True)) as url:
        out, err = await run_node("regenerate.mjs", url, "t-regen")
    assert err == b"", err.decode()
    seen = json.loads(out)
    assert [[text.strip() for text in turn] for turn in seen["turns"]] == [
        ["reply 1 to one"], ["reply 2 to two"], ["reply 3 to two"], ["reply 4 to two, edited"]]
    assert [(role, text.strip()) for role, text in seen["messages"]] == [
        ("user", "one"), ("assistant", "reply 1 to one"), ("user", "two, edited"),
        ("assistant", "reply 4 to two, edited")]
    log = await read_log(store, "acme", "t-regen")
    assert [(e.message.role, e.message.text, e.rewound) for e in log if not is_marker(e.message)] == [
        ("user", "one", False), ("assistant", "reply 1 to one", False), ("user", "two", True),
        ("assistant", "reply 2 to two", True), ("assistant", "reply 3 to two", True),
        ("user", "two, edited", False), ("assistant", "reply 4 to two, edited", False)]
    assert [e.message.metadata["contextpipe.rewind"]["to"] for e in log if is_marker(e.message)] == [3, 2]
    assert model.calls == 4
