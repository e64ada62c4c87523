"""AG-UI regenerate and edit: a resent history that drops the thread's last turn rewinds it, and only then."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contextpipe import (
    Agent,
    ContextProvider,
    Durability,
    FunctionCall,
    Message,
    ProviderState,
    ToolContext,
    Usage,
    UsageError,
    tool,
)
from contextpipe._run.replay import IGNORED_METADATA, same_input
from contextpipe.models import ModelRequest, ModelResponse
from contextpipe.providers import History
from contextpipe.serve import ServeSettings, create_app
from contextpipe.serve._agui_rewind import INPUT_KEY
from contextpipe.session import AGUI_RUN_KEY
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore

from .conftest import GateModel, auth, client, keys, make_app
from .test_agui import answer, assistant, events, run, user

REWINDS = ServeSettings(agui_rewinds=True)
"""A server that takes regenerate and edit (off by default)."""


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SessionStore:
    return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "threads.db")


async def log(c: Any) -> list[tuple[str, str, bool]]:
    """The thread's whole log: each message's role, text and whether a rewind left it out of the view."""
    messages = (await c.get("/v1/sessions/t1/messages", headers=auth())).json()["messages"]
    return [(m["role"], m["parts"][0].get("text", "") if m["parts"] else "", m.get("rewound", False))
            for m in messages]


async def post(c: Any, run_id: str, messages: list[dict[str, Any]]) -> str:
    return answer(await c.post("/v1/ag-ui", json=run(run_id, messages), headers=auth()))


async def test_regenerate_answers_the_last_message_again_and_edit_replaces_it(store: SessionStore) -> None:
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        assert await post(c, "r1", [user("u1", "one")]) == "reply 1 to one"
        assert await post(c, "r2", [user("u1", "one")]) == "reply 2 to one"  # the answer dropped: regenerate
        follow_up = [user("u1", "one"), assistant("client-a", "reply 2 to one"), user("u2", "two")]
        assert await post(c, "r3", follow_up) == "reply 3 to two"  # an ordinary next turn
        edited = [*follow_up[:2], user("u2b", "two, edited")]  # the last message changed, what followed dropped
        assert await post(c, "r4", edited) == "reply 4 to two, edited"
        marker1, marker2 = "[rewound: messages after sequence 1 are left out]", \
            "[rewound: messages after sequence 4 are left out]"
        assert await log(c) == [
            ("user", "one", False), ("assistant", "reply 1 to one", True), ("system", marker1, True),
            ("assistant", "reply 2 to one", False), ("user", "two", True), ("assistant", "reply 3 to two", True),
            ("system", marker2, True), ("user", "two, edited", False), ("assistant", "reply 4 to two, edited", False)]
        # Each request again, its runId too, is a retry: answered from the view, not run again.
        assert await post(c, "r4", edited) == "reply 4 to two, edited"
        assert await post(c, "r5", [*edited, assistant("client-b", "reply 4 to two, edited")]) == \
            "reply 4 to two, edited"
        assert model.calls == 4


async def test_by_default_a_regenerate_or_edit_is_a_retry_or_a_next_turn(store: SessionStore) -> None:
    model = GateModel()
    async with client(make_app(store, model)) as c:
        assert await post(c, "r1", [user("u1", "one")]) == "reply 1 to one"
        assert await post(c, "r2", [user("u1", "one")]) == "reply 1 to one"  # answered from the log
        edited = [user("u1b", "uno")]
        assert await post(c, "r3", [user("u1", "one"), assistant("a", "x"), *edited]) == "reply 2 to uno"
        assert [gone for _, _, gone in await log(c)] == [False] * 4 and model.calls == 2


async def test_a_turn_this_thread_did_not_bring_is_never_rewound(store: SessionStore) -> None:
    # (a) A run over REST on the thread: the AG-UI client never saw it, so it is neither regenerated nor edited.
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        assert await post(c, "r1", [user("u1", "one")]) == "reply 1 to one"
        rest = await c.post("/v1/sessions/t1/runs", json={"input": "two"}, headers=auth())
        assert rest.status_code == 200, rest.text
        assert await post(c, "r2", [user("u1", "one")]) == "reply 1 to one"  # answered from the log, as before
        stale = [user("u1", "one"), assistant("client-a", "reply 1 to one"), user("u3", "three")]
        assert await post(c, "r3", stale) == "reply 3 to three"  # a next turn, as before
        assert await log(c) == [
            ("user", "one", False), ("assistant", "reply 1 to one", False), ("user", "two", False),
            ("assistant", "reply 2 to two", False), ("user", "three", False), ("assistant", "reply 3 to three", False)]


class FailingOnce:
    """Calls tool `note`, then fails once (the run errors after the tool ran), then answers."""

    name = "failing"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            return ModelResponse([Message("assistant", (FunctionCall("c1", "note", "{}"),))], Usage(1, 1),
                                 "tool_calls", self.name)
        if self.calls == 2:
            raise RuntimeError("the model is down")
        return ModelResponse([Message.assistant("done")], Usage(1, 1), "stop", self.name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        from contextpipe.models import ResponseComplete

        yield ResponseComplete(await self.complete(request))


async def test_a_retry_after_a_failed_run_resumes_it_and_keeps_its_tool_calls(store: SessionStore) -> None:
    # (b) The client resends the same history because the run failed: no regenerate, the executed call stays.
    notes: list[str] = []

    @tool
    def note() -> str:
        """Take a note."""
        notes.append("noted")
        return "noted"

    model = FailingOnce()
    agent = Agent(model, tools=[note], providers=[History(store)], durability=Durability(store_traces=True))
    async with client(create_app(agent, keys=keys(), settings=REWINDS)) as c:
        failed = events(await c.post("/v1/ag-ui", json=run("r1", [user("u1", "one")]), headers=auth()))
        assert failed[-1]["type"] == "RUN_ERROR"
        resumed = events(await c.post("/v1/ag-ui", json=run("r2", [user("u1", "one")]), headers=auth()))
        assert resumed[-1]["result"]["text"] == "done"
        assert [(role, rewound) for role, _, rewound in await log(c)] == [
            ("user", False), ("assistant", False), ("tool", False), ("assistant", False)]
        assert notes == ["noted"] and model.calls == 3


async def test_a_retry_of_a_regenerate_is_answered_from_the_view(store: SessionStore) -> None:
    # (c) The regenerate's own request again: the regenerated answer, never the rewound one.
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        await post(c, "r1", [user("u1", "one")])
        assert await post(c, "r2", [user("u1", "one")]) == "reply 2 to one"
        assert await post(c, "r2", [user("u1", "one")]) == "reply 2 to one"
        assert model.calls == 2
        # An edit, then the request from before it: its message was rewound, so it is refused, not replayed.
        await post(c, "r3", [user("u1", "one"), assistant("a", "reply 2 to one"), user("u2", "two")])
        await post(c, "r4", [user("u1", "one"), assistant("a", "reply 2 to one"), user("u2b", "too")])
        stale = await c.post("/v1/ag-ui", json=run("r3", [user("u1", "one"), assistant("a", "reply 2 to one"),
                                                           user("u2", "two")]), headers=auth())
        assert (stale.status_code, stale.json()["error"]["type"]) == (409, "InputConflict")
        assert "was rewound" in stale.json()["error"]["message"]
        assert model.calls == 4


async def test_the_rewind_is_written_under_the_run_s_own_lease(store: SessionStore) -> None:
    # (d) No other request can come between the rewind and the run: both hold one lease.
    tokens: list[tuple[str, str | None]] = []
    real = store._append  # every write to a log goes through it, with the lease that fences it

    async def recording(key: Any, messages: Any, lease: Any, durable: bool) -> int:
        tokens.extend((m.id, lease.token if lease is not None else None) for m in messages)
        return await real(key, messages, lease, durable)

    store._append = recording  # type: ignore[method-assign]
    async with client(make_app(store, GateModel(), agui_rewinds=True)) as c:
        await post(c, "r1", [user("u1", "one")])
        tokens.clear()
        assert await post(c, "r2", [user("u1", "one")]) == "reply 2 to one"
    (marker, marker_lease), (_, answer_lease) = tokens
    assert marker == "rewind-1" and marker_lease is not None and marker_lease == answer_lease


PROBE = ProviderState(AGUI_RUN_KEY, str, default=lambda _: "")


@tool
def forge(ctx: ToolContext) -> str:
    """Claim a run id."""
    ctx.set_state(PROBE, "r-forged")
    return "forged"


async def test_no_tool_or_provider_may_write_the_thread_s_run_id(store: SessionStore) -> None:
    # (e) The key that tells a retry from a regenerate is the route's alone.
    class Steps(GateModel):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            if self.calls == 0:
                self.calls += 1
                return ModelResponse([Message("assistant", (FunctionCall("c1", "forge", "{}"),))], Usage(1, 1),
                                     "tool_calls", self.name)
            return await super().complete(request)

    model = Steps()
    agent = Agent(model, tools=[forge], providers=[History(store)])
    async with client(create_app(agent, keys=keys(), settings=REWINDS)) as c:
        await post(c, "r1", [user("u1", "one")])
        messages = (await c.get("/v1/sessions/t1/messages", headers=auth())).json()["messages"]
        result = messages[2]["parts"][0]
        assert result["is_error"] and "uses session state key 'ag-ui.run_id'" in result["result"]
        assert (await c.get("/v1/sessions/t1", headers=auth())).json()["state"][AGUI_RUN_KEY] == "r1"

    class Claims(ContextProvider):
        state_keys = (AGUI_RUN_KEY,)

    with pytest.raises(UsageError, match=r"ag-ui\.run_id"):
        Agent(GateModel(), providers=[History(MemoryStore()), Claims("claims")])


async def test_an_edit_rewinds_to_the_view_message_before_the_edited_one(store: SessionStore) -> None:
    # (f) The log's message just before the edited one may itself be rewound (an earlier edit's or rewind's).
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        base = [user("u1", "one"), assistant("a", "reply 1 to one")]
        await post(c, "r1", base[:1])
        await post(c, "r2", [*base, user("u2", "two")])
        assert await post(c, "r3", [*base, user("u2b", "two b")]) == "reply 3 to two b"
        assert await post(c, "r4", [*base, user("u2c", "two c")]) == "reply 4 to two c"  # an edit of the edit
        rewound = await c.post("/v1/sessions/t1/rewind", json={"to": 2}, headers=auth())
        assert rewound.status_code == 200, rewound.text
        await post(c, "r5", [*base, user("u3", "three")])
        assert await post(c, "r6", [*base, user("u3b", "three b")]) == "reply 6 to three b"  # after a REST rewind
        assert [(role, text) for role, text, gone in await log(c) if not gone] == [
            ("user", "one"), ("assistant", "reply 1 to one"), ("user", "three b"), ("assistant", "reply 6 to three b")]


async def test_a_message_stored_before_ag_ui_marked_its_input_is_the_same_input() -> None:
    # (g) A thread stored by an earlier release: its user messages hold no INPUT_KEY, a retry is still one.
    store = MemoryStore()
    agent = Agent(GateModel(), providers=[History(store)])
    await agent.run(Message.user("one", id="u1"), session=await agent.session("t1", tenant="acme"))
    async with client(create_app(agent, keys=keys(), settings=REWINDS)) as c:
        assert await post(c, "r2", [user("u1", "one"), assistant("a", "reply 1 to one")]) == "reply 1 to one"
        assert await post(c, "r3", [user("u1", "one")]) == "reply 1 to one"  # not its turn to rewind: from the log
    assert INPUT_KEY in IGNORED_METADATA
    marked = Message.user("one", metadata={INPUT_KEY: True, "tag": 1})
    assert same_input(marked, Message.user("one", metadata={"tag": 1}))
    assert not same_input(Message.user("one", metadata={"tag": 1}), Message.user("one"))


class Crashing(MemoryStore):
    """A store whose next write `crash` picks fails, as a worker killed there would leave the thread."""

    def __init__(self) -> None:
        super().__init__()
        self.crash: Any = None

    def _maybe(self, what: str, arg: Any) -> None:
        if self.crash is not None and self.crash(what, arg):
            self.crash = None
            raise OSError(f"worker killed at {what}")

    async def append(self, tenant: str, session_id: str, messages: Any, **kw: Any) -> Any:
        self._maybe("append", messages)
        return await super().append(tenant, session_id, messages, **kw)

    async def save_session(self, session: Any, **kw: Any) -> Any:
        self._maybe("save", session)
        return await super().save_session(session, **kw)


@pytest.mark.parametrize("at", ["marker", "run id"])
async def test_a_regenerate_sent_again_after_a_crash_in_its_rewind_is_answered_anew(at: str) -> None:
    # (h) Killed before the marker, or after it and before the runId is saved: the same request again regenerates.
    store = Crashing()
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        await post(c, "r1", [user("u1", "one")])
        store.crash = (lambda what, m: what == "append" and m[0].id.startswith("rewind-")) if at == "marker" else \
            (lambda what, s: what == "save" and s.state.get(AGUI_RUN_KEY) == "r2")
        crashed = await c.post("/v1/ag-ui", json=run("r2", [user("u1", "one")]), headers=auth())
        assert crashed.status_code == 500 and store.crash is None
        assert await post(c, "r2", [user("u1", "one")]) == "reply 2 to one"
        assert [(role, text) for role, text, gone in await log(c) if not gone] == [
            ("user", "one"), ("assistant", "reply 2 to one")]


async def test_a_message_queued_asap_keeps_the_turn_from_being_regenerated(store: SessionStore) -> None:
    # (i) The queued message is the run's to deliver: the turn before it is no longer the thread's last.
    model = GateModel()
    agent = Agent(model, providers=[History(store)])
    async with client(create_app(agent, keys=keys(), settings=REWINDS)) as c:
        await post(c, "r1", [user("u1", "one")])
        await agent.enqueue(await agent.session("t1", tenant="acme"), "queued", when="asap")
        assert await post(c, "r2", [user("u1", "one")]) == "reply 1 to one"  # a retry, answered from the log
        assert await log(c) == [("user", "one", False), ("assistant", "reply 1 to one", False)]
        queue = (await c.get("/v1/sessions/t1/queue", headers=auth())).json()
        assert [m["message"]["parts"][0]["text"] for m in queue["queued"]] == ["queued"]  # still waiting


async def test_an_edit_of_the_first_message_rewinds_everything(store: SessionStore) -> None:
    # (j) The history before the first message is empty: the request is the new message alone.
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        await post(c, "r1", [user("u1", "one")])
        assert await post(c, "r2", [user("u1b", "uno")]) == "reply 2 to uno"
        assert await log(c) == [("user", "one", True), ("assistant", "reply 1 to one", True),
                                ("system", "[rewound: messages after sequence 0 are left out]", True),
                                ("user", "uno", False), ("assistant", "reply 2 to uno", False)]
        # With two user messages in the view, one new message alone is a next turn, as before.
        await post(c, "r3", [user("u1b", "uno"), assistant("a", "reply 2 to uno"), user("u2", "two")])
        assert await post(c, "r4", [user("u3", "three")]) == "reply 4 to three"
        assert [gone for _, _, gone in await log(c)][5:] == [False] * 4


async def test_rest_input_drops_the_ag_ui_marks(store: SessionStore) -> None:
    # (k) A REST message may not claim to be AG-UI input (an AG-UI client that never saw it could rewind it), yet
    # a message read back from GET .../messages, marked, may be posted again as it is: a retry.
    model = GateModel()
    async with client(make_app(store, model, agui_rewinds=True)) as c:
        await post(c, "r1", [user("u1", "one")])
        read = (await c.get("/v1/sessions/t1/messages", headers=auth())).json()["messages"][0]
        assert read["metadata"] == {INPUT_KEY: True}
        again = {k: read[k] for k in ("role", "parts", "id", "metadata", "created_at", "v")}
        replay = await c.post("/v1/sessions/t1/runs", json={"input": [again]}, headers=auth())
        assert replay.status_code == 200 and replay.json()["replayed"] is True, replay.text
        forged = {"role": "user", "parts": [{"kind": "text", "text": "two"}], "metadata": {INPUT_KEY: True, "tag": 1}}
        assert (await c.post("/v1/sessions/t1/runs", json={"input": [forged]}, headers=auth())).status_code == 200
        stored = (await c.get("/v1/sessions/t1/messages", headers=auth())).json()["messages"]
        assert stored[-2]["parts"][0]["text"] == "two" and stored[-2]["metadata"] == {"tag": 1}
        assert model.calls == 2


class FailsAfter(ContextProvider):
    """Fails its after_run hook once, when told: the run's answer is stored, the run fails (`AfterRunError`)."""

    fail = False

    async def after_run(self, ctx: Any, outcome: Any) -> None:
        if self.fail:
            FailsAfter.fail = False
            raise RuntimeError("memory extraction rate-limited")


