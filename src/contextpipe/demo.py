"""The offline demonstration behind ``contextpipe demo``: no network, no API key.

A weather agent (the seeds' scenario) runs on the deterministic `ScriptedModel`:

1. a tool loop with per-step persistence, showing what is stored after each model call;
2. a model failure on the third call, showing that the completed steps survive it;
3. a resume on the same session that carries on from what was stored.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable

from .agent import Agent, RunResult
from .errors import ModelServerError
from .loop import StepPersisted
from .messages import FunctionCall, FunctionResult, Message, TextPart
from .models.scripted import ScriptedModel, tool_call
from .providers.history import History
from .session import Session
from .stores.sqlite import SQLiteStore
from .tools import tool

__all__ = ["run_demo"]

_CODES = {"suzhou": "SZ", "beijing": "BJ"}
_FORECASTS = {"SZ": "Sunny, 25 °C, north-west wind force 4.", "BJ": "Cloudy, 22 °C, east wind force 3."}


@tool(idempotent=True)
def lookup_location_code(city: str) -> str:
    """Return the location code for a city name.

    Args:
        city: The city's name, for example "Suzhou".
    """
    try:
        return _CODES[city.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown city {city!r}") from None


@tool(idempotent=True)
def get_weather_forecast(location_code: str) -> str:
    """Return today's weather forecast for a location code.

    Args:
        location_code: A code returned by lookup_location_code.
    """
    try:
        return _FORECASTS[location_code]
    except KeyError:
        raise ValueError(f"unknown location code {location_code!r}") from None


def _describe(message: Message) -> str:
    bits = []
    for part in message.parts:
        if isinstance(part, TextPart):
            bits.append(repr(part.text if len(part.text) < 60 else part.text[:57] + "..."))
        elif isinstance(part, FunctionCall):
            bits.append(f"call {part.name}({part.arguments})")
        elif isinstance(part, FunctionResult):
            bits.append(f"result {part.result!r}")
    return f"{message.role:<9} " + ", ".join(bits)


async def _run_showing_steps(agent: Agent, text: str | None, session: Session,
                             say: Callable[[str], None]) -> RunResult:
    """Stream one run, saying what is stored at each step."""
    async with agent.stream(text, session=session) as events:
        async for event in events:
            if isinstance(event, StepPersisted):
                for message in event.messages:
                    say(f"      step {event.step} stored  {_describe(message)}")
    assert events.result is not None
    return events.result


async def run_demo(say: Callable[[str], None] = print, *, db: str | None = None) -> None:
    """Run the demonstration, writing its narration through `say`.

    Sessions go to the SQLite file `db` (a temporary one by default).
    """
    with tempfile.TemporaryDirectory(prefix="contextpipe-demo-") as tmp:
        async with SQLiteStore(db or os.path.join(tmp, "demo.db")) as store:
            await _demo(store, say)


async def _demo(store: SQLiteStore, say: Callable[[str], None]) -> None:
    question = "What should I wear in Suzhou today?"
    answer = "Sunny and 25 °C with some wind: a T-shirt or light shirt, plus a thin windbreaker."
    model = ScriptedModel([
        tool_call("lookup_location_code", city="Suzhou"),
        tool_call("get_weather_forecast", location_code="SZ"),
        answer,
    ])
    agent = Agent(
        model,
        instructions="You are a helpful assistant. Use the tools to check the weather.",
        tools=[lookup_location_code, get_weather_forecast],
        providers=[History(store)],
    )

    say(f"Sessions are stored in SQLite ({store.path}).")
    say("")
    say("1. A tool loop with per-step persistence: each step is stored as soon as it happens.")
    session = await agent.session("demo-1")
    say(f"   user: {question}")
    result = await _run_showing_steps(agent, question, session, say)
    say(f"   answer after {result.steps} model calls: {result.text}")
    say(f"   the session log now holds {len(await agent.history(session))} messages.")

    say("")
    say("2. The model fails on its third call (HTTP 500): the two completed steps are already stored.")
    model.enqueue(
        tool_call("lookup_location_code", city="Beijing"),
        tool_call("get_weather_forecast", location_code="BJ"),
        ModelServerError("simulated outage: HTTP 500", provider="demo", status_code=500),
    )
    crashed = await agent.session("demo-2")
    try:
        await _run_showing_steps(agent, "And in Beijing?", crashed, say)
    except ModelServerError as exc:
        say(f"   the run failed: {exc}")
    say(f"   stored after the failure: {len(await agent.history(crashed))} messages, nothing lost.")

    say("")
    say("3. Resume: a new run on the same session continues from the stored steps, without redoing them.")
    model.enqueue("Beijing is cloudy at 22 °C: a long-sleeved shirt and a light jacket.")
    resumed = await agent.run(None, session=crashed)
    say(f"   answer: {resumed.text}")
    sent = model.requests[-1].messages
    say(f"   the model was sent the {len(sent)} stored messages; tools run in this run: "
        f"{sum(1 for m in resumed.messages if m.role == 'tool')}.")


def main() -> None:
    """Run the demonstration on stdout."""
    asyncio.run(run_demo())
