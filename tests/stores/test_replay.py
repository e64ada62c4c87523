"""A retried input is answered once, on every backend: the same message twice runs once, at once too.

Seed 001 (the Rust port's run lifecycle, "完整的 Agent run() 生命周期"): ``agent.run(messages, options)``
goes first to ``session.touch_request_hash(messages)``, before any provider or model call, so a
request seen before is not run again. MAF has no such step (microsoft/agent-framework#3657: the same
input sent twice gets two answers); contextpipe keys it on the input message's id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, HistoryPolicy, InputConflict, Message, RunDone, RunLimits, RunResult, tool
from contextpipe.models import ModelRequest, ModelResponse
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SessionStore
from contextpipe.testing import ScriptedModel, tool_call

QUESTION = "What should I wear in Suzhou today?"


@tool
def lookup_location_code(city: str) -> str:
    """Return the location code for a city name."""
    return "SZ"


def weather_agent(store: SessionStore, model: Any, **kwargs: Any) -> Agent:
    return Agent(model, tools=[lookup_location_code], providers=[History(store)], **kwargs)


def same_result(a: RunResult, b: RunResult) -> None:
    assert (b.text, b.stop_reason) == (a.text, a.stop_reason)
    assert b.messages == a.messages
    assert b.input == a.input


def counting(store: SessionStore, name: str) -> list[tuple[Any, ...]]:
    """Record each call of the store's method `name` (the store itself still does the work)."""
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., Awaitable[Any]] = getattr(store, name)

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await real(*args, **kwargs)

    setattr(store, name, counted)
    return calls


async def test_the_same_message_sent_twice_is_answered_once(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle: ``agent.run`` → ``session.touch_request_hash(messages)`` first.

    The second send of the same message (same id) is a retry: it returns the first answer from the
    log, marked replayed, with no model call and nothing stored (MAF agent-framework#3657 runs it twice).
    """
    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Suzhou (SZ): sunny, wear linen."])
    agent = weather_agent(store, model)
    session = await agent.session("replay-twice", tenant=tenant)
    question = Message.user(QUESTION)
    first = await agent.run(question, session=session)
    log = await agent.history(session)
    version = (await store.get_session(tenant, session.id)).version  # type: ignore[union-attr]

    again = await agent.run(question, session=await agent.session("replay-twice", tenant=tenant))

    assert len(model.requests) == 2  # the first run's two calls; none for the retry
    assert not first.replayed and again.replayed
    same_result(first, again)
    assert (again.steps, again.traces, again.usage.input_tokens) == (0, [], 0)
    assert await agent.history(session) == log  # nothing more stored
    assert (await store.get_session(tenant, session.id)).version == version  # type: ignore[union-attr]


async def test_a_run_stopped_at_its_step_limit_replays_with_that_stop_reason(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` before the run): the earlier result is the
    whole result, its stop reason too: a run cut short at ``max_steps`` replays as ``max_steps``."""
    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"),
                           tool_call("lookup_location_code", city="Suzhou")])
    agent = weather_agent(store, model, limits=RunLimits(max_steps=1))
    session = await agent.session("replay-limit", tenant=tenant)
    question = Message.user(QUESTION)
    first = await agent.run(question, session=session)
    again = await agent.run(question, session=session)

    assert first.stop_reason == "max_steps" and again.replayed
    same_result(first, again)
    assert len(model.requests) == 2


