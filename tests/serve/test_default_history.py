"""Serving an agent given no history provider: the conversation is kept, and the server says which history."""

from __future__ import annotations

from pathlib import Path

from contextpipe import Agent, Durability
from contextpipe.providers import History
from contextpipe.serve import ServeSettings, create_app
from contextpipe.serve._cli import history_line
from contextpipe.stores import MemoryStore, SQLiteStore

from .conftest import GateModel, auth, client, keys


async def test_a_served_agent_with_no_history_provider_keeps_the_conversation(tmp_path: Path) -> None:
    """Seed 004: "RawAgent dapat menambahkan InMemoryHistoryProvider("memory") secara otomatis": served over
    HTTP, an agent given only a store still remembers each session, and says so in /v1/info and the traces."""
    model = GateModel()
    agent = Agent(model, store=SQLiteStore(tmp_path / "served.db"), durability=Durability(store_traces=True))
    app = create_app(agent, keys=keys(), settings=ServeSettings(), close_store=True)
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "no-history"}, headers=auth())
        for text in ("hello", "again"):
            reply = await c.post("/v1/sessions/no-history/runs", json={"input": text, "traces": True},
                                 headers=auth())
            assert reply.status_code == 200, reply.text
        result = reply.json()
        messages = (await c.get("/v1/sessions/no-history/messages", headers=auth())).json()["messages"]
        info = (await c.get("/v1/info", headers=auth())).json()
    assert result["traces"][0]["history"] == "default-history"
    assert result["traces"][0]["tokens_by_source"]["history:default-history"] > 0
    assert len(messages) == 4
    assert info["agent"]["providers"] == [{"source_id": "default-history", "kind": "history"}]
    await agent.store.close()


def test_the_server_says_which_history_it_keeps() -> None:
    """What ``contextpipe serve`` prints at start about the agent's history."""
    assert history_line(Agent(GateModel())) == (
        "history: the agent's default ('default-history', in the agent's memory store, lost when the server stops)")
    store = MemoryStore()
    assert history_line(Agent(GateModel(), providers=[History(store)])) == "history: History('history')"
    assert history_line(Agent(GateModel(), default_history=False)).startswith("history: none")
