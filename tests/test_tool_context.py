"""Tools that take a `ToolContext`: whom the call serves, its idempotency key, deps, session state."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from contextpipe import Agent, ContextProvider, ProviderState, Session, Tool, ToolContext, UsageError, tool
from contextpipe.messages import Message
from contextpipe.providers import History, McpTools, StdioServer
from contextpipe.providers.skills import ScriptRequest, Skills
from contextpipe.session import set_user_id
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.tool_context import IDEMPOTENCY_KEY_VERSION, idempotency_key
from contextpipe.tools import CallTool, ToolInvocation, ToolOutcome
from helpers import MiddlewareProvider, results


@dataclass
class Shop:
    """The application's dependencies in these tests: a price list."""

    prices: dict[str, int]


class Cart(BaseModel):
    items: list[str] = []


CART = ProviderState("cart", Cart)


@tool
async def whoami(ctx: ToolContext) -> str:
    """Say whom this call serves."""
    return f"{ctx.user_id}@{ctx.tenant}/{ctx.session_id}"


def answers(messages: list[Message]) -> list[str]:
    return [text for _, text, _ in results(messages)]


def test_the_context_parameter_is_not_in_the_schema() -> None:
    @tool
    def price(item: str, ctx: ToolContext[Shop]) -> str:
        """Return the price of an item."""
        return ""

    assert price.parameters == {"additionalProperties": False, "properties": {"item": {"type": "string"}},
                                "required": ["item"], "type": "object"}
    assert whoami.parameters["properties"] == {}
    assert price.spec.parameters == price.parameters


def test_a_tool_takes_one_context() -> None:
    def twice(a: ToolContext, b: ToolContext) -> str:
        """Two contexts."""
        return ""

    with pytest.raises(UsageError, match="'a' and 'b' both take the ToolContext"):
        tool(twice)


async def test_a_per_user_tool_reads_the_user_of_its_session_in_its_thread_and_on_the_loop() -> None:
    threads: list[bool] = []

    @tool
    def lookup(item: str, ctx: ToolContext[Shop]) -> str:
        """Sync: runs in a worker thread."""
        threads.append(threading.current_thread() is threading.main_thread())
        return f"{item}: {ctx.deps.prices[item]} EUR for {ctx.user_id}"

    shop = Shop({"tea": 4})
    replies = []
    for user in ("alice", "bob"):
        model = ScriptedModel([tool_call("lookup", item="tea") + tool_call("whoami"), "ok"])
        agent = Agent(model, tools=[lookup, whoami])
        session = await agent.session(f"chat-{user}", tenant="acme")
        set_user_id(session, user)
        replies.append(sorted(answers((await agent.run("Price of tea?", session=session, deps=shop)).messages)))
    assert replies == [["alice@acme/chat-alice", "tea: 4 EUR for alice"], ["bob@acme/chat-bob", "tea: 4 EUR for bob"]]
    assert threads == [False, False]


async def test_deps_of_the_wrong_type_are_refused_before_the_tool_runs() -> None:
    ran: list[str] = []

    @tool
    def spend(amount: int, ctx: ToolContext[Shop]) -> str:
        """Spend money."""
        ran.append("spent")
        return "ok"

    @tool
    def indifferent(ctx: ToolContext[None]) -> str:
        """Uses no deps."""
        return "fine"

    @tool
    def anything(ctx: ToolContext[Any]) -> str:
        """Takes any deps."""
        return "any"

    agent = Agent(ScriptedModel([tool_call("spend", amount=1), "no", tool_call("spend", amount=1), "no",
                                 tool_call("indifferent") + tool_call("anything") + tool_call("whoami")
                                 + tool_call("spend", amount=2), "ok"]),
                  tools=[spend, indifferent, anything, whoami])
    missing = results((await agent.run("go")).messages)[0]
    wrong = results((await agent.run("go", deps={"prices": {}})).messages)[0]
    assert missing[2] and wrong[2] and ran == []
    assert sorted(answers((await agent.run("go", deps=Shop({}))).messages)) == ["None@None/None", "any", "fine", "ok"]
    assert ran == ["spent"]
    assert "needs deps of type Shop (ToolContext[Shop]), but its run was given no deps" in missing[1]
    assert "was given deps of type dict; the application must run the agent with deps=Shop(...)" in wrong[1]


