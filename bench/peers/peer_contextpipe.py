"""contextpipe on SQLiteStore (synchronous=FULL by default), History, per-step persistence (the default)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LOOP_STEPS, STARTED, args, emit, history_texts, lookup_value, time_runs

from contextpipe import Agent, Message, TextPart, tool
from contextpipe.messages import FunctionCall
from contextpipe.models import ModelResponse
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore

# FULL (fsync on every commit: durable through power loss) unless the orchestrator asks for NORMAL
# (durable through a process crash, like the peers' defaults).
SYNCHRONOUS = "NORMAL" if os.environ.get("CONTEXTPIPE_BENCH_SYNCHRONOUS") == "NORMAL" else "FULL"


class FakeModel:
    name = "fake"

    def __init__(self, tool_calls: int = 0) -> None:
        self.tool_calls = tool_calls
        self.index = 0
        self.last_len = 0

    async def complete(self, request: object) -> ModelResponse:
        self.last_len = len(request.messages)  # type: ignore[attr-defined]
        i = self.index
        self.index += 1
        if i < self.tool_calls:
            return ModelResponse([Message("assistant", (FunctionCall(f"call_{i}", "lookup", f'{{"key": "k{i}"}}'),))],
                                 finish_reason="tool_calls")
        return ModelResponse([Message.assistant(f"ok {i}")], finish_reason="stop")

    async def stream(self, request: object):  # type: ignore[no-untyped-def]
        raise NotImplementedError
        yield


@tool(run_in_thread=False)
def lookup(key: str) -> str:
    """Look up a value by key."""
    return lookup_value(key)


async def main() -> None:
    workload, n, samples, workdir = args()
    path = os.path.join(workdir, "contextpipe.db")
    if workload in ("run", "cold"):
        fixture = os.path.join(workdir, f"contextpipe-fixture-{n}.db")
        if not os.path.exists(fixture):  # noqa: ASYNC240 - a one-task script
            store = SQLiteStore(fixture + ".tmp")
            msgs = [Message(role, (TextPart(text),)) for role, text in history_texts(n)]
            await store.append("default", "s", msgs)
            await store.close()
            os.replace(fixture + ".tmp", fixture)
        import shutil

        shutil.copyfile(fixture, path)
        store = SQLiteStore(path, synchronous=SYNCHRONOUS)
        model = FakeModel()
        agent = Agent(model, providers=[History(store)])
        if workload == "cold":
            session = await agent.session("s")
            await agent.run("hi", session=session)
            emit([(time.perf_counter() - STARTED) * 1000], sent=model.last_len)
            return
        session = await agent.session("s")
        await agent.run("hi", session=session)
        inputs = (f"question {k}" for k in range(10**6))
        out = await time_runs(lambda: agent.run(next(inputs), session=session), samples)
        assert model.last_len >= n + 1
        emit(out, sent=model.last_len)
        await store.close()
    elif workload == "loop":
        store = SQLiteStore(path, synchronous=SYNCHRONOUS)
        model = FakeModel(LOOP_STEPS)
        agent = Agent(model, tools=[lookup], providers=[History(store)])
        counter = iter(range(10**6))

        async def op() -> None:
            model.index = 0
            session = await agent.session(f"loop-{next(counter)}")
            result = await agent.run("hi", session=session)
            assert result.text.startswith("ok")

        out = await time_runs(op, samples)
        stored = len((await store.load("default", "loop-0")).messages)
        emit(out, stored=stored)
        await store.close()


asyncio.run(main())
