"""Types mypy must infer for structured output (checked by ``mypy``, which lists this folder in its files).

Never run: each line states the type a user's editor and ``mypy --strict`` see. A change that loses the
output type (``RunResult[Any]`` where ``RunResult[City]`` is due) fails ``mypy`` here.
"""

from __future__ import annotations

from typing import assert_type

from pydantic import BaseModel

from contextpipe import Agent, AgentStream, RunResult


class City(BaseModel):
    """A city."""

    name: str


async def typed_results(agent: Agent) -> None:
    """`run` and `stream` carry the output type; without one the output is the text."""
    result = await agent.run("Which city?", output_type=City)
    assert_type(result, RunResult[City])
    assert_type(result.output, City)
    assert_type((await agent.run("Numbers?", output_type=list[int])).output, list[int])
    plain = await agent.run("Hi")
    assert_type(plain, RunResult[str])
    assert_type(plain.output, str)
    stream = agent.stream("Which city?", output_type=City)
    assert_type(stream, AgentStream[City])
    if stream.result is not None:
        assert_type(stream.result.output, City)


def bare(result: RunResult) -> None:
    """A bare `RunResult` annotation (code written before output types) still means text."""
    assert_type(result.output, str)