async def test_a_streamed_retry_yields_only_the_replayed_result(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` before the run): a retry through
    ``agent.stream`` replays too: no deltas, no steps, one `RunDone` with the earlier result."""
    model = ScriptedModel(["Sunny."])
    agent = weather_agent(store, model)
    session = await agent.session("replay-stream", tenant=tenant)
    question = Message.user(QUESTION)
    first = await agent.run(question, session=session)
    events = [e async for e in agent.stream(question, session=session)]
    assert len(events) == 1 and isinstance(events[0], RunDone) and events[0].result.replayed
    same_result(first, events[0].result)


TURNS = st.lists(st.tuples(st.integers(0, 3), st.sampled_from([None, 1, 2])), min_size=1, max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=TURNS, pick=st.integers(0, 4))
async def test_property_any_earlier_turn_replays_exactly(turns: list[tuple[int, int | None]], pick: int) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` first): whatever the turns were (tool loops
    of any length, some cut at a step limit), retrying any earlier turn returns exactly its result,
    with no model call and nothing stored."""
    def plan(request: ModelRequest) -> Any:
        """Call the tool until the turn's number of steps is reached (or the tools are withdrawn), then answer."""
        users = [i for i, m in enumerate(request.messages) if m.role == "user"]
        n = int(request.messages[users[-1]].text.split()[-1])
        done = sum(1 for m in request.messages[users[-1]:] if m.role == "tool")
        more = done < turns[n][0] and request.tools
        return tool_call("lookup_location_code", city=f"c{n}") if more else f"answer {n}"

    store = MemoryStore()
    model = ScriptedModel([plan] * 40)
    session = await weather_agent(store, model).session("replay-property")
    results: list[tuple[Message, RunResult]] = []
    for n, (_, limit) in enumerate(turns):
        agent = weather_agent(store, model, limits=RunLimits(max_steps=limit or 10))
        question = Message.user(f"question {n}")
        results.append((question, await agent.run(question, session=session)))
    log, calls = await store.load("default", session.id), len(model.requests)
    question, first = results[pick % len(results)]
    again = await weather_agent(store, model).run(question, session=session)
    assert again.replayed
    same_result(first, again)
    assert len(model.requests) == calls
    assert (await store.load("default", session.id)).messages == log.messages


