"""A program's first run with Microsoft Agent Framework, for ``bench/import_bench.py``: import, build, run once.

In memory (a session with MAF's default in-memory history), against a fake chat client with the
shipped clients' layers (as ``peer_maf.py`` has it) that answers at once: the same program as
``first_run_contextpipe.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from agent_framework import Agent, BaseChatClient, ChatMiddlewareLayer, ChatResponse, FunctionInvocationLayer, Message
from agent_framework.observability import ChatTelemetryLayer


class FakeChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    OTEL_PROVIDER_NAME = "fake"

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, options: dict[str, Any],
                            **kwargs: Any) -> Awaitable[ChatResponse]:
        return self._respond()

    async def _respond(self) -> ChatResponse:
        return ChatResponse(messages=Message("assistant", ["Hello."]))


async def main() -> None:
    agent = Agent(client=FakeChatClient())
    session = agent.create_session(session_id="s")
    result = await agent.run("Hi", session=session)
    assert result.text == "Hello.", result.text


asyncio.run(main())
