"""Fixtures for the server tests: a model the test releases step by step, keys, a live uvicorn server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2 as httpx
import uvicorn
from pydantic import BaseModel, ConfigDict

from contextpipe import Agent, Durability, Message, ProviderState, TextDelta, ToolContext, Usage, tool
from contextpipe.models import ModelRequest, ModelResponse, ReasoningDelta, ResponseComplete
from contextpipe.providers import History
from contextpipe.serve import ApiKeys, ServeSettings, create_app
from contextpipe.serve._agui import STATE_KEY
from contextpipe.stores import MemoryStore, SessionStore

KEYS = {"acme": "cp_acme_key", "globex": "cp_globex_key"}


def keys() -> ApiKeys:
    api_keys = ApiKeys()
    for tenant, key in KEYS.items():
        api_keys.add(tenant, key)
    return api_keys


def auth(tenant: str = "acme") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


class GateModel:
    """Answers "reply N to TEXT"; while `gated`, each call waits for `release` (the test's progress signal)."""

    name = "gate"

    def __init__(self, gated: bool = False) -> None:
        self.gated = gated
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        number = self.calls
        if self.gated:
            self.entered.set()
            await self.release.wait()
        last = next(m.text for m in reversed(request.messages) if m.role == "user")
        return ModelResponse([Message.assistant(f"reply {number} to {last}")], Usage(10, 4), "stop", self.name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        response = await self.complete(request)
        for word in response.text.split(" "):
            yield TextDelta(word + " ")
        yield ResponseComplete(response)


class ThinkingModel(GateModel):
    """GateModel that streams some reasoning ("Let me think.") before its answer."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        yield ReasoningDelta("Let me ")
        yield ReasoningDelta("think.")
        async for event in super().stream(request):
            yield event


def make_app(store: SessionStore, model: Any, **settings: Any) -> Any:
    agent = Agent(model, providers=[History(store)], durability=Durability(store_traces=True), name="test")
    return create_app(agent, keys=keys(), settings=ServeSettings(**settings))


class Todos(BaseModel):
    """A tool's view of the client's state: the keys it does not name are kept (extra="allow")."""

    model_config = ConfigDict(extra="allow")
    items: list[str] = []


TODOS = ProviderState(STATE_KEY, Todos)


@tool
def add_todo(ctx: ToolContext, item: str) -> str:
    """Add an item to the user's list."""
    todos = ctx.state(TODOS)
    todos.items.append(item)
    return f"added {item} to {len(todos.items) - 1} items"


def agent_app(model: Any, store: SessionStore | None = None) -> Any:
    """The app of an agent with a `History` in `store` and the `add_todo` tool (it changes the AG-UI state)."""
    store = store or MemoryStore()
    agent = Agent(model, tools=[add_todo], providers=[History(store)], durability=Durability(store_traces=True))
    return create_app(agent, keys=keys())


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """Run `app` under a real uvicorn server on 127.0.0.1 (in this event loop); yield its URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
