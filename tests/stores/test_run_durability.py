"""A run's durability on every backend: the lease heartbeat, a lost lease, and logs no content can break."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from contextpipe import Agent, Durability, FunctionCall, FunctionResult, Heartbeat, LeaseLost, Message, tool
from contextpipe.exchanges import exchange_problem
from contextpipe.models import ModelRequest, ModelResponse
from contextpipe.providers import History
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import describe


class Beats:
    """A heartbeat `sleep` driven by the test: each beat waits for `beat()`, and says when it is waiting."""

    def __init__(self) -> None:
        self._go: asyncio.Queue[None] = asyncio.Queue()
        self.waiting = asyncio.Event()
        self.intervals: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.intervals.append(seconds)
        self.waiting.set()
        await self._go.get()
        self.waiting.clear()

    async def beat(self) -> None:
        """Let one renewal happen and wait until it is done (the heartbeat is waiting again, or stopped)."""
        await self.waiting.wait()
        self.waiting.clear()
        self._go.put_nowait(None)
        await asyncio.sleep(0)
        for _ in range(200):  # a renewal is a few store round trips; wait for progress, not for time
            if self.waiting.is_set():
                return
            await asyncio.sleep(0.01)


def counting_renewals(store: SessionStore) -> list[float]:
    """Record each successful renewal's new expiry (the store itself does the work)."""
    renewals: list[float] = []
    real: Callable[..., Awaitable[object]] = store.renew_lease

    async def renew(lease: object) -> object:
        renewed = await real(lease)
        renewals.append(renewed.expires_at)  # type: ignore[attr-defined]
        return renewed

    store.renew_lease = renew  # type: ignore[method-assign]
    return renewals


async def test_heartbeat_renews_the_lease_during_a_long_tool_call(store: SessionStore, tenant: str) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def slow_report() -> str:
        """Takes as long as it takes."""
        started.set()
        await release.wait()
        return "report ready"

    beats = Beats()
    renewals = counting_renewals(store)
    agent = Agent(ScriptedModel([tool_call("slow_report"), "Here it is."]), tools=[slow_report],
                  providers=[History(store)],
                  durability=Durability(lease_ttl=9.0, heartbeat=Heartbeat(sleep=beats.sleep, shared_timer=False)))
    session = await agent.session("long", tenant=tenant)
    run = asyncio.ensure_future(agent.run("Make the report", session=session))
    await started.wait()
    for _ in range(3):
        await beats.beat()
    assert len(renewals) == 3 and renewals == sorted(renewals)
    assert beats.intervals[0] == 3.0  # every ttl / 3
    release.set()
    result = await run
    assert result.text == "Here it is."
    assert describe(await agent.history(session))[-2:] == ["tool:result:report ready", "assistant:Here it is."]


async def test_the_default_heartbeat_starts_once_a_run_outlives_one_interval(store: SessionStore,
                                                                            tenant: str) -> None:
    """With the event loop's own sleep, the first renewal comes from a timer, the later ones from the heartbeat task."""
    started, release, renewed = asyncio.Event(), asyncio.Event(), asyncio.Event()
    renewals = counting_renewals(store)
    real = store.renew_lease

    async def renew(lease: object) -> object:
        result = await real(lease)  # type: ignore[arg-type]
        if len(renewals) >= 3:
            renewed.set()  # the progress signal: three renewals happened
        return result

    store.renew_lease = renew  # type: ignore[method-assign]

    @tool
    async def slow_report() -> str:
        """Takes as long as it takes."""
        started.set()
        await release.wait()
        return "report ready"

    agent = Agent(ScriptedModel([tool_call("slow_report"), "Here it is."]), tools=[slow_report],
                  providers=[History(store)], durability=Durability(heartbeat=Heartbeat(interval=0.01)))
    session = await agent.session("timer", tenant=tenant)
    run = asyncio.ensure_future(agent.run("Make the report", session=session))
    await started.wait()
    await renewed.wait()
    assert renewals == sorted(renewals)
    release.set()
    assert (await run).text == "Here it is."
    lease = await store.try_acquire_lease(tenant, "timer", "check", 5.0)
    assert lease is not None  # released: the heartbeat stopped with the run
    await store.release_lease(lease)