async def test_the_same_id_with_other_content_is_refused(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle: ``touch_request_hash(messages)`` tells a retry from a new request;
    a message id reused for another question is neither, and is refused rather than answered wrongly."""
    model = ScriptedModel(["Sunny."])
    agent = weather_agent(store, model)
    session = await agent.session("replay-conflict", tenant=tenant)
    await agent.run(Message.user(QUESTION, id="msg-client-1"), session=session)
    log = await agent.history(session)

    with pytest.raises(InputConflict, match="already in session 'replay-conflict', but not as this input"):
        await agent.run(Message.user("And tomorrow?", id="msg-client-1"), session=session)
    assert len(model.requests) == 1
    assert await agent.history(session) == log


async def test_new_input_costs_no_lookup_for_text_and_one_for_a_message(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle: the request check before each run must cost nothing for a new input:
    text gets an id made for the run (no lookup), a message given with its id one indexed lookup."""
    model = ScriptedModel(["One.", "Two."])
    agent = weather_agent(store, model)
    session = await agent.session("replay-cost", tenant=tenant)
    lookups = counting(store, "message_seq")
    await agent.run(QUESTION, session=session)
    assert lookups == []
    await agent.run(Message.user("And tomorrow?"), session=session)
    assert len(lookups) == 1


async def test_two_identical_requests_at_once_make_one_model_call(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` first, under the session): two identical
    requests at once, the second waiting for the session (``lease_wait``), make one model call, and
    both get the same result."""
    entered, release = asyncio.Event(), asyncio.Event()
    calls = 0

    async def answer(request: ModelRequest) -> ModelResponse:
        nonlocal calls
        calls += 1
        entered.set()
        await release.wait()
        return ModelResponse([Message.assistant(f"answer {calls}")], finish_reason="stop")

    model = ScriptedModel([answer, answer])
    agent = weather_agent(store, model)
    await agent.session("replay-race", tenant=tenant)
    busy = asyncio.Event()
    real_try = store.try_acquire_lease

    async def try_acquire(*args: Any, **kwargs: Any) -> Any:
        lease = await real_try(*args, **kwargs)
        if lease is None:
            busy.set()  # the second request found the session held and waits for it
        return lease

    store.try_acquire_lease = try_acquire  # type: ignore[method-assign]
    question = Message.user(QUESTION)

    async def send() -> RunResult:
        return await agent.run(question, session=await agent.session("replay-race", tenant=tenant), lease_wait=60)

    first = asyncio.ensure_future(send())
    await entered.wait()
    second = asyncio.ensure_future(send())
    await busy.wait()
    release.set()
    a, b = await asyncio.gather(first, second)

    assert calls == 1
    assert a.text == "answer 1" and not a.replayed and b.replayed
    same_result(a, b)
    log = await agent.history(await agent.session("replay-race", tenant=tenant))
    assert [(m.role, m.text) for m in log] == [("user", QUESTION), ("assistant", "answer 1")]


async def test_a_retry_of_an_interrupted_run_resumes_it(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` first): a retry of a run stopped before its
    answer (a cancelled task here; a killed process in test_processes) resumes it: the stored call
    is answered, the model is asked once more, and the input is neither sent nor stored twice."""
    started = asyncio.Event()

    @tool(idempotent=True)
    async def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        if not started.is_set():
            started.set()
            await asyncio.Event().wait()  # the first run is stopped here
        return "SZ"

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Suzhou (SZ): sunny."])
    agent = Agent(model, tools=[lookup_location_code], providers=[History(store)])
    session = await agent.session("replay-resume", tenant=tenant)
    question = Message.user(QUESTION)
    interrupted = asyncio.ensure_future(agent.run(question, session=session))
    await started.wait()
    interrupted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await interrupted

    result = await agent.run(question, session=await agent.session("replay-resume", tenant=tenant))

    resumed = model.requests[-1].messages
    assert [m.id for m in resumed].count(question.id) == 1  # the model sees the question once
    assert [m.role for m in result.messages] == ["assistant", "tool", "assistant"]
    assert [m.id for m in result.input] == [question.id]
    assert not result.replayed and result.text == "Suzhou (SZ): sunny."
    log = await agent.history(session)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"]
    again = await agent.run(question, session=session)
    assert again.replayed
    same_result(result, again)


async def test_an_interrupted_run_followed_by_others_is_refused(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle: a retry of a run that was interrupted and then buried by later runs
    cannot be resumed (the log only grows) nor replayed (it has no answer): it is refused, clearly."""
    started = asyncio.Event()

    @tool
    async def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        started.set()
        await asyncio.Event().wait()
        return "SZ"

    model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Noted.", "Never."])
    agent = Agent(model, tools=[lookup_location_code], providers=[History(store)])
    session = await agent.session("replay-buried", tenant=tenant)
    question = Message.user(QUESTION)
    interrupted = asyncio.ensure_future(agent.run(question, session=session))
    await started.wait()
    interrupted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await interrupted
    await agent.run("Something else.", session=session)

    with pytest.raises(InputConflict, match="interrupted before its answer and later runs followed it"):
        await agent.run(question, session=session)
    assert len(model.requests) == 2


async def test_a_replay_ends_at_its_own_answer_when_a_resume_followed(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` first): the earlier result is that run's,
    not the session's since: a later ``run(None)`` (a run with no input message of its own) added a
    model answer right after it, and the retry still gets only the first answer."""
    model = ScriptedModel(["Sunny.", "Still sunny."])
    agent = weather_agent(store, model)
    session = await agent.session("replay-then-resume", tenant=tenant)
    question = Message.user(QUESTION)
    first = await agent.run(question, session=session)
    resumed = await agent.run(None, session=session)
    assert resumed.text == "Still sunny."

    again = await agent.run(question, session=session)

    assert again.replayed and again.text == "Sunny."
    same_result(first, again)
    assert len(model.requests) == 2


async def test_a_retry_that_sends_the_history_again_is_replayed(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash(messages)``: the request is all its messages):
    a client that sends its earlier messages along with the new one (as AG-UI clients send the whole
    conversation) is answered once; only the new message was stored, the earlier ones are the stored
    ones. One of them changed under its id is not the same request, and is refused."""
    model = ScriptedModel(["Sunny.", "Rain tomorrow."])
    agent = weather_agent(store, model)
    session = await agent.session("replay-history", tenant=tenant)
    question, follow_up = Message.user(QUESTION), Message.user("And tomorrow?")
    await agent.run(question, session=session)
    second = await agent.run([question, follow_up], session=session)
    log = await agent.history(session)

    again = await agent.run([question, follow_up], session=session)

    assert again.replayed and again.text == "Rain tomorrow."
    assert [m.id for m in again.input] == [question.id, follow_up.id]
    assert again.messages == second.messages
    assert len(model.requests) == 2
    changed = Message.user("What should I wear in Beijing?", id=question.id)
    with pytest.raises(InputConflict, match="but not as this input"):
        await agent.run([changed, follow_up], session=session)
    with pytest.raises(InputConflict, match="but not as this input"):
        await agent.run([Message.user("never sent"), follow_up], session=session)
    assert await agent.history(session) == log


async def test_a_run_longer_than_one_page_replays_whole(store: SessionStore, tenant: str) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` first): the earlier result is read back
    page by page, so a long tool loop (81 messages, past the first page read) comes back whole."""
    model = ScriptedModel([*[tool_call("lookup_location_code", city=f"c{i}") for i in range(40)], "Done."])
    agent = weather_agent(store, model, limits=RunLimits(max_steps=50))
    session = await agent.session("replay-long", tenant=tenant)
    question = Message.user(QUESTION)
    first = await agent.run(question, session=session)
    again = await agent.run(question, session=session)
    assert len(first.messages) == 81 and again.replayed
    same_result(first, again)


def _no_tool_messages(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if m.role != "tool"]


@pytest.mark.parametrize("policy", [HistoryPolicy(store_outputs=False),
                                    HistoryPolicy(store_response_filter=_no_tool_messages)],
                         ids=["no-outputs", "filtered-outputs"])
async def test_a_history_that_does_not_keep_every_answer_is_not_replayed(store: SessionStore, tenant: str,
                                                                        policy: HistoryPolicy) -> None:
    """Seed 001, the run lifecycle (``touch_request_hash`` first) needs a log that tells what each run
    was: a history storing no answers (or filtered ones) would make an answered run look interrupted
    (resumed, or refused once other runs followed), so its retries simply run again."""
    model = ScriptedModel(["A1", "A2", "A3"])
    agent = Agent(model, providers=[History(store, policy=policy)])
    session = await agent.session("replay-no-outputs", tenant=tenant)
    question = Message.user(QUESTION)
    await agent.run(question, session=session)
    await agent.run("Something else.", session=session)
    lookups = counting(store, "message_seq")

    again = await agent.run(question, session=session)

    assert not again.replayed and again.text == "A3"
    assert lookups == []


async def test_after_a_regenerate_a_retry_gets_the_new_answer(store: SessionStore, tenant: str) -> None:
    """A retry is answered from the view: the answer a rewind left out is never given back."""
    agent = weather_agent(store, ScriptedModel(["Wear linen.", "Wear cotton."]))
    session = await agent.session("replay-regenerated", tenant=tenant)
    question = Message.user(QUESTION)
    await agent.run(question, session=session)
    regenerated = await agent.regenerate(session.id, tenant=tenant)
    again = await agent.run(question, session=await agent.session(session.id, tenant=tenant))
    assert again.replayed and again.text == regenerated.text == "Wear cotton."


async def test_a_retry_of_a_rewound_input_is_refused(store: SessionStore, tenant: str) -> None:
    agent = weather_agent(store, ScriptedModel(["Wear linen.", "Take an umbrella."]))
    session = await agent.session("replay-edited", tenant=tenant)
    question = Message.user(QUESTION)
    await agent.run(question, session=session)
    await agent.edit(session.id, 1, "Will it rain in Suzhou?", tenant=tenant)
    log = await agent.history(session)
    with pytest.raises(InputConflict, match="was rewound"):
        await agent.run(question, session=await agent.session(session.id, tenant=tenant))
    assert await agent.history(session) == log


async def test_a_retry_past_a_rewound_range_longer_than_a_page_gets_the_new_answer(store: SessionStore,
                                                                                  tenant: str) -> None:
    """The rewound tool loop (81 messages) is longer than a page read: the replay pages over it to the answer."""
    model = ScriptedModel([*[tool_call("lookup_location_code", city=f"c{i}") for i in range(40)], "Done.", "Again."])
    agent = weather_agent(store, model, limits=RunLimits(max_steps=50))
    session = await agent.session("replay-long-rewound", tenant=tenant)
    question = Message.user(QUESTION)
    first = await agent.run(question, session=session)
    regenerated = await agent.regenerate(session.id, tenant=tenant)
    again = await agent.run(question, session=await agent.session(session.id, tenant=tenant))
    assert len(first.messages) == 81 and again.replayed
    assert again.text == regenerated.text == "Again." and again.messages == regenerated.messages
