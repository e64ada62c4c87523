"""A program's first run with contextpipe, for ``bench/import_bench.py``: import, build an agent, run it once.

In memory (the agent's own `MemoryStore`, a session, the default history), against a `ScriptedModel`
that answers at once, so the process's wall time is the framework's cost from start to first answer.
"""

from __future__ import annotations

import asyncio

from contextpipe import Agent
from contextpipe.testing import ScriptedModel


async def main() -> None:
    agent = Agent(ScriptedModel(["Hello."]))
    session = await agent.session("s")
    result = await agent.run("Hi", session=session)
    assert result.text == "Hello.", result.text


asyncio.run(main())
