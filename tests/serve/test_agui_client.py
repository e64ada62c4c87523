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

from contextpipe.stores import MemoryStore

from .conftest import KEYS, ThinkingModel, make_app, serving

CLIENT = Path(__file__).parent / "agui_client"
NODE = shutil.which("node")
HANG = 120.0
"""A hang guard only: the client's exit is the progress signal."""


@pytest.mark.skipif(NODE is None and not os.environ.get("CI"),
                    reason="NO NODE: the official AG-UI client test runs under node, not installed")
async def test_the_official_client_resends_its_history_and_the_session_stores_it_once() -> None:
    assert NODE is not None, "CI must run every test: install node (and npm) for the official AG-UI client's test"
    assert (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir(), \
        f"the AG-UI client is not installed: run `npm ci` in {CLIENT}"
    model = ThinkingModel()
    store = MemoryStore()
    async with serving(make_app(store, model)) as url:
        node = await asyncio.create_subprocess_exec(NODE, "conversation.mjs", url, KEYS["acme"], "t-node",
                                                    cwd=CLIENT, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(node.communicate(), HANG)
        finally:
            if node.returncode is None:
                node.kill()
                await node.wait()
    assert node.returncode == 0, err.decode()
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
