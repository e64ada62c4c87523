"""An agent for the server process tests: its model waits for a gate file the test creates.

``$GATE_DIR/entered`` appears when the model is called; the call returns once ``$GATE_DIR/open``
exists. Sessions go to ``$GATE_DIR/sessions.db``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from contextpipe import Agent, Message, TextDelta, Usage
from contextpipe.models import ModelRequest, ModelResponse, ResponseComplete
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore

GATE = Path(os.environ.get("GATE_DIR", "."))


class GateFileModel:
    name = "gate-file"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        (GATE / "entered").touch()
        while not (GATE / "open").exists():  # noqa: ASYNC110 - the signal comes from another process
            await asyncio.sleep(0.02)
        last = next(m.text for m in reversed(request.messages) if m.role == "user")
        return ModelResponse([Message.assistant(f"reply to {last}")], Usage(5, 3), "stop", self.name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        response = await self.complete(request)
        yield TextDelta(response.text)
        yield ResponseComplete(response)


agent = Agent(GateFileModel(), providers=[History(SQLiteStore(GATE / "sessions.db"))])
