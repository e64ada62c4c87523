"""Microsoft Agent Framework: FileHistoryProvider (one JSON Lines file per session) with per-service-call
history persistence, and a fake chat client with the shipped clients' layers (as in the MAF baseline)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
import warnings
from collections.abc import Awaitable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LOOP_STEPS, STARTED, args, emit, history_texts, lookup_value, time_runs

warnings.filterwarnings("ignore")

from agent_framework import (  # noqa: E402
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    Content,
    FileHistoryProvider,
    FunctionInvocationLayer,
    Message,
    tool,
)
from agent_framework.observability import ChatTelemetryLayer  # noqa: E402


class FakeChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, ChatTelemetryLayer, BaseChatClient):
    OTEL_PROVIDER_NAME = "fake"

    def __init__(self, tool_calls: int = 0) -> None:
        super().__init__()
        self.tool_calls = tool_calls
        self.index = 0
        self.last_len = 0

    def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, options: dict[str, Any],
                            **kwargs: Any) -> Awaitable[ChatResponse]:
        self.last_len = len(messages)
        i = self.index
        self.index += 1
        return self._respond(i)

    async def _respond(self, i: int) -> ChatResponse:
        if i < self.tool_calls:
            call = Content.from_function_call(call_id=f"call_{i}", name="lookup", arguments=f'{{"key": "k{i}"}}')
            return ChatResponse(messages=Message("assistant", [call]))
        return ChatResponse(messages=Message("assistant", [f"ok {i}"]))


@tool(approval_mode="never_require")
def lookup(key: str) -> str:
    """Look up a value by key."""
    return lookup_value(key)


async def main() -> None:
    workload, n, samples, workdir = args()
    folder = os.path.join(workdir, "maf-history")
    shutil.rmtree(folder, ignore_errors=True)
    if workload in ("run", "cold"):
        fixture = os.path.join(workdir, f"maf-fixture-{n}")
        if not os.path.exists(fixture):  # noqa: ASYNC240 - a one-task script
            provider = FileHistoryProvider(fixture + ".tmp")
            await provider.save_messages("s", [Message(role, [text]) for role, text in history_texts(n)])
            os.replace(fixture + ".tmp", fixture)
        shutil.copytree(fixture, folder)
        client = FakeChatClient()
        agent = Agent(client=client, context_providers=[FileHistoryProvider(folder)],
                      require_per_service_call_history_persistence=True)
        session = agent.create_session(session_id="s")
        if workload == "cold":
            await agent.run("hi", session=session)
            emit([(time.perf_counter() - STARTED) * 1000], sent=client.last_len)
            return
        await agent.run("hi", session=session)
        inputs = (f"question {k}" for k in range(10**6))
        out = await time_runs(lambda: agent.run(next(inputs), session=session), samples)
        assert client.last_len >= n + 1, client.last_len
        emit(out, sent=client.last_len)
    elif workload == "loop":
        client = FakeChatClient(LOOP_STEPS)
        provider = FileHistoryProvider(folder)
        agent = Agent(client=client, tools=[lookup], context_providers=[provider],
                      require_per_service_call_history_persistence=True)
        counter = iter(range(10**6))

        async def op() -> None:
            client.index = 0
            session = agent.create_session(session_id=f"loop-{next(counter)}")
            result = await agent.run("hi", session=session)
            assert result.text.startswith("ok"), result.text

        out = await time_runs(op, samples)
        emit(out, stored=len(await provider.get_messages("loop-0")))


asyncio.run(main())