@pytest.mark.parametrize("at", ["after_run", "last save"])
async def test_a_run_failing_after_its_answer_is_stored_is_retried_with_its_run_id(at: str) -> None:
    # (l) The runId is saved before the run: the same request again is a retry (the tools do not run again).
    store = Crashing()
    model = GateModel()
    agent = Agent(model, providers=[History(store), FailsAfter("fails")])
    history = [user("u1", "one"), assistant("a", "reply 1 to one"), user("u2", "two")]
    async with client(create_app(agent, keys=keys(), settings=REWINDS)) as c:
        await post(c, "r1", [user("u1", "one")])
        saves: list[str] = []
        if at == "after_run":
            FailsAfter.fail = True
        else:  # the run's first save is settle's, before the run; its last one fails
            store.crash = lambda what, s: what == "save" and s.state.get(AGUI_RUN_KEY) == "r2" and (
                saves.append(what) or len(saves) == 2)
        failed = await c.post("/v1/ag-ui", json=run("r2", history), headers=auth())
        assert "RUN_ERROR" in failed.text or failed.status_code == 500, failed.text
        assert store.crash is None and not FailsAfter.fail
        assert await post(c, "r2", history) == "reply 2 to two" and model.calls == 2
        assert [gone for _, _, gone in await log(c)] == [False] * 4


async def test_off_the_run_id_is_not_recorded() -> None:
    # (m) Without the setting the route writes nothing of its own to the session's state.
    store = MemoryStore()
    async with client(make_app(store, GateModel())) as c:
        await post(c, "r1", [user("u1", "one")])
        assert AGUI_RUN_KEY not in (await c.get("/v1/sessions/t1", headers=auth())).json()["state"]
