"""Seed 003: per-step versus per-run persistence in the weather agent's tool loop."""

from __future__ import annotations

from typing import Any

import pytest

from contextpipe import Agent, Durability, ModelServerError, StepPersisted
from contextpipe.models import ModelRequest
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import RecordingHistory, describe, get_weather_forecast, lookup_location_code

ANSWER = "Sunny and 25 C: a T-shirt and a light windbreaker."


def weather_script(store: MemoryStore, seen: list[int], *, fail_third: bool = False) -> list[Any]:
    """The model calls both tools, then answers; each step notes how many messages are stored."""

    def at_call(step: Any) -> Any:
        async def respond(request: ModelRequest) -> Any:
            seen.append(len((await store.load("default", "s")).messages))
            return step

        return respond

    third: Any = ModelServerError("HTTP 500", status_code=500) if fail_third else ANSWER
    return [
        at_call(tool_call("lookup_location_code", city="Suzhou")),
        at_call(tool_call("get_weather_forecast", location_code="SZ")),
        at_call(third),
    ]


def make_agent(persistence: str, *, fail_third: bool = False) -> tuple[Agent, RecordingHistory, MemoryStore,
                                                                       list[int]]:
    store = MemoryStore()
    seen: list[int] = []
    history = RecordingHistory(store)
    model = ScriptedModel(weather_script(store, seen, fail_third=fail_third))
    agent = Agent(model, tools=[lookup_location_code, get_weather_forecast], providers=[history],
                  durability=Durability(persistence=persistence))  # type: ignore[arg-type]
    return agent, history, store, seen


async def test_per_step_persistence_saves_each_step_as_it_happens() -> None:
    agent, history, _, seen = make_agent("per_step")
    session = await agent.session("s")
    persisted: list[tuple[int, list[str]]] = []
    async for event in agent.stream("What should I wear in Suzhou today?", session=session):
        if isinstance(event, StepPersisted):
            persisted.append((event.step, describe(event.messages)))

    # What each model call finds already stored: the seed's "1 / 3 / 5 messages are loaded" rounds
    # (the seed counts the new user message; here it is stored with the first step).
    assert seen == [0, 3, 5]
    # Saves: the model's output right after each call, each tool result right after it is produced.
    assert [describe(batch) for batch in history.saves] == [
        ["user:What should I wear in Suzhou today?", "assistant:call:lookup_location_code"],
        ["tool:result:SZ"],
        ["assistant:call:get_weather_forecast"],
        ["tool:result:Sunny, 25 C, NW wind 4."],
        [f"assistant:{ANSWER}"],
    ]
    # Regrouped per model call the way the seed prints its rounds (a round's request is the tool
    # result produced before it): user+call, result+call, result+answer.
    saves = [describe(batch) for batch in history.saves]
    assert [saves[0], saves[1] + saves[2], saves[3] + saves[4]] == [
        ["user:What should I wear in Suzhou today?", "assistant:call:lookup_location_code"],
        ["tool:result:SZ", "assistant:call:get_weather_forecast"],
        ["tool:result:Sunny, 25 C, NW wind 4.", f"assistant:{ANSWER}"],
    ]
    assert persisted == [(1, saves[0]), (1, saves[1]), (2, saves[2]), (2, saves[3]), (3, saves[4])]
    assert len(await agent.history(session)) == 6


async def test_per_run_persistence_saves_six_messages_once_at_the_end() -> None:
    agent, history, _, seen = make_agent("per_run")
    session = await agent.session("s")
    result = await agent.run("What should I wear in Suzhou today?", session=session)
    assert result.text == ANSWER
    assert seen == [0, 0, 0]
    assert len(history.saves) == 1
    assert describe(history.saves[0]) == [
        "user:What should I wear in Suzhou today?",
        "assistant:call:lookup_location_code",
        "tool:result:SZ",
        "assistant:call:get_weather_forecast",
        "tool:result:Sunny, 25 C, NW wind 4.",
        f"assistant:{ANSWER}",
    ]


@pytest.mark.parametrize(("persistence", "stored"), [("per_step", 5), ("per_run", 0)])
async def test_model_failure_on_third_call(persistence: str, stored: int) -> None:
    agent, _, _, _ = make_agent(persistence, fail_third=True)
    session = await agent.session("s")
    with pytest.raises(ModelServerError):
        await agent.run("What should I wear in Suzhou today?", session=session)
    log = await agent.history(session)
    assert len(log) == stored
    if persistence == "per_step":
        assert describe(log) == [
            "user:What should I wear in Suzhou today?",
            "assistant:call:lookup_location_code",
            "tool:result:SZ",
            "assistant:call:get_weather_forecast",
            "tool:result:Sunny, 25 C, NW wind 4.",
        ]


async def test_resume_after_failure_continues_from_stored_steps() -> None:
    agent, _, _, _ = make_agent("per_step", fail_third=True)
    session = await agent.session("s")
    with pytest.raises(ModelServerError):
        await agent.run("What should I wear in Suzhou today?", session=session)
    model = agent.model
    assert isinstance(model, ScriptedModel)
    model.enqueue(ANSWER)
    result = await agent.run(None, session=session)
    assert result.text == ANSWER
    assert describe(model.requests[-1].messages)[-1] == "tool:result:Sunny, 25 C, NW wind 4."
    assert len(await agent.history(session)) == 6
