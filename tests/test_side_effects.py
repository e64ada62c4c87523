"""What each kind of tool gets when its call is cut, and the outbox committing with the call's result.

The four kinds (docs/guides/side-effects.md): idempotent and retry-with-key calls are run again,
outbox calls too (nothing of a cut call was committed), plain calls are answered "interrupted". The
crash storm with real SIGKILLs is ``tests/stores/test_exactly_once.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, HistoryPolicy, Message, StoreError, ToolContext, UsageError, tool
from contextpipe.exchanges import LATE_RESULT_KEY
from contextpipe.models import ModelRequest
from contextpipe.outbox import OUTBOX_KEY, Outbox
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.tool_context import idempotency_key
from helpers import results


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    s: SessionStore = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "s.db")
    yield s
    await s.close()


def entries(message: Message) -> list[Any]:
    return [(e["topic"], e["payload"]) for e in message.metadata.get(OUTBOX_KEY, [])]


async def test_after_a_cut_each_kind_of_tool_gets_its_guarantee(store: SessionStore) -> None:
    runs: dict[str, list[str]] = {"charge": [], "ship": [], "lookup": [], "email": []}
    all_started = asyncio.Barrier(5)  # the four tools and the test

    async def first_time_hang(name: str, key: str) -> None:
        runs[name].append(key)
        if len(runs[name]) == 1:
            await all_started.wait()
            await asyncio.Event().wait()  # the first run is cut here

    @tool(retry_with_key=True)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge the card; the payment service deduplicates by the idempotency key."""
        await first_time_hang("charge", ctx.idempotency_key)
        return f"charged {amount}"

    @tool(outbox=True)
    async def ship(order: str, ctx: ToolContext) -> str:
        """Queue the shipment (the relay sends it)."""
        ctx.outbox.add("shipments", {"order": order})
        await first_time_hang("ship", ctx.idempotency_key)
        return f"shipment of {order} queued"

    @tool(idempotent=True)
    async def lookup(order: str, ctx: ToolContext) -> str:
        """Look an order up."""
        await first_time_hang("lookup", ctx.idempotency_key)
        return f"{order}: paid"

    @tool
    async def email(to: str, ctx: ToolContext) -> str:
        """Send an e-mail (not deduplicated)."""
        await first_time_hang("email", ctx.idempotency_key)
        return "sent"

    tools = [charge, ship, lookup, email]
    calls = (tool_call("charge", amount=5, call_id="c_charge") + tool_call("ship", order="o-1", call_id="c_ship")
             + tool_call("lookup", order="o-1", call_id="c_lookup") + tool_call("email", to="ann", call_id="c_email"))
    agent = Agent(ScriptedModel([calls]), tools=tools, providers=[History(store)])
    run = asyncio.create_task(agent.run("Pay and ship o-1", session=await agent.session("s", tenant="acme")))
    await all_started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert await store.outbox("acme") == []  # nothing of the cut call was committed

    agent = Agent(ScriptedModel(["Paid and shipped; the e-mail may not have gone out."]), tools=tools,
                  providers=[History(store)])
    session = await agent.session("s", tenant="acme")
    await agent.run(None, session=session)
    log = await agent.history(session)
    answers = {call_id: (text, error) for call_id, text, error in results(log)}
    assert answers["c_charge"] == ("charged 5", False)
    assert answers["c_ship"] == ("shipment of o-1 queued", False)
    assert answers["c_lookup"] == ("o-1: paid", False)
    assert answers["c_email"][1] and "was interrupted" in answers["c_email"][0]
    assert len(runs["email"]) == 1  # a plain call is never run twice
    for name in ("charge", "ship", "lookup"):  # run again, with the same key
        assert runs[name] == [idempotency_key("acme", "s", log[1].id, f"c_{name}")] * 2
    [answer] = [m for m in log if m.function_results]
    assert entries(answer) == [("shipments", {"order": "o-1"})]
    [shipment] = await store.outbox("acme")
    assert (shipment.payload, shipment.call_id, shipment.seq) == ({"order": "o-1"}, "c_ship", log.index(answer) + 1)
    assert shipment.key == f"{runs['ship'][0]}.0"


async def test_entries_commit_only_when_the_tool_returns(store: SessionStore) -> None:
    @tool
    def declined(ctx: ToolContext) -> str:
        """Adds an entry, then fails."""
        ctx.outbox.add("emails", "never sent")
        raise RuntimeError("card declined")

    @tool
    async def refused(ctx: ToolContext) -> Any:
        """Adds an entry and returns an error result of its own: it decided, so the entry counts."""
        ctx.outbox.add("emails", "refund notice")
        from contextpipe.tools import ToolOutcome

        return ToolOutcome("Error: refunded instead", is_error=True)

    @tool(timeout=0.001)
    async def slow(ctx: ToolContext) -> str:
        """Adds an entry, then is cancelled by its timeout."""
        ctx.outbox.add("emails", "too late")
        await asyncio.Event().wait()
        return "never"

    calls = tool_call("declined", call_id="a") + tool_call("refused", call_id="b") + tool_call("slow", call_id="c")
    agent = Agent(ScriptedModel([calls, "Sorry."]), tools=[declined, refused, slow], providers=[History(store)])
    result = await agent.run("go", session=await agent.session("s"))
    by_call = {m.function_results[0].call_id: m for m in result.messages if m.function_results}
    assert [entries(by_call[c]) for c in "abc"] == [[], [("emails", "refund notice")], []]
    assert all(r.is_error for m in by_call.values() for r in m.function_results)
    assert [e.payload for e in await store.outbox("default")] == ["refund notice"]


