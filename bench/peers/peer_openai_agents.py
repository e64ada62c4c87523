"""OpenAI Agents SDK: Runner with SQLiteSession (a file), a fake Model that answers at once."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agents import Agent, ModelSettings, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from common import LOOP_STEPS, STARTED, args, emit, history_texts, lookup_value, time_runs
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

set_tracing_disabled(True)


class FakeModel(Model):
    def __init__(self, tool_calls: int = 0) -> None:
        self.tool_calls = tool_calls
        self.index = 0
        self.last_len = 0

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        self.last_len = len(input) if isinstance(input, list) else 1
        i = self.index
        self.index += 1
        if i < self.tool_calls:
            item: Any = ResponseFunctionToolCall(type="function_call", call_id=f"call_{i}", name="lookup",
                                                 arguments=f'{{"key": "k{i}"}}', id=f"fc_{i}", status="completed")
        else:
            text = ResponseOutputText(type="output_text", text=f"ok {i}", annotations=[])
            item = ResponseOutputMessage(id=f"msg_{i}", type="message", role="assistant", status="completed",
                                         content=[text])
        return ModelResponse(output=[item], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


@function_tool
def lookup(key: str) -> str:
    """Look up a value by key."""
    return lookup_value(key)


async def main() -> None:
    workload, n, samples, workdir = args()
    path = os.path.join(workdir, "openai-agents.db")
    if workload in ("run", "cold"):
        fixture = os.path.join(workdir, f"openai-agents-fixture-{n}.db")
        if not os.path.exists(fixture):  # noqa: ASYNC240 - a one-task script
            session = SQLiteSession("s", fixture + ".tmp")
            await session.add_items([{"role": role, "content": text} for role, text in history_texts(n)])
            session.close()
            os.replace(fixture + ".tmp", fixture)
        shutil.copyfile(fixture, path)
        model = FakeModel()
        agent = Agent(name="bench", model=model, model_settings=ModelSettings())
        session = SQLiteSession("s", path)
        if workload == "cold":
            await Runner.run(agent, "hi", session=session)
            emit([(time.perf_counter() - STARTED) * 1000], sent=model.last_len)
            return
        await Runner.run(agent, "hi", session=session)
        inputs = (f"question {k}" for k in range(10**6))
        out = await time_runs(lambda: Runner.run(agent, next(inputs), session=session), samples)
        assert model.last_len >= n + 1
        emit(out, sent=model.last_len)
    elif workload == "loop":
        model = FakeModel(LOOP_STEPS)
        agent = Agent(name="bench", model=model, tools=[lookup])
        counter = iter(range(10**6))
        last: list[SQLiteSession] = []

        async def op() -> None:
            model.index = 0
            session = SQLiteSession(f"loop-{next(counter)}", path)
            last.append(session)
            result = await Runner.run(agent, "hi", session=session, max_turns=LOOP_STEPS + 5)
            assert str(result.final_output).startswith("ok")

        out = await time_runs(op, samples)
        emit(out, stored=len(await last[0].get_items()))


asyncio.run(main())
