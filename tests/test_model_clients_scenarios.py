"""The vendor clients in whole runs: seed 003 on every client, crash and resume, compaction, switching vendors.

Every request goes through the official SDK to a local fake server that checks it the way the
vendor's API does, and is also checked against the SDK's typed request schema.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from contextpipe import Agent, Message, ModelServerError, StepPersisted
from contextpipe.errors import ModelAuthError, ModelBadRequest, ModelError, ModelRateLimited
from contextpipe.models import (
    AnthropicChatModel,
    ChatModel,
    ModelInfo,
    ModelRequest,
    OpenAIChatModel,
    OpenAIResponsesModel,
)
from contextpipe.providers import History
from contextpipe.providers.compaction import Compaction
from contextpipe.stores import MemoryStore
from contextpipe.testing import AnthropicReply, FakeAnthropicServer, FakeError, FakeOpenAIServer, FakeReply
from contextpipe.testing.wire import assert_chat_request, assert_messages_request, assert_responses_request
from helpers import RecordingHistory, describe, get_weather_forecast, lookup_location_code

ANSWER = "Sunny and 25 C: a T-shirt and a light windbreaker."
QUESTION = "What should I wear in Suzhou today?"
CLIENTS = ("openai", "openai-responses", "anthropic")
THINK = {"anthropic_thinking": {"type": "enabled", "budget_tokens": 1024}}


class Vendor:
    """One client and its fake server, with the seed's script in that vendor's terms."""

    def __init__(self, kind: str, openai: FakeOpenAIServer, anthropic: FakeAnthropicServer) -> None:
        self.kind = kind
        self.server: FakeOpenAIServer = anthropic if kind == "anthropic" else openai
        self.model: ChatModel
        if kind == "anthropic":
            self.model = AnthropicChatModel("claude-fake", base_url=anthropic.base_url, api_key="k", max_retries=0)
        elif kind == "openai":
            self.model = OpenAIChatModel("gpt-fake", base_url=openai.base_url, max_retries=0)
        else:
            self.model = OpenAIResponsesModel("gpt-fake", base_url=openai.base_url, max_retries=0)

    @property
    def settings(self) -> dict[str, Any]:
        return THINK if self.kind == "anthropic" else {}

    def reply(self, text: str = "", call: tuple[str, str] | None = None, thought: str | None = None) -> Any:
        calls = (call,) if call else ()
        if self.kind == "anthropic":
            return AnthropicReply(text, calls, thinking=thought)
        return FakeReply(text, calls, reasoning=thought)

    def script(self, third: Any = None) -> list[Any]:
        return [self.reply(call=("lookup_location_code", '{"city": "Suzhou"}'), thought="Find the code first."),
                self.reply(call=("get_weather_forecast", '{"location_code": "SZ"}'), thought="Now the forecast."),
                third if third is not None else self.reply(ANSWER, thought="Dress for sun.")]

    def check(self) -> None:
        for body in self.server.requests:
            if self.kind == "anthropic":
                assert_messages_request(body)
            elif self.kind == "openai-responses":
                assert_responses_request(body)
            else:
                assert_chat_request(body)

    async def close(self) -> None:
        await self.model.close()  # type: ignore[attr-defined]


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server


_vendors: list[Vendor] = []


@pytest.fixture(autouse=True)
async def _close() -> AsyncIterator[None]:
    yield
    while _vendors:
        await _vendors.pop().close()


def vendor(kind: str, openai: FakeOpenAIServer, anthropic: FakeAnthropicServer) -> Vendor:
    v = Vendor(kind, openai, anthropic)
    _vendors.append(v)
    return v


SAVES = [
    ["user:What should I wear in Suzhou today?", "assistant:call:lookup_location_code"],
    ["tool:result:SZ"],
    ["assistant:call:get_weather_forecast"],
    ["tool:result:Sunny, 25 C, NW wind 4."],
    [f"assistant:{ANSWER}"],
]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_seed_003_runs_identically_on_every_client(kind: str, fake_openai: FakeOpenAIServer,
                                                         fake_anthropic: FakeAnthropicServer) -> None:
    v = vendor(kind, fake_openai, fake_anthropic)
    v.server.enqueue(*v.script())
    store = MemoryStore()
    history = RecordingHistory(store)
    agent = Agent(v.model, tools=[lookup_location_code, get_weather_forecast], providers=[history],
                  settings=v.settings)  # type: ignore[arg-type]
    session = await agent.session("s")
    persisted = []
    async for event in agent.stream(QUESTION, session=session):
        if isinstance(event, StepPersisted):
            persisted.append((event.step, describe(event.messages)))
    assert [describe(batch) for batch in history.saves] == SAVES
    assert persisted == [(1, SAVES[0]), (1, SAVES[1]), (2, SAVES[2]), (2, SAVES[3]), (3, SAVES[4])]
    log = await agent.history(session)
    assert describe(log) == [line for batch in SAVES for line in batch]
    # Every model turn keeps its reasoning in the log, in the vendor's own form where it has one.
    formats = {"openai": None, "openai-responses": "openai.reasoning", "anthropic": "anthropic.thinking"}[kind]
    reasoning = [p for m in log if m.role == "assistant" for p in m.parts if type(p).__name__ == "ReasoningPart"]
    assert [getattr(p, "format", None) for p in reasoning] == [formats] * 3
    assert len(v.server.requests) == 3
    v.check()


@pytest.mark.parametrize("kind", CLIENTS)
async def test_crash_on_the_third_call_then_resume(kind: str, fake_openai: FakeOpenAIServer,
                                                   fake_anthropic: FakeAnthropicServer) -> None:
    v = vendor(kind, fake_openai, fake_anthropic)
    v.server.enqueue(*v.script(third=FakeError(500, "upstream failed")))
    store = MemoryStore()
    agent = Agent(v.model, tools=[lookup_location_code, get_weather_forecast], providers=[History(store)],
                  settings=v.settings)  # type: ignore[arg-type]
    session = await agent.session("s")
    with pytest.raises(ModelServerError):
        await agent.run(QUESTION, session=session)
    assert len(await agent.history(session)) == 5
    # A new agent (as after a process restart) resumes from the stored steps.
    v.server.enqueue(v.reply(ANSWER, thought="Dress for sun."))
    again = Agent(v.model, tools=[lookup_location_code, get_weather_forecast], providers=[History(store)],
                  settings=v.settings)  # type: ignore[arg-type]
    result = await again.run(None, session=await again.session("s"))
    assert result.text == ANSWER
    assert len(await again.history(session)) == 6
    resumed, crashed = v.server.requests[-1], v.server.requests[-2]
    # The resumed request is the one that failed: same reasoning, signatures and calls, byte for byte.
    assert resumed.get("messages", resumed.get("input")) == crashed.get("messages", crashed.get("input"))
    v.check()


async def test_compaction_never_separates_thinking_from_its_tool_call(fake_openai: FakeOpenAIServer,
                                                                       fake_anthropic: FakeAnthropicServer) -> None:
    store = MemoryStore()
    model = vendor("anthropic", fake_openai, fake_anthropic).model
    budget = Compaction(max_input_tokens=700)
    agent = Agent(model, tools=[lookup_location_code, get_weather_forecast], providers=[History(store), budget],
                  settings=THINK)  # type: ignore[arg-type]
    session = await agent.session("s")
    for day in range(6):
        fake_anthropic.enqueue(
            AnthropicReply(thinking=f"Day {day}: look up the code. " * 4,
                           tool_calls=(("lookup_location_code", '{"city": "Suzhou"}'),)),
            AnthropicReply(thinking=f"Day {day}: get the forecast. " * 4,
                           tool_calls=(("get_weather_forecast", '{"location_code": "SZ"}'),)),
            AnthropicReply(f"Day {day}: {ANSWER}", thinking="Answer."),
        )
        result = await agent.run(f"Day {day}: {QUESTION}", session=session)
        assert result.text == f"Day {day}: {ANSWER}"
    assert any(t.compaction for t in result.traces), "the budget must have made compaction drop messages"
    assert len(fake_anthropic.requests[-1]["messages"]) < len(await agent.history(session))
    for body in fake_anthropic.requests:
        assert_messages_request(body)  # and the server verified every signature and tool pairing
        for message in body["messages"]:
            if any(b["type"] == "tool_use" for b in message["content"]):
                assert message["content"][0]["type"] == "thinking"


async def test_a_session_started_on_openai_continues_on_claude(fake_openai: FakeOpenAIServer,
                                                               fake_anthropic: FakeAnthropicServer) -> None:
    store = MemoryStore()
    openai = vendor("openai-responses", fake_openai, fake_anthropic)
    claude = vendor("anthropic", fake_openai, fake_anthropic)
    tools = [lookup_location_code, get_weather_forecast]
    # The OpenAI run crashes mid-loop, after its reasoning and first call were stored.
    openai.server.enqueue(openai.script()[0], FakeError(500, "down"))
    first = Agent(openai.model, tools=tools, providers=[History(store)])  # type: ignore[arg-type]
    with pytest.raises(ModelServerError):
        await first.run(QUESTION, session=await first.session("s"))
    # Claude, with thinking on, takes over: OpenAI's reasoning is left out, and since the pending call
    # has no thinking block, thinking is off for that one call; both are said in the trace.
    claude.server.enqueue(*claude.script()[1:])
    second = Agent(claude.model, tools=tools, providers=[History(store)], settings=THINK)  # type: ignore[arg-type]
    result = await second.run(None, session=await second.session("s"))
    assert result.text == ANSWER
    notes = result.traces[0].notes
    assert any("left out 1 reasoning part(s) of format 'openai.reasoning'" in n for n in notes)
    assert any("thinking turned off for this call" in n for n in notes)
    assert "thinking" not in fake_anthropic.requests[0]
    assert fake_anthropic.requests[1]["thinking"] == THINK["anthropic_thinking"]
    assert "claude-fake adapted request: left out" in result.traces[0].table()
    claude.check()
    # And back to OpenAI: Claude's thinking is left out there, the OpenAI reasoning item goes back.
    openai.server.enqueue(FakeReply("Yes, the T-shirt."))
    third = Agent(openai.model, tools=tools, providers=[History(store)])  # type: ignore[arg-type]
    back = await third.run("Sure?", session=await third.session("s"))
    assert back.text == "Yes, the T-shirt."
    assert back.traces[0].notes == ("left out 2 reasoning part(s) of format 'anthropic.thinking': the Responses "
                                    "API cannot accept them",)
    kinds = [i.get("type", "message") for i in fake_openai.requests[-1]["input"]]
    assert kinds.count("reasoning") == 1
    openai.check()


async def test_demo_shows_a_cached_token_column_only_when_the_model_reports_cache_use(tmp_path: Any) -> None:
    from contextpipe.cli._demonstration import _prompt_caching, _Run, usage_table
    from contextpipe.models import Usage
    from contextpipe.stores import SQLiteStore
    from contextpipe.testing import ScriptedModel, Turn

    lines: list[str] = []
    async with SQLiteStore(str(tmp_path / "demo.db")) as store:
        await _prompt_caching(store, _Run(1), lines.append)
    table = [line.split() for line in lines if line.startswith("      ")]
    assert table[0] == ["call", "input", "cached", "written", "output"]
    rows = [[int(x) for x in row] for row in table[1:]]
    assert [r[0] for r in rows] == [1, 2, 3]
    assert rows[0][2] == 0 and all(r[2] > 0 for r in rows[1:])
    plain = await Agent(ScriptedModel([Turn("hi", usage=Usage(12, 3))])).run("x")
    assert [line.split() for line in usage_table(plain)] == [["call", "input", "output"], ["1", "12", "3"]]


@pytest.mark.parametrize("kind", CLIENTS)
@pytest.mark.parametrize(("status", "error"), [
    (401, ModelAuthError), (403, ModelAuthError), (404, ModelBadRequest), (400, ModelBadRequest),
    (429, ModelRateLimited), (500, ModelServerError), (503, ModelServerError),
])
async def test_every_client_maps_an_http_error_through_the_one_ladder(
    kind: str, status: int, error: type[ModelError], fake_openai: FakeOpenAIServer, fake_anthropic: FakeAnthropicServer
) -> None:
    v = vendor(kind, fake_openai, fake_anthropic)
    v.server.enqueue(FakeError(status, "no", headers={"retry-after": "3"} if status == 429 else {}))
    with pytest.raises(error) as info:
        await v.model.complete(ModelRequest([Message.user("x")]))
    assert (info.value.status_code, info.value.provider) == (status, v.model.provider)  # type: ignore[attr-defined]
    assert str(info.value).startswith(f"{v.model.provider} ({v.model.client.base_url}) ")  # type: ignore[attr-defined]
    if isinstance(info.value, ModelRateLimited):
        assert info.value.retry_after == 3.0
    assert v.model.info == ModelInfo(v.model.provider, str(v.model.client.base_url))  # type: ignore[attr-defined]