async def test_a_timed_out_sync_tool_commits_its_entries_with_its_late_result(store: SessionStore) -> None:
    release = threading.Event()

    @tool(timeout=0.001, outbox=True)  # it blocks until released: the timeout always comes first
    def report(ctx: ToolContext) -> str:
        """Build the report and queue its e-mail."""
        ctx.outbox.add("emails", "report attached")
        release.wait(timeout=120)  # the bound only stops a broken test from hanging the suite
        return "report ready"

    def answer(request: ModelRequest) -> str:
        release.set()  # the thread returns now; the run ends once its late result is saved
        return "The report is still being built."

    agent = Agent(ScriptedModel([tool_call("report", call_id="r"), answer]), tools=[report],
                  providers=[History(store)])
    session = await agent.session("s")
    result = await agent.run("Make the report.", session=session)
    timeout_error, late = result.messages[1], result.messages[-1]
    assert timeout_error.function_results[0].is_error and entries(timeout_error) == []
    assert late.metadata[LATE_RESULT_KEY] == "r" and entries(late) == [("emails", "report attached")]
    log = await agent.history(session)
    [queued] = await store.outbox("default")
    assert (queued.payload, queued.seq) == ("report attached", [m.id for m in log].index(late.id) + 1)


async def test_a_save_retried_after_an_unclear_failure_commits_the_entries_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    append, failed = store.append, list[bool]()

    async def committed_then_failed(tenant: str, session_id: str, messages: Sequence[Message], **kw: Any) -> int:
        last = await append(tenant, session_id, messages, **kw)
        if any(OUTBOX_KEY in m.metadata for m in messages) and not failed:
            failed.append(True)  # the write went through, but the answer was lost (a dropped connection)
            raise StoreError("connection lost after commit", backend="sqlite")
        return last

    store.append = committed_then_failed  # type: ignore[method-assign]

    @tool(outbox=True)
    def ship(ctx: ToolContext) -> str:
        """Queue a shipment."""
        ctx.outbox.add("shipments", "o-1")
        return "queued"

    agent = Agent(ScriptedModel([tool_call("ship"), "Shipped."]), tools=[ship], providers=[History(store)])
    session = await agent.session("s")
    try:
        with pytest.raises(StoreError, match="connection lost"):
            await agent.run("Ship o-1", session=session)
        assert (await agent.run(None, session=session)).text == "Shipped."  # the call has its answer: not run again
        assert [e.payload for e in await store.outbox("default")] == ["o-1"]
    finally:
        await store.close()


async def test_a_tool_is_told_why_its_run_cannot_keep_outbox_entries(tmp_path: Path) -> None:
    @tool
    def notify(ctx: ToolContext) -> str:
        """Queue a notification."""
        return ctx.outbox.add("notifications", "hi")

    async def answer_of(agent: Agent, **run: Any) -> str:
        result = await agent.run("Notify me", **run)
        return result.messages[1].function_results[0].result

    no_session = Agent(ScriptedModel([tool_call("notify"), "ok"]), tools=[notify])
    assert "cannot add to the outbox: its run has no session" in await answer_of(no_session)
    store = MemoryStore()
    audit_only = Agent(ScriptedModel([tool_call("notify"), "ok"]), tools=[notify], store=store,
                       providers=[History(store, policy=HistoryPolicy(store_outputs=False))])
    assert "no History of the agent stores tool results" in await answer_of(
        audit_only, session=await audit_only.session("s"))
    assert await store.outbox("default") == []


def test_adding_checks_what_it_is_given() -> None:
    outbox = Outbox("call_1", lambda: "k")
    assert outbox.add("emails", {"to": ["ann"]}) == "k.0" and outbox.add("emails", 2) == "k.1"
    payload = {"to": "ann"}
    outbox.add("emails", payload)
    payload["to"] = "bob"  # copied when added
    assert [e["payload"] for e in outbox.entries] == [{"to": ["ann"]}, 2, {"to": "ann"}]
    for topic in ("", "x" * 201, 3, "line\nbreak", "nul\x00", "\ud800"):
        with pytest.raises(UsageError, match="an outbox topic must be a non-empty printable string"):
            outbox.add(topic, 1)  # type: ignore[arg-type]
    for payload_ in (object(), math.nan, {1: {2}}):
        with pytest.raises(UsageError, match="is not JSON"):
            outbox.add("emails", payload_)
    outbox._returned_now()
    with pytest.raises(UsageError, match="has returned: add outbox entries before the tool returns"):
        outbox.add("emails", 3)
    assert len(outbox.entries) == 3


async def test_a_context_built_for_a_test_collects_the_entries() -> None:
    @tool(outbox=True)
    def ship(order: str, ctx: ToolContext) -> str:
        """Queue a shipment."""
        ctx.outbox.add("shipments", {"order": order})
        return "queued"

    ctx = ToolContext.for_call("call_1", "ship")
    assert (await ship.invoke('{"order": "o-1"}', context=ctx)).result == "queued"
    assert [(e["topic"], e["payload"]) for e in ctx.outbox.entries] == [("shipments", {"order": "o-1"})]
    with pytest.raises(UsageError, match="built directly"):
        ToolContext(call_id="c", tool_name="t", deps=None).outbox.add("shipments", 1)
    assert ship.runs_again and not ship.idempotent and not ship.retry_with_key