async def test_a_lost_lease_stops_the_run_at_once_and_nothing_more_is_written(store: SessionStore,
                                                                             tenant: str) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    @tool
    async def transfer(amount: int) -> str:
        """Move money (not idempotent)."""
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "moved"

    beats = Beats()
    agent = Agent(ScriptedModel([tool_call("transfer", amount=5), "never"]), tools=[transfer],
                  providers=[History(store)],
                  durability=Durability(heartbeat=Heartbeat(sleep=beats.sleep, shared_timer=False)))
    session = await agent.session("lost", tenant=tenant)
    run = asyncio.ensure_future(agent.run("Pay", session=session))
    await started.wait()
    assert await store.delete_session(tenant, "lost")  # an operator deletes the session mid-run
    await beats.beat()
    with pytest.raises(LeaseLost) as info:
        await asyncio.wait_for(run, timeout=30)
    assert cancelled.is_set()  # the in-flight tool was cancelled
    assert any("the run was stopped" in note for note in info.value.__notes__)
    # Nothing was written after the loss: the deleted session did not come back.
    assert await store.get_session(tenant, "lost") is None
    assert (await store.load(tenant, "lost")).messages == []


async def test_a_session_taken_over_after_expiry_stops_the_old_run(store: SessionStore, tenant: str) -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Hangs (as a stuck process would)."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    beats = Beats()  # never beaten: the first run behaves as a paused process whose lease runs out
    first = Agent(ScriptedModel([tool_call("wait_forever"), "never"]), tools=[wait_forever],
                  providers=[History(store)],
                  durability=Durability(lease_ttl=0.05, heartbeat=Heartbeat(sleep=beats.sleep, shared_timer=False)))
    session = await first.session("taken", tenant=tenant)
    run = asyncio.ensure_future(first.run("Start", session=session))
    await started.wait()
    second = Agent(ScriptedModel(["I took over."]), tools=[wait_forever], providers=[History(store)])
    taken = await second.session("taken", tenant=tenant)
    result = await second.run("Anyone there?", session=taken, lease_wait=60)  # waits for the expiry
    assert result.text == "I took over."
    await beats.beat()
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(run, timeout=30)
    log = describe(await second.history(taken))
    assert log[:2] == ["user:Start", "assistant:call:wait_forever"]
    assert "interrupted before it finished" in log[2]  # answered by the second run's repair, once
    assert log[3:] == ["user:Anyone there?", "assistant:I took over."]


# --- no content can make a session unusable ------------------------------------------------------------


def _call_message(*calls: FunctionCall) -> Message:
    return Message("assistant", calls)


async def test_duplicate_empty_and_nameless_call_ids_from_a_model_are_normalised(store: SessionStore,
                                                                                 tenant: str) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    def sloppy(request: ModelRequest) -> ModelResponse:
        return ModelResponse([_call_message(FunctionCall("dup", "lookup", '{"key": "a"}'),
                                            FunctionCall("dup", "lookup", '{"key": "b"}'),
                                            FunctionCall("", "lookup", '{"key": "c"}'),
                                            FunctionCall("x1", "", "{}"))])

    model = ScriptedModel([sloppy, "done", "still fine"])
    agent = Agent(model, tools=[lookup], providers=[History(store)])
    session = await agent.session("sloppy", tenant=tenant)
    result = await agent.run("look up a, b and c", session=session)
    assert result.text == "done"
    stored = await agent.history(session)
    assert exchange_problem(stored) is None
    ids = [c.call_id for c in stored[1].function_calls]
    assert len(set(ids)) == 4 and ids[0] == "dup" and "" not in ids
    results = sorted(r.result for m in stored[2:6] for r in m.function_results)
    assert results[1:] == ["value of a", "value of b", "value of c"]
    assert "no tool named '(unnamed)'" in results[0]
    changes = result.traces[0].changes
    assert changes and changes[0].action == "normalised_output" and len(changes[0].items) == 3
    # The session stays usable.
    assert (await agent.run("and now?", session=session)).text == "still fine"


