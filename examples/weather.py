"""A weather agent to serve: ``contextpipe serve examples.weather:agent`` (from the repository root).

It talks to OpenAI when ``OPENAI_API_KEY`` is set (model ``$OPENAI_MODEL``, default gpt-4o-mini; any
OpenAI-compatible server through ``OPENAI_BASE_URL``), and otherwise to a small offline model that
calls the tools the way a real model would, so it works on a fresh machine without a key.

Sessions go to ``$CONTEXTPIPE_STORE``: a SQLite file (default ``weather.db``), or a
``postgresql://`` or ``redis://`` URL to run several workers or machines on one store.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator

from contextpipe import Agent, Durability, Message, TextDelta, tool
from contextpipe.messages import FunctionCall
from contextpipe.models import ChatModel, ModelRequest, ModelResponse, ModelStreamEvent, ResponseComplete, Usage
from contextpipe.providers import History
from contextpipe.stores import SessionStore

_CODES = {"suzhou": "SZ", "beijing": "BJ", "london": "LDN", "paris": "PAR", "new york": "NYC"}
_FORECASTS = {"SZ": "Sunny, 25 °C, north-west wind force 4.", "BJ": "Cloudy, 22 °C, east wind force 3.",
              "LDN": "Light rain, 14 °C, south-west wind force 3.", "PAR": "Overcast, 17 °C, calm.",
              "NYC": "Clear, 19 °C, west wind force 2."}


@tool(idempotent=True)
def lookup_location_code(city: str) -> str:
    """Return the location code for a city name.

    Args:
        city: The city's name, for example "Suzhou".
    """
    try:
        return _CODES[city.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown city {city!r}; known: {', '.join(sorted(_CODES))}") from None


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


class OfflineWeatherModel:
    """A rule-following stand-in for a real model: looks up the city, fetches the forecast, answers."""

    name = "offline-weather"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer the latest user message, calling the tools first."""
        messages = list(request.messages)
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        results = [r for m in messages[last_user + 1:] for r in m.function_results]
        question = messages[last_user].text if last_user >= 0 else ""
        city = next((c for c in _CODES if re.search(rf"\b{c}\b", question.lower())), None)
        step = len(results)
        usage = Usage(input_tokens=sum(len(m.text) // 4 + 4 for m in messages), output_tokens=12)
        if city is not None and step == 0:
            call = FunctionCall(f"call_{os.urandom(4).hex()}", "lookup_location_code",
                                json.dumps({"city": city.title()}))
            return ModelResponse([Message("assistant", (call,))], usage, "tool_calls", self.name)
        if city is not None and step == 1 and not results[0].is_error:
            call = FunctionCall(f"call_{os.urandom(4).hex()}", "get_weather_forecast",
                                json.dumps({"location_code": results[0].result}))
            return ModelResponse([Message("assistant", (call,))], usage, "tool_calls", self.name)
        if city is not None and step >= 2:
            text = f"Today in {city.title()}: {results[-1].result} Dress for it, and enjoy your day!"
        elif city is not None:
            text = f"I could not find {city.title()}: {results[-1].result}"
        else:
            text = ("I am the offline demo model: ask me about the weather in " + ", ".join(c.title() for c in _CODES)
                    + ". Set OPENAI_API_KEY to talk to a real model.")
        return ModelResponse([Message.assistant(text)], usage, "stop", self.name)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Stream `complete`'s answer word by word."""
        response = await self.complete(request)
        for word in re.findall(r"\S+\s*", response.text):
            yield TextDelta(word)
        yield ResponseComplete(response)


def _model() -> ChatModel:
    if os.environ.get("OPENAI_API_KEY"):
        from contextpipe.models import OpenAIChatModel

        return OpenAIChatModel(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                               base_url=os.environ.get("OPENAI_BASE_URL"))
    return OfflineWeatherModel()


def _store() -> SessionStore:
    where = os.environ.get("CONTEXTPIPE_STORE", "weather.db")
    if where.startswith(("postgres://", "postgresql://")):
        from contextpipe.stores import PostgresStore

        return PostgresStore(where)
    if where.startswith(("redis://", "rediss://")):
        from contextpipe.stores import RedisStore

        # A burst of requests waits for one of the 64 pooled connections instead of failing.
        return RedisStore(where, max_connections=64, pool_timeout=60)
    from contextpipe.stores import SQLiteStore

    return SQLiteStore(where)


agent = Agent(
    _model(),
    name="weather",
    instructions="You are a helpful assistant. Use the tools to check the weather before you answer.",
    tools=[lookup_location_code, get_weather_forecast],
    providers=[History(_store())],
    durability=Durability(store_traces=True),
)
"""The agent ``contextpipe serve examples.weather:agent`` serves."""
