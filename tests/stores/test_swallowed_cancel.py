"""A run whose cancellation something swallowed still ends at its next step boundary, on every backend.

A driver can swallow a cancellation: redis-py on Python 3.11 awaits its reads with
`asyncio.wait_for`, which returns the read's result instead of raising `CancelledError` when the
read completes as the cancellation arrives. The task is then still being cancelled
(`Task.cancelling()`), but nothing raises. Here a tool swallows it the same way (it catches the
cancellation and returns): the run must not go on to call the model again as if nothing happened.
"""

from __future__ import annotations

import asyncio

import pytest

from contextpipe import Agent, Message, tool
from contextpipe.providers import History
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import describe


async def test_a_run_whose_cancellation_a_call_swallowed_ends_at_the_next_step(
        store: SessionStore, tenant: str) -> None:
    entered = asyncio.Event()

    @tool(idempotent=True)
    async def get_forecast(city: str) -> str:
        """Return today's forecast for a city."""
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "Sunny"  # what a driver that swallows the cancellation does: it returns
        return "never"

    model = ScriptedModel([tool_call("get_forecast", city="Suzhou"), "Sunny today.", "Sunny tomorrow."])
    agent = Agent(model, tools=[get_forecast], providers=[History(store)])
    session = await agent.session("chat", tenant=tenant)
    run = asyncio.create_task(agent.run(Message.user("Weather in Suzhou?"), session=session))
    await entered.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert model.remaining == 2  # the model was not called again after the cancellation
    log = describe(await agent.history(session))
    assert log == ["user:Weather in Suzhou?", "assistant:call:get_forecast", "tool:result:Sunny"]
    # The session is free: the next run takes it at once and goes on from the saved step.
    result = await agent.run(None, session=await agent.session("chat", tenant=tenant))
    assert result.text == "Sunny today."