async def test_a_stored_log_that_breaks_the_rules_is_repaired_in_view_with_a_visible_note(
        store: SessionStore, tenant: str) -> None:
    # Written straight to the store, as older data or a bug might have left it.
    await store.append(tenant, "broken", [
        Message.user("first"),
        _call_message(FunctionCall("dup", "lookup", "{}"), FunctionCall("dup", "lookup", "{}")),
        Message("tool", (FunctionResult("dup", "one"),)),
        Message("tool", (FunctionResult("dup", "two"),)),
        Message("tool", (FunctionResult("ghost", "orphan"),)),
        _call_message(FunctionCall("c9", "lookup", "{}")),
        Message.user("a user turn before c9 was answered"),
        Message.assistant("ok"),
    ])
    model = ScriptedModel(["repaired and answering", "again"])
    agent = Agent(model, providers=[History(store)], durability=Durability(store_traces=True))
    session = await agent.session("broken", tenant=tenant)
    before = await agent.history(session)
    for expected in ("repaired and answering", "again"):  # every later run works, not only the first
        result = await agent.run("hello?", session=session)
        assert result.text == expected
    sent = model.requests[0].messages
    assert exchange_problem(sent) is None
    assert [m.role for m in sent] == ["user", "assistant", "tool", "tool", "assistant", "tool", "user",
                                      "assistant", "user"]
    note = result.traces[0].changes[0] if result.traces[0].changes else None
    first_trace = (await store.load_traces(tenant, "broken"))[0]
    assert [c["action"] for c in first_trace["changes"]] == ["repaired_log"]
    notes = first_trace["changes"][0]["items"]
    assert any("used twice" in n for n in notes) and any("'ghost'" in n for n in notes)
    assert any("c9" in n for n in notes)
    assert note is not None and note.action == "repaired_log"
    # The stored log itself is never rewritten.
    assert describe((await agent.history(session))[:len(before)]) == describe(before)


async def test_only_results_of_idempotent_tools_are_written_without_waiting_for_durability() -> None:
    from contextpipe.stores import MemoryStore

    class DurabilityAwareStore(MemoryStore):
        """A store with the ``durable`` option of `SessionStore.append`, recording what it was asked."""

        def __init__(self) -> None:
            super().__init__()
            self.writes: list[tuple[str, bool]] = []

        async def append(self, tenant: str, session_id: str, messages: object, *, lease: object = None,
                         durable: bool = True) -> int:
            self.writes.append(("+".join(m.role for m in messages), durable))  # type: ignore[attr-defined]
            return await super().append(tenant, session_id, messages, lease=lease)  # type: ignore[arg-type]

    @tool(idempotent=True)
    def forecast(city: str) -> str:
        """Read the forecast (safe to run again)."""
        return "sunny"

    @tool
    def book(city: str) -> str:
        """Book a table (not idempotent)."""
        return "booked"

    store = DurabilityAwareStore()
    agent = Agent(ScriptedModel([tool_call("forecast", city="Suzhou"), tool_call("book", city="Suzhou"), "Done."]),
                  tools=[forecast, book], providers=[History(store)])
    session = await agent.session("d")
    await agent.run("Plan my evening", session=session)
    assert store.writes == [("user+assistant", True), ("tool", False), ("assistant", True), ("tool", True),
                            ("assistant", True)]


class Waiting:
    """A model step that says it was called, then waits until the test lets it answer (or cancels the run)."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.answer = asyncio.Event()

    async def __call__(self, request: ModelRequest) -> str:
        self.called.set()
        await self.answer.wait()
        return "too late"


async def test_a_run_cancelled_before_the_first_answer_keeps_the_input_once(store: SessionStore,
                                                                            tenant: str) -> None:
    waiting = Waiting()
    model = ScriptedModel([waiting, "Here is the answer."])
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("interrupted", tenant=tenant)
    run = asyncio.create_task(agent.run("First question", session=session))
    await waiting.called.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = (await store.load(tenant, "interrupted")).messages
    assert [(m.role, m.text) for m in log] == [("user", "First question")]
    lease = await store.try_acquire_lease(tenant, "interrupted", "check", 5.0)
    assert lease is not None  # the interrupted run gave its lease back
    await store.release_lease(lease)

    result = await agent.run("Second question", session=session)
    assert result.text == "Here is the answer."
    assert not any(change.action == "repaired_log" for t in result.traces for change in t.changes)
    sent = [m.text for m in model.requests[-1].messages]
    assert sent == ["First question", "Second question"]
    log = (await store.load(tenant, "interrupted")).messages
    assert [m.text for m in log] == ["First question", "Second question", "Here is the answer."]
    assert exchange_problem(log) is None


async def test_a_run_cancelled_after_the_input_was_saved_stores_it_only_once(store: SessionStore,
                                                                            tenant: str) -> None:
    @tool
    def book(city: str) -> str:
        """Book a table."""
        return "booked"

    waiting = Waiting()
    model = ScriptedModel([tool_call("book", city="Suzhou"), waiting, "Booked."])
    agent = Agent(model, tools=[book], providers=[History(store)])
    session = await agent.session("interrupted-later", tenant=tenant)
    run = asyncio.create_task(agent.run("Book Suzhou", session=session))
    await waiting.called.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    log = (await store.load(tenant, "interrupted-later")).messages
    assert [m.role for m in log] == ["user", "assistant", "tool"]
    assert [m.text for m in log].count("Book Suzhou") == 1
    assert (await agent.run("Thanks", session=session)).text == "Booked."
