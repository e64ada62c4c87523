"""Structured output (``output_type=``): the schema each vendor gets, validation, retries, the stored log."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

from contextpipe import Agent, Message, OutputValidationError, UsageError, tool
from contextpipe.models import AnthropicChatModel, OpenAIChatModel, OpenAIResponsesModel
from contextpipe.providers import History
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.testing import AnthropicReply, FakeAnthropicServer, FakeOpenAIServer, FakeReply, ScriptedModel
from contextpipe.testing.wire import assert_messages_request, assert_responses_request


class City(BaseModel):
    """A city."""

    name: str
    population: int


CITY_SCHEMA = {"type": "object", "title": "City", "description": "A city.", "additionalProperties": False,
               "properties": {"name": {"title": "Name", "type": "string"},
                              "population": {"title": "Population", "type": "integer"}},
               "required": ["name", "population"]}
VALID = '{"name": "Suzhou", "population": 12740000}'
SUZHOU = City(name="Suzhou", population=12740000)


@tool
def lookup_population(city: str) -> int:
    """Return the population of a city."""
    return 12740000


async def test_openai_chat_is_sent_a_strict_json_schema_and_the_answer_is_validated(
        fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(tool_calls=(("lookup_population", '{"city": "Suzhou"}'),)), FakeReply(VALID))
    model = OpenAIChatModel("gpt-fake", base_url=fake_openai.base_url, api_key="sk-test", max_retries=0)
    try:
        result = await Agent(model, tools=[lookup_population]).run("Suzhou?", output_type=City)
    finally:
        await model.close()
    assert result.output == SUZHOU
    for body in fake_openai.requests:  # tools and the format go together, on every call of the run
        assert body["response_format"] == {"type": "json_schema",
                                           "json_schema": {"name": "City", "schema": CITY_SCHEMA, "strict": True}}
    assert [t["function"]["name"] for t in fake_openai.requests[0]["tools"]] == ["lookup_population"]


async def test_openai_responses_is_sent_text_format(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(VALID))
    model = OpenAIResponsesModel("gpt-fake", base_url=fake_openai.base_url, api_key="sk-test", max_retries=0)
    try:
        result = await Agent(model).run("Suzhou?", output_type=City)
    finally:
        await model.close()
    body = fake_openai.requests[0]
    assert_responses_request(body)
    assert body["text"]["format"] == {"type": "json_schema", "name": "City", "schema": CITY_SCHEMA, "strict": True}
    assert result.output == SUZHOU


async def test_anthropic_is_sent_output_config_format() -> None:
    with FakeAnthropicServer() as fake:
        fake.enqueue(AnthropicReply(VALID))
        model = AnthropicChatModel("claude-fake", base_url=fake.base_url, api_key="sk-test", max_retries=0)
        try:
            result = await Agent(model).run("Suzhou?", output_type=City)
        finally:
            await model.close()
    body = fake.requests[0]
    assert_messages_request(body)
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": CITY_SCHEMA}}
    assert result.output == SUZHOU


async def test_an_invalid_answer_is_sent_back_once_and_every_attempt_is_in_the_log(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "agent.db")
    model = ScriptedModel(['{"name": "Suzhou"}', VALID])
    agent = Agent(model, providers=[History(store)])
    session = await agent.session("chat")
    result = await agent.run("Which city?", session=session, output_type=City)
    assert result.output == SUZHOU
    assert result.steps == 2
    # The second call saw the first answer and what was wrong with it.
    correction = model.requests[1].messages[-1]
    assert correction.role == "user" and "population" in correction.text and "Field required" in correction.text
    assert [c.items for t in result.traces for c in t.changes if c.source_id == "output"] == [
        ("attempt 1: 1 error(s); sent back to the model",), ("attempt 2 validated as City",)]
    reopened = Agent(ScriptedModel([]), providers=[History(SQLiteStore(tmp_path / "agent.db"))])
    log = await reopened.history(await reopened.session("chat"))
    assert [(m.role, m.metadata.get("output"), m.text[:18]) for m in log] == [
        ("user", None, "Which city?"), ("assistant", "invalid", '{"name": "Suzhou"}'),
        ("user", "correction", "Your answer is not"), ("assistant", None, VALID[:18])]
    assert [m.source.kind if m.source else None for m in result.messages] == ["model", "tool", "model"]


async def test_retries_run_out_with_the_last_answer_and_its_errors() -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel(["Suzhou, of course.", '{"name": 3}', VALID]), providers=[History(store)])
    session = await agent.session("chat")
    with pytest.raises(OutputValidationError) as caught:
        await agent.run("Which city?", session=session, output_type=City, output_retries=1)
    error = caught.value
    assert error.raw == '{"name": 3}' and error.attempts == 2
    assert "population" in error.errors and "name" in error.errors
    assert "output_retries" in str(error)
    result = error.result
    assert result is not None and result.text == '{"name": 3}'
    with pytest.raises(UsageError, match="no answer matched"):
        _ = result.output
    log = await agent.history(session)  # the run completed and was saved: both answers, one correction
    assert [m.metadata.get("output") for m in log] == [None, "invalid", "correction", None]
    assert result.traces[-1].changes[-1].items == ("attempt 2: 2 error(s); no retries left",)


async def test_no_retries_means_one_answer() -> None:
    model = ScriptedModel(["not json"])
    with pytest.raises(OutputValidationError, match="1 attempt"):
        await Agent(model).run("Which city?", output_type=City, output_retries=0)
    assert len(model.requests) == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(invalid=st.lists(st.sampled_from(["", "{}", "[1]", '{"name": "x"}', "Suzhou"]), max_size=4),
       retries=st.integers(0, 4))
async def test_the_answer_validates_exactly_when_it_comes_within_the_retries(invalid: list[str], retries: int) -> None:
    store = MemoryStore()
    agent = Agent(ScriptedModel([*invalid, VALID]), providers=[History(store)])
    session = await agent.session("chat")
    run = agent.run("Which city?", session=session, output_type=City, output_retries=retries)
    if len(invalid) > retries:
        with pytest.raises(OutputValidationError) as caught:
            await run
        assert caught.value.attempts == retries + 1
        answers = retries + 1
    else:
        result = await run
        assert result.output == SUZHOU and result.steps == len(invalid) + 1
        answers = len(invalid) + 1
    log = await agent.history(session)
    # Every answer is kept; each one sent back is followed by its correction.
    assert sum(m.role == "assistant" for m in log) == answers
    assert sum(m.metadata.get("output") == "correction" for m in log) == answers - 1


@dataclasses.dataclass
class Point:
    """A point."""

    x: int
    y: int


class Person(TypedDict):
    """A person."""

    name: str


async def test_dataclasses_typed_dicts_and_plain_types() -> None:
    assert (await Agent(ScriptedModel(['{"x": 1, "y": 2}'])).run("p", output_type=Point)).output == Point(1, 2)
    assert (await Agent(ScriptedModel(['{"name": "Ada"}'])).run("p", output_type=Person)).output == {"name": "Ada"}
    model = ScriptedModel(['{"response": [1, 2]}', "[3]", "```json\n[4, 5]\n```"])
    agent = Agent(model)
    assert (await agent.run("p", output_type=list[int])).output == [1, 2]
    assert (await agent.run("p", output_type=list[int])).output == [3]  # the wrapper left out
    assert (await agent.run("p", output_type=list[int])).output == [4, 5]  # in a code fence
    sent = model.requests[0].settings["response_format"]["json_schema"]
    assert sent["schema"] == {"type": "object", "properties": {"response": {"type": "array",
                              "items": {"type": "integer"}}}, "required": ["response"], "additionalProperties": False}
    assert sent["strict"] is True and sent["name"] == "list"
    text_model = ScriptedModel(["just text"])
    plain = await Agent(text_model).run("p", output_type=str)
    assert plain.output == "just text" and "response_format" not in text_model.requests[0].settings


async def test_a_schema_with_optional_fields_is_not_sent_strict() -> None:
    class Draft(BaseModel):
        title: str
        notes: str = ""

    model = ScriptedModel(['{"title": "t"}'])
    assert (await Agent(model).run("p", output_type=Draft)).output == Draft(title="t")
    assert model.requests[0].settings["response_format"]["json_schema"]["strict"] is False


async def test_stream_streams_every_attempt_and_ends_with_the_output() -> None:
    agent = Agent(ScriptedModel(['{"name": "Suzhou"}', VALID]))
    async with agent.stream("Which city?", output_type=City) as events:
        text = "".join([e.text async for e in events if e.kind == "text_delta"])
    assert text == '{"name": "Suzhou"}' + VALID
    assert events.result is not None and events.result.output == SUZHOU


async def test_a_run_waiting_for_approval_has_no_output_until_resumed() -> None:
    @tool(needs_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        return "booked"

    from contextpipe.testing import tool_call

    agent = Agent(ScriptedModel([tool_call("book", city="Suzhou"), VALID]), tools=[book])
    session = await agent.session("chat")
    paused = await agent.run("Book Suzhou", session=session, output_type=City)
    assert paused.stop_reason == "approval_required"
    with pytest.raises(UsageError, match="approval_required"):
        _ = paused.output
    call_id = paused.pending_approvals[0].call_id
    done = await agent.run(None, session=session, approvals={call_id: paused.pending_approvals[0].approve()},
                           output_type=City)
    assert done.output == SUZHOU


async def test_a_retried_input_gives_back_the_validated_output() -> None:
    agent = Agent(ScriptedModel(['{"name": "Suzhou"}', VALID]))
    session = await agent.session("chat")
    message = Message.user("Which city?")
    first = await agent.run(message, session=session, output_type=City)
    again = await agent.run(message, session=session, output_type=City)  # a client's retry: same message id
    assert again.replayed and again.output == first.output == SUZHOU
    assert again.text == VALID  # the answer that validated, not the one sent back


async def test_bad_arguments_are_usage_errors() -> None:
    agent = Agent(ScriptedModel([VALID]))
    with pytest.raises(UsageError, match="output_retries"):
        await agent.run("p", output_type=City, output_retries=-1)
    with pytest.raises(UsageError, match="cannot be described as a JSON schema"):
        await agent.run("p", output_type=json.JSONDecoder)


def test_output_type_needs_no_pydantic_import_for_plain_runs() -> None:
    import subprocess
    import sys

    code = ("import sys, asyncio\nfrom contextpipe import Agent\nfrom contextpipe.testing import ScriptedModel\n"
            "asyncio.run(Agent(ScriptedModel(['hi']), default_history=False).run('x'))\n"
            "print('contextpipe.output' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
