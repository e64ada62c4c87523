"""Shared pieces for the agent tests: the seed's weather tools and a history that records saves."""

from __future__ import annotations

from collections.abc import Sequence

from contextpipe import Message, tool
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import Lease

CODES = {"Suzhou": "SZ", "Beijing": "BJ"}
FORECASTS = {"SZ": "Sunny, 25 C, NW wind 4.", "BJ": "Cloudy, 22 C, E wind 3."}


@tool
def lookup_location_code(city: str) -> str:
    """Return the location code for a city name."""
    return CODES[city]


@tool
def get_weather_forecast(location_code: str) -> str:
    """Return the weather forecast for a location code."""
    return FORECASTS[location_code]


class RecordingHistory(History):
    """History that remembers each batch it was asked to save."""

    saves: list[list[Message]]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.saves = []

    async def save(self, session: Session, messages: Sequence[Message], *, lease: Lease | None = None,
                   durable: bool = True) -> None:
        self.saves.append(list(messages))
        await super().save(session, messages, lease=lease, durable=durable)


def describe(messages: Sequence[Message]) -> list[str]:
    """Compact text form of messages: role plus call names / results / text."""
    out = []
    for m in messages:
        if m.function_calls:
            out.append(f"{m.role}:call:" + ",".join(c.name for c in m.function_calls))
        elif m.function_results:
            out.append(f"{m.role}:result:" + ",".join(r.result for r in m.function_results))
        else:
            out.append(f"{m.role}:{m.text}")
    return out
