from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from contextpipe import Tool, UsageError, tool


@tool
def get_weather_forecast(location_code: str, days: int = 1, unit: Literal["C", "F"] = "C") -> str:
    """Return the weather forecast for a location.

    Longer explanation that is still part of the description.

    Args:
        location_code: Code from lookup_location_code,
            for example "SZ".
        days: How many days to forecast.
    """
    return f"{location_code}:{days}:{unit}"


class Point(BaseModel):
    x: int
    y: int


@tool(idempotent=True, timeout=5)
async def distance(a: Point, b: Annotated[Point, Field(description="The other point.")]) -> float:
    """Distance between two points."""
    return float(((a.x - b.x) ** 2 + (a.y - b.y) ** 2) ** 0.5)


def test_schema_from_signature_and_docstring() -> None:
    t = get_weather_forecast
    assert t.name == "get_weather_forecast"
    assert t.description == (
        "Return the weather forecast for a location.\n\nLonger explanation that is still part of the description."
    )
    props = t.parameters["properties"]
    assert props["location_code"] == {
        "type": "string", "description": 'Code from lookup_location_code, for example "SZ".'}
    assert props["days"] == {"type": "integer", "default": 1, "description": "How many days to forecast."}
    assert props["unit"]["enum"] == ["C", "F"]
    assert t.parameters["required"] == ["location_code"]
    assert t.parameters["additionalProperties"] is False
    assert t.idempotent is False and t.timeout is None


def test_nested_models_and_annotated_descriptions() -> None:
    schema = distance.parameters
    assert schema["properties"]["b"]["description"] == "The other point."
    assert "Point" in schema["$defs"]
    assert distance.idempotent is True and distance.timeout == 5


def sphinx_forecast(city: str, days: int = 1) -> str:
    """Return the forecast for a city.

    Uses the regional service.

    :param city: The city's name,
        for example "Suzhou".
    :param days: How many days to forecast.
    :returns: The forecast as text.
    :raises ValueError: For an unknown city.
    """
    return city


def numpy_forecast(city: str, days: int = 1) -> str:
    """Return the forecast for a city.

    Uses the regional service.

    Parameters
    ----------
    city : str
        The city's name,
        for example "Suzhou".
    days : int, optional
        How many days to forecast.

    Returns
    -------
    str
        The forecast as text.
    """
    return city


def google_forecast(city: str, days: int = 1) -> str:
    """Return the forecast for a city.

    Uses the regional service.

    Args:
        city (str): The city's name,
            for example "Suzhou".
        days: How many days to forecast.

    Returns:
        The forecast as text.
    """
    return city


@pytest.mark.parametrize("fn", [sphinx_forecast, numpy_forecast, google_forecast])
def test_parameter_descriptions_from_every_docstring_style(fn: object) -> None:
    t = Tool(fn)  # type: ignore[arg-type]
    assert t.description == "Return the forecast for a city.\n\nUses the regional service."
    props = t.parameters["properties"]
    assert props["city"]["description"] == 'The city\'s name, for example "Suzhou".'
    assert props["days"]["description"] == "How many days to forecast."
    assert "Returns" not in t.description and ":param" not in t.description and "----" not in t.description


def test_docstring_without_sections_is_the_description() -> None:
    def plain(x: int) -> int:
        """Double a number.

        Note: the result may overflow nothing: Python ints are unbounded.
        """
        return 2 * x

    t = Tool(plain)
    assert t.description == "Double a number.\n\nNote: the result may overflow nothing: Python ints are unbounded."
    assert "description" not in t.parameters["properties"]["x"]


async def test_valid_call_returns_text() -> None:
    outcome = await get_weather_forecast.invoke('{"location_code": "SZ", "days": 2}')
    assert (outcome.result, outcome.is_error) == ("SZ:2:C", False)
    outcome = await distance.invoke('{"a": {"x": 0, "y": 0}, "b": {"x": 3, "y": 4}}')
    assert outcome.result == "5.0"


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ('{"location_code": "SZ"', "not valid JSON"),
        ("location_code=SZ", "not valid JSON"),
        ('{"days": 2}', "location_code: Field required"),
        ('{"location_code": "SZ", "days": "many"}', "days: Input should be a valid integer"),
        ('{"location_code": "SZ", "unit": "K"}', "unit: Input should be 'C' or 'F'"),
        ('{"location_code": "SZ", "colour": "red"}', "colour: Extra inputs are not permitted"),
    ],
)
async def test_invalid_arguments_become_error_results(arguments: str, fragment: str) -> None:
    outcome = await get_weather_forecast.invoke(arguments)
    assert outcome.is_error
    assert fragment in outcome.result
    assert "get_weather_forecast" in outcome.result


async def test_empty_arguments_mean_no_arguments() -> None:
    @tool
    def now() -> str:
        """Current time."""
        return "noon"

    assert (await now.invoke("")).result == "noon"
    assert (await now.invoke("null")).result == "noon"


async def test_exception_inside_tool_becomes_error_result() -> None:
    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"boom: {reason}")

    outcome = await explode.invoke('{"reason": "disk full"}')
    assert outcome.is_error
    assert outcome.result == "Error: tool 'explode' raised RuntimeError: boom: disk full"


async def test_timeout_applies_to_async_and_sync_tools() -> None:
    @tool(timeout=0.05)
    async def slow_async() -> str:
        """Sleeps."""
        await asyncio.sleep(5)
        return "late"

    @tool(timeout=0.05)
    def slow_sync() -> str:
        """Sleeps in a thread."""
        time.sleep(1.0)
        return "late"

    for t in (slow_async, slow_sync):
        started = time.perf_counter()
        outcome = await t.invoke("{}")
        assert outcome.is_error and "did not finish within 0.05 s" in outcome.result
        assert time.perf_counter() - started < 0.8  # abandoned, not awaited to the end


async def test_sync_tools_run_in_a_worker_thread_unless_told_not_to() -> None:
    seen: list[str] = []

    def where() -> str:
        """Report the thread."""
        seen.append(threading.current_thread().name)
        return "ok"

    await Tool(where).invoke("{}")
    await Tool(where, run_in_thread=False).invoke("{}")
    assert seen[0] != threading.main_thread().name
    assert seen[1] == threading.main_thread().name


async def test_non_string_results_are_json() -> None:
    @tool
    def data() -> dict[str, object]:
        """Returns a dict."""
        return {"temp": 25, "sky": "sunny"}

    assert (await data.invoke("{}")).result == '{"temp": 25, "sky": "sunny"}'


def test_bad_definitions_are_usage_errors() -> None:
    def star(*args: int) -> None:
        """Varargs."""

    with pytest.raises(UsageError, match=r"\*args"):
        tool(star)
    with pytest.raises(UsageError, match="tool name 'has space'"):
        tool(name="has space")(lambda: None)
