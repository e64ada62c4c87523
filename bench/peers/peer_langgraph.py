"""LangGraph: a model node and a tool node in a StateGraph over MessagesState, AsyncSqliteSaver
(langgraph-checkpoint-sqlite, a file), durability="sync" so every step is checkpointed before the next."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import LOOP_STEPS, STARTED, args, emit, history_texts, lookup_value, time_runs
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph


class FakeModel:
    def __init__(self, tool_calls: int = 0) -> None:
        self.tool_calls = tool_calls
        self.index = 0
        self.last_len = 0

    async def node(self, state: MessagesState) -> dict[str, Any]:
        self.last_len = len(state["messages"])
        i = self.index
        self.index += 1
        if i < self.tool_calls:
            call = {"name": "lookup", "args": {"key": f"k{i}"}, "id": f"call_{i}", "type": "tool_call"}
            return {"messages": [AIMessage(content="", tool_calls=[call])]}
        return {"messages": [AIMessage(content=f"ok {i}")]}


async def tools(state: MessagesState) -> dict[str, Any]:
    last = state["messages"][-1]
    return {"messages": [ToolMessage(content=lookup_value(c["args"]["key"]), tool_call_id=c["id"])
                         for c in last.tool_calls]}  # type: ignore[attr-defined]


def route(state: MessagesState) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END


def build(model: FakeModel) -> StateGraph:
    graph = StateGraph(MessagesState)
    graph.add_node("model", model.node)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph


def as_message(role: str, text: str) -> Any:
    return HumanMessage(content=text) if role == "user" else AIMessage(content=text)


async def main() -> None:
    workload, n, samples, workdir = args()
    path = os.path.join(workdir, "langgraph.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):  # noqa: ASYNC240 - a one-task script
            os.remove(path + suffix)
    if workload in ("run", "cold"):
        fixture = os.path.join(workdir, f"langgraph-fixture-{n}.db")
        if not os.path.exists(fixture):  # noqa: ASYNC240 - a one-task script
            async with AsyncSqliteSaver.from_conn_string(fixture + ".tmp") as saver:
                app = build(FakeModel()).compile(checkpointer=saver)
                await app.aupdate_state({"configurable": {"thread_id": "s"}},
                                        {"messages": [as_message(r, t) for r, t in history_texts(n)]})
            os.replace(fixture + ".tmp", fixture)
        shutil.copyfile(fixture, path)
        model = FakeModel()
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            app = build(model).compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "s"}}
            if workload == "cold":
                await app.ainvoke({"messages": [HumanMessage("hi")]}, config, durability="sync")
                emit([(time.perf_counter() - STARTED) * 1000], sent=model.last_len)
                return
            await app.ainvoke({"messages": [HumanMessage("hi")]}, config, durability="sync")
            inputs = (f"question {k}" for k in range(10**6))
            out = await time_runs(lambda: app.ainvoke({"messages": [HumanMessage(next(inputs))]}, config,
                                                      durability="sync"), samples)
            assert model.last_len >= n + 1, model.last_len
            emit(out, sent=model.last_len)
    elif workload == "loop":
        model = FakeModel(LOOP_STEPS)
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            app = build(model).compile(checkpointer=saver)
            counter = iter(range(10**6))

            async def op() -> None:
                model.index = 0
                config = {"configurable": {"thread_id": f"loop-{next(counter)}"}, "recursion_limit": 100}
                result = await app.ainvoke({"messages": [HumanMessage("hi")]}, config, durability="sync")
                assert result["messages"][-1].content.startswith("ok")

            out = await time_runs(op, samples)
            state = await app.aget_state({"configurable": {"thread_id": "loop-0"}})
            emit(out, stored=len(state.values["messages"]))


asyncio.run(main())
