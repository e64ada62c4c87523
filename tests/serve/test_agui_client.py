"""The official AG-UI TypeScript client (``@ag-ui/client`` from npm) against a real server.

Needs node, and ``npm ci`` in tests/serve/agui_client (.ci/run does it).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from contextpipe.stores import MemoryStore

from .conftest import KEYS, GateModel, make_app, serving

CLIENT = Path(__file__).parent / "agui_client"
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="NO NODE: the official AG-UI client test runs under node, not installed")
async def test_the_official_client_resends_its_history_and_the_session_stores_it_once() -> None:
    assert NODE is not None
    assert (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir(), \
        f"the AG-UI client is not installed: run `npm ci` in {CLIENT}"
    model = GateModel()
    store = MemoryStore()
    async with serving(make_app(store, model)) as url:
        node = await asyncio.create_subprocess_exec(NODE, "conversation.mjs", url, KEYS["acme"], "t-node",
                                                    cwd=CLIENT, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await node.communicate()
    assert node.returncode == 0, err.decode()
    seen = json.loads(out)
    answers = [[text.strip() for text in turn] for turn in seen["turns"]]
    assert answers == [["reply 1 to one"], ["reply 2 to two"], ["reply 2 to two"]]
    assert [role for role, _ in seen["messages"]] == ["user", "assistant", "user", "assistant", "assistant"]
    stored = (await store.load("acme", "t-node")).messages
    assert [(m.role, m.text) for m in stored] == [("user", "one"), ("assistant", "reply 1 to one"),
                                                   ("user", "two"), ("assistant", "reply 2 to two")]
    assert model.calls == 2