async def test_deps_declared_as_a_union_a_generic_or_a_string_are_checked_too() -> None:
    @tool
    def maybe(ctx: ToolContext[Shop | None]) -> str:
        """Optional deps."""
        return "maybe"

    @tool
    def table(ctx: ToolContext[dict[str, int]]) -> str:
        """A parametrised generic: its origin is checked."""
        return "table"

    @tool
    def quoted(ctx: ToolContext["Shop"]) -> str:  # noqa: UP037 (a forward reference inside the brackets)
        """A string annotation inside the brackets."""
        return "quoted"

    async def answer(t: Tool, deps: object) -> tuple[str, bool]:
        outcome = await t.invoke("{}", context=ToolContext.for_call("c1", t.name, deps=deps))
        return outcome.result, outcome.is_error

    assert await answer(maybe, None) == ("maybe", False) and await answer(maybe, Shop({})) == ("maybe", False)
    refused, is_error = await answer(maybe, "text")
    assert is_error and "needs deps of type Shop or None (ToolContext[Shop | None]), but its run was given " \
        "deps of type str; the application must run the agent with deps=Shop(...)" in refused
    assert await answer(table, {"tea": 4}) == ("table", False)
    assert (await answer(table, Shop({})))[1] and (await answer(quoted, {"tea": 4}))[1]
    assert await answer(quoted, Shop({})) == ("quoted", False)


def test_a_context_parameter_must_be_annotated_toolcontext_alone() -> None:
    def optional(ctx: ToolContext[Shop] | None = None) -> str:
        """An optional context."""
        return ""

    def unknown(ctx: ToolContext["Nowhere"]) -> str:  # noqa: F821, UP037
        """A deps type that does not exist."""
        return ""

    with pytest.raises(UsageError, match=r"tool 'optional': parameter 'ctx' must be annotated ToolContext or "
                                         r"ToolContext\[Deps\] alone \(not Optional or in a union\)"):
        tool(optional)
    with pytest.raises(UsageError, match=r"tool 'unknown': cannot resolve the deps type 'Nowhere'"):
        tool(unknown)


async def test_a_stream_passes_its_deps_and_the_context_is_the_calls() -> None:
    seen: list[ToolContext[Shop]] = []

    @tool
    async def note(ctx: ToolContext[Shop]) -> str:
        """Note the context."""
        seen.append(ctx)
        return "noted"

    model = ScriptedModel([tool_call("note") + tool_call("note"), "done"])
    agent = Agent(model, tools=[note], name="clerk")
    session = await agent.session("s-1")
    shop = Shop({})
    async with agent.stream("go", session=session, deps=shop) as events:
        async for _ in events:
            pass
    assert [c.call_id for c in seen] == ["call_1", "call_2"]
    assert all(c.deps is shop and c.agent is agent and c.tool_name == "note" for c in seen)
    assert seen[0].idempotency_key != seen[1].idempotency_key


async def test_invoking_a_context_tool_outside_a_run_needs_a_context() -> None:
    outcome = await whoami.invoke("{}")
    assert outcome.is_error and "takes a ToolContext, and was invoked without one" in outcome.result
    ctx = ToolContext.for_call("c1", "whoami", session=Session("chat-1", tenant="acme"), user_id="carol")
    assert (await whoami.invoke("{}", context=ctx)).result == "carol@acme/chat-1"
    assert ctx.idempotency_key == idempotency_key("acme", "chat-1", "", "c1")


async def test_tool_middleware_sees_the_context_the_tool_is_given() -> None:
    passed: list[ToolContext[object] | None] = []
    got: list[ToolContext[object]] = []

    @tool
    def echo(text: str, ctx: ToolContext) -> str:
        """Echo."""
        got.append(ctx)
        return text

    async def shout(call: ToolInvocation, call_next: CallTool) -> ToolOutcome:
        passed.append(call.context)
        return await call_next(call.with_arguments({"text": "HI"}))

    agent = Agent(ScriptedModel([tool_call("echo", text="hi"), "ok"]), tools=[echo],
                  providers=[MiddlewareProvider("loud", shout)])
    result = await agent.run("say hi", deps="d")
    assert answers(result.messages) == ["HI"]
    assert passed[0] is got[0] and got[0].deps == "d" and got[0].call_id == "call_1"


# --- the idempotency key -------------------------------------------------------------------------------------


def test_the_derivation_of_the_key_is_pinned() -> None:
    text = json.dumps(["contextpipe.tool-call.v1", "acme", "chat-1", "m-1", "call_1"], separators=(",", ":"))
    assert IDEMPOTENCY_KEY_VERSION == "contextpipe.tool-call.v1"
    assert idempotency_key("acme", "chat-1", "m-1", "call_1") == hashlib.sha256(text.encode()).hexdigest()
    assert idempotency_key("acme", "chat-1", "m-1", "call_1") == (
        "4d520cfacdfab1d3b3b13adf196f2411cf8a3a65ba9993b1f839a4688c03cf31")


parts = st.tuples(st.none() | st.text(max_size=6), st.none() | st.text(max_size=6), st.text(max_size=6),
                  st.text(max_size=6))


@given(parts, parts)
def test_two_different_calls_never_share_a_key(a: tuple[str | None, str | None, str, str],
                                               b: tuple[str | None, str | None, str, str]) -> None:
    assert (idempotency_key(*a) == idempotency_key(*b)) == (a == b)


async def test_every_call_gets_its_own_key_even_when_the_model_reuses_call_ids() -> None:
    keys: dict[tuple[str, str, str], str] = {}

    @tool
    def record(ctx: ToolContext) -> str:
        """Record the key."""
        assert ctx.tenant is not None and ctx.session_id is not None
        keys[(ctx.tenant, ctx.session_id, str(len(keys)))] = ctx.idempotency_key
        return "ok"

    store = MemoryStore()
    for tenant, session_id in (("acme", "s1"), ("acme", "s1"), ("acme", "s2"), ("other", "s1")):
        agent = Agent(ScriptedModel([tool_call("record", call_id="call_0"), "ok"]), tools=[record],
                      providers=[History(store)])  # every model answers with "call_0"
        await agent.run("go", session=await agent.session(session_id, tenant=tenant))
    assert len(keys) == 4 and len(set(keys.values())) == 4


async def test_the_key_is_the_same_when_a_resumed_run_runs_an_interrupted_call_again(tmp_path: Path) -> None:
    keys: list[tuple[str, str]] = []
    started = asyncio.Event()

    @tool(idempotent=True)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge the card (the payment service deduplicates by the key)."""
        keys.append((ctx.call_id, ctx.idempotency_key))
        if len(keys) == 1:
            started.set()
            await asyncio.Event().wait()  # the first run is cut here
        return "charged"

    db = tmp_path / "sessions.db"
    async with SQLiteStore(db) as store:
        agent = Agent(ScriptedModel([tool_call("charge", amount=5)]), tools=[charge], providers=[History(store)])
        run = asyncio.create_task(agent.run("Charge 5", session=await agent.session("alice-1", tenant="acme")))
        await started.wait()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    async with SQLiteStore(db) as store:  # another store on the same file, as a restarted process has
        agent = Agent(ScriptedModel(["Charged."]), tools=[charge], providers=[History(store)])
        session = await agent.session("alice-1", tenant="acme")
        result = await agent.run(None, session=session)
        log = await agent.history(session)
    assert result.text == "Charged."
    assert len(keys) == 2 and keys[0] == keys[1]
    assert keys[0][1] == idempotency_key("acme", "alice-1", log[1].id, "call_1")  # log[1]: the model's call


# --- session state -------------------------------------------------------------------------------------------


@tool
def add_to_cart(item: str, ctx: ToolContext) -> str:
    """Put an item in the cart."""
    cart = ctx.state(CART)
    cart.items.append(item)
    return f"{len(cart.items)} items"


@tool
def empty_cart(ctx: ToolContext) -> str:
    """Empty the cart."""
    ctx.set_state(CART, Cart())
    return "empty"


async def test_state_a_tool_writes_is_saved_with_the_session(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    async with SQLiteStore(db) as store:
        model = ScriptedModel([tool_call("add_to_cart", item="tea") + tool_call("add_to_cart", item="cake"), "ok",
                               tool_call("add_to_cart", item="jam"), "ok"])
        agent = Agent(model, tools=[add_to_cart], providers=[History(store)])
        session = await agent.session("shop-1")
        first = await agent.run("tea and cake", session=session)
        await agent.run("and jam", session=session)
    assert sorted(answers(first.messages)) == ["1 items", "2 items"]
    async with SQLiteStore(db) as store:
        stored = await store.get_session("default", "shop-1")
        assert stored is not None and stored.state["cart"] == {"items": ["tea", "cake", "jam"]}
        agent = Agent(ScriptedModel([tool_call("empty_cart"), "ok"]), tools=[empty_cart], providers=[History(store)])
        await agent.run("empty it", session=await agent.session("shop-1"))
        emptied = await store.get_session("default", "shop-1")
    assert emptied is not None and emptied.state["cart"] == {"items": []}


class Charges(BaseModel):
    by_key: dict[str, int] = {}


CHARGES = ProviderState("charges", Charges)


async def test_a_cancelled_run_saves_the_state_and_an_idempotent_call_run_again_writes_it_once() -> None:
    started = asyncio.Event()

    @tool(idempotent=True)
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Record the charge under its key, then charge."""
        ctx.state(CHARGES).by_key[ctx.idempotency_key] = amount
        if not started.is_set():
            started.set()
            await asyncio.Event().wait()  # the first run is cut here
        return "charged"

    store = MemoryStore()
    agent = Agent(ScriptedModel([tool_call("charge", amount=5)]), tools=[charge], providers=[History(store)])
    run = asyncio.create_task(agent.run("Charge 5", session=await agent.session("pay")))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    cut = await store.get_session("default", "pay")
    agent = Agent(ScriptedModel(["Charged."]), tools=[charge], providers=[History(store)])
    await agent.run(None, session=await agent.session("pay"))
    done = await store.get_session("default", "pay")
    assert cut is not None and done is not None
    assert len(cut.state["charges"]["by_key"]) == 1 and done.state["charges"] == cut.state["charges"]


class Prefs(BaseModel):
    food: str | None = None


class PrefsProvider(ContextProvider):
    def __init__(self) -> None:
        super().__init__("prefs-provider")
        self.prefs = ProviderState("prefs", Prefs)


async def test_keys_the_session_or_a_provider_keeps_are_refused_and_no_session_keeps_nothing() -> None:
    @tool
    def meddle(key: str, ctx: ToolContext) -> str:
        """Read another key."""
        return str(ctx.state(ProviderState(key, Prefs)))

    model = ScriptedModel([tool_call("meddle", key="user_id") + tool_call("meddle", key="prefs")
                           + tool_call("meddle", key="mine"), "ok"])
    agent = Agent(model, tools=[meddle], providers=[PrefsProvider()])
    session = await agent.session("s")
    set_user_id(session, "alice")
    user, prefs, mine = results((await agent.run("go", session=session)).messages)
    assert user[2] and "uses session state key 'user_id', which holds the user the session belongs to" in user[1]
    assert prefs[2] and "which holds the state of context provider 'prefs-provider'" in prefs[1]
    assert (mine[1], mine[2]) == ("food=None", False)
    assert session.state["user_id"] == "alice" and "prefs" not in session.state
    sessionless = Agent(ScriptedModel([tool_call("add_to_cart", item="tea") + tool_call("empty_cart"), "ok"]),
                        tools=[add_to_cart, empty_cart])
    added, emptied = results((await sessionless.run("go")).messages)
    assert added[1] == "1 items"
    assert emptied[2] and "its run has no session to keep it in; run the agent with session=..." in emptied[1]


# --- MCP and skill tools -------------------------------------------------------------------------------------


async def test_mcp_tools_are_invoked_with_the_context() -> None:
    server = StdioServer(sys.executable, [str(Path(__file__).parent / "fixtures" / "mcp_server.py")])
    async with McpTools(server, include=["shout"], offer_resources=False) as mcp:
        agent = Agent(ScriptedModel([tool_call("shout", text="hi"), "done"]), providers=[mcp])
        result = await agent.run("shout", session=await agent.session("s"), deps=Shop({}))
        (shout,) = await mcp.tools()
        direct = await shout.invoke('{"text": "again"}', context=ToolContext.for_call("c9", "shout"))
    assert answers(result.messages) == ["HI"] and direct.result == "AGAIN"


async def test_the_approval_of_a_skill_script_is_told_whom_the_call_serves(tmp_path: Path) -> None:
    folder = tmp_path / "greet"
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: greet\ndescription: Greets.\n---\nRun the script.\n")
    (folder / "scripts" / "hello.py").write_text("print('hello')\n")
    asked: list[ScriptRequest] = []

    def approve(request: ScriptRequest) -> bool:
        asked.append(request)
        return request.context is not None and request.context.user_id == "alice"

    skills = Skills(tmp_path, allow_scripts=True, approve=approve, script_timeout=20)
    call = tool_call("run_skill_script", skill="greet", path="scripts/hello.py")
    outcomes = []
    for user in ("alice", "bob"):
        agent = Agent(ScriptedModel([call, "ok"]), providers=[skills])
        session = await agent.session(f"chat-{user}")
        set_user_id(session, user)
        outcomes.append(results((await agent.run("greet me", session=session)).messages)[0])
    assert outcomes[0][1:] == ("exit code 0\nhello\n", False)
    assert outcomes[1][2] and "not approved" in outcomes[1][1]
    assert [(r.context.session_id, r.context.tool_name) for r in asked if r.context is not None] == [
        ("chat-alice", "run_skill_script"), ("chat-bob", "run_skill_script")]
