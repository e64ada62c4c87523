"""OpenAIResponsesModel end to end: the real openai SDK over HTTP against FakeOpenAIServer's Responses API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from contextpipe import (
    Agent,
    FunctionCall,
    FunctionResult,
    Message,
    ModelAuthError,
    ModelBadRequest,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ReasoningPart,
    TextDelta,
    TextPart,
    tool,
)
from contextpipe.codec import dumps, loads
from contextpipe.models import ModelRequest, OpenAIChatModel, OpenAIResponsesModel, ReasoningDelta, ResponseComplete
from contextpipe.providers import History
from contextpipe.stores import MemoryStore
from contextpipe.testing import FakeError, FakeOpenAIServer, FakeReply, FakeStreamCut, FakeStreamError
from contextpipe.testing.wire import assert_responses_request

_open: list[OpenAIChatModel] = []


def make_model(server: FakeOpenAIServer, **kwargs: Any) -> OpenAIResponsesModel:
    kwargs.setdefault("max_retries", 0)
    model = OpenAIResponsesModel("gpt-fake", base_url=server.base_url, **kwargs)
    _open.append(model)
    return model


@pytest.fixture(autouse=True)
async def _close_models() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def collect(model: OpenAIResponsesModel, request: ModelRequest) -> tuple[list[Any], Any]:
    events: list[Any] = []
    final = None
    async for event in model.stream(request):
        if isinstance(event, ResponseComplete):
            final = event.response
        else:
            events.append(event)
    return events, final


async def test_stateless_request_shape_usage_and_reasoning_item(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply("Calling add.", tool_calls=(("add", '{"a": 1, "b": 2}'),), reasoning="Need a sum.",
                                  usage=(1200, 40), cached_tokens=1024, reasoning_tokens=30))
    model = make_model(fake_openai)
    request = ModelRequest([Message.user("Add 1 and 2.")], instructions="Use tools.", tools=[add.spec],
                           settings={"tool_choice": "required", "parallel_tool_calls": False,
                                     "max_output_tokens": 300, "reasoning_effort": "low"})
    response = await model.complete(request)
    body = fake_openai.requests[0]
    assert_responses_request(body)
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["instructions"] == "Use tools."
    assert body["input"] == [{"role": "user", "content": [{"type": "input_text", "text": "Add 1 and 2."}]}]
    assert body["tools"] == [{"type": "function", "name": "add", "description": "Add two integers.",
                              "parameters": add.spec.parameters, "strict": False}]
    assert (body["tool_choice"], body["parallel_tool_calls"], body["max_output_tokens"]) == ("required", False, 300)
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    [message] = response.messages
    reasoning = message.parts[0]
    assert isinstance(reasoning, ReasoningPart)
    assert (reasoning.text, reasoning.format) == ("Need a sum.", "openai.reasoning")
    assert reasoning.id in fake_openai.issued_reasoning
    assert reasoning.encrypted == fake_openai.issued_reasoning[reasoning.id]
    assert message.function_calls[0].name == "add"
    assert response.finish_reason == "tool_calls"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.cache_read_tokens, response.usage.reasoning_tokens) == (
        1200, 1024, 30)
    assert loads(dumps(message)) == message


async def test_reasoning_items_go_back_before_their_call_in_a_tool_loop(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        FakeReply(tool_calls=(("add", '{"a": 2, "b": 3}'), ("add", '{"a": 4, "b": 5}')), reasoning="Two sums."),
        FakeReply("5 and 9.", reasoning="Report them."),
    )
    chunks: list[str] = []
    thoughts: list[str] = []
    agent = Agent(make_model(fake_openai), tools=[add])
    async with agent.stream("Add 2+3 and 4+5.") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                chunks.append(event.text)
            elif isinstance(event, ReasoningDelta):
                thoughts.append(event.text)
    assert events.result is not None and events.result.text == "5 and 9." == "".join(chunks)
    assert "".join(thoughts) == "Two sums.Report them."
    second = fake_openai.requests[1]
    assert_responses_request(second)
    kinds = [item.get("type", "message") for item in second["input"]]
    assert kinds == ["message", "reasoning", "function_call", "function_call", "function_call_output",
                     "function_call_output"]
    assert second["input"][1]["encrypted_content"] == fake_openai.issued_reasoning[second["input"][1]["id"]]
    assert [i["output"] for i in second["input"][4:]] == ["5", "9"]


async def test_changed_encrypted_reasoning_is_rejected(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(tool_calls=(("add", '{"a": 1, "b": 1}'),), reasoning="r"))
    model = make_model(fake_openai)
    first = (await model.complete(ModelRequest([Message.user("q")], tools=[add.spec]))).messages[0]
    reasoning = first.parts[0]
    assert isinstance(reasoning, ReasoningPart)
    forged = Message("assistant", (ReasoningPart(reasoning.text, "enc_forged", reasoning.format, reasoning.id),
                                   *first.parts[1:]))
    call = first.function_calls[0]
    with pytest.raises(ModelBadRequest, match="encrypted_content"):
        await model.complete(ModelRequest([Message.user("q"), forged,
                                           Message("tool", (FunctionResult(call.call_id, "2"),))]))


async def test_previous_response_mode_sends_only_new_items_and_the_session_remembers_the_id(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(FakeReply(tool_calls=(("add", '{"a": 1, "b": 2}'),), reasoning="sum"),
                        FakeReply("It is 3."), FakeReply("Still 3."))
    store = MemoryStore()
    agent = Agent(make_model(fake_openai, previous_response=True), tools=[add], providers=[History(store)])
    session = await agent.session("s")
    assert (await agent.run("Add 1 and 2.", session=session)).text == "It is 3."
    first, second = fake_openai.requests[:2]
    assert first["store"] is True and "previous_response_id" not in first
    assert second["previous_response_id"] in fake_openai.stored
    assert [i.get("type") for i in second["input"]] == ["function_call_output"]
    # A new run (the agent reloads the session from the store) continues from the stored id.
    assert (await agent.run("Sure?", session=session)).text == "Still 3."
    third = fake_openai.requests[2]
    stored = await agent.history(session)
    assert third["previous_response_id"] == stored[3].metadata["openai_response_id"]
    assert stored[3].text == "It is 3."
    assert third["input"] == [{"role": "user", "content": [{"type": "input_text", "text": "Sure?"}]}]
    for body in fake_openai.requests:
        assert_responses_request(body)


async def test_unknown_previous_response_is_a_bad_request(fake_openai: FakeOpenAIServer) -> None:
    stale = Message("assistant", (Message.assistant("hi").parts[0],), metadata={"openai_response_id": "resp_gone"})
    with pytest.raises(ModelBadRequest, match="not found"):
        await make_model(fake_openai, previous_response=True).complete(
            ModelRequest([Message.user("a"), stale, Message.user("b")]))


async def test_incomplete_response_and_stream_failures(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply("truncated", incomplete="max_output_tokens"))
    _, final = await collect(make_model(fake_openai), ModelRequest([Message.user("x")]))
    assert (final.text, final.finish_reason) == ("truncated", "length")
    fake_openai.enqueue(FakeStreamError(FakeReply("a long answer"), after_events=4, error_type="server_error",
                                        message="The server had an error"))
    with pytest.raises(ModelServerError, match="server had an error"):
        await collect(make_model(fake_openai), ModelRequest([Message.user("x")]))
    fake_openai.enqueue(FakeStreamCut(FakeReply("abcdefghijklmnop", chunk_size=2), after_chunks=5))
    with pytest.raises(ModelResponseError, match="cut after 5 event"):
        await collect(make_model(fake_openai), ModelRequest([Message.user("x")]))


@pytest.mark.parametrize(("step", "error"), [(FakeError(401, "bad key"), ModelAuthError),
                                             (FakeError(429, "slow down", headers={"retry-after": "2"}),
                                              ModelRateLimited),
                                             (FakeError(500, "boom"), ModelServerError),
                                             (FakeError(400, "bad input"), ModelBadRequest)])
async def test_http_errors_map_like_chat_completions(fake_openai: FakeOpenAIServer, step: FakeError,
                                                     error: type[Exception]) -> None:
    fake_openai.enqueue(step)
    with pytest.raises(error):
        await make_model(fake_openai).complete(ModelRequest([Message.user("x")]))


async def test_chat_completions_report_cached_and_reasoning_tokens(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply("hi", usage=(2000, 50), cached_tokens=1536, reasoning_tokens=20),
                        FakeReply("hi", usage=(2000, 50), cached_tokens=1536))
    model = OpenAIChatModel("gpt-fake", base_url=fake_openai.base_url, max_retries=0)
    _open.append(model)
    usage = (await model.complete(ModelRequest([Message.user("x")]))).usage
    assert usage is not None and (usage.cache_read_tokens, usage.reasoning_tokens) == (1536, 20)
    _, final = await collect(model, ModelRequest([Message.user("x")]))  # type: ignore[arg-type]
    assert final.usage.cache_read_tokens == 1536


async def test_other_vendors_reasoning_is_left_out_with_a_note(fake_openai: FakeOpenAIServer) -> None:
    claude_turn = Message("assistant", (ReasoningPart("thinking", "sig_x", "anthropic.thinking"),
                                        FunctionCall("toolu_1", "add", '{"a": 1, "b": 1}')))
    history = [Message.user("q"), claude_turn, Message("tool", (FunctionResult("toolu_1", "2"),))]
    response = await make_model(fake_openai).complete(ModelRequest(history, tools=[add.spec]))
    body = fake_openai.requests[0]
    assert_responses_request(body)
    assert [i.get("type", "message") for i in body["input"]] == ["message", "function_call", "function_call_output"]
    assert response.notes == ("left out 1 reasoning part(s) of format 'anthropic.thinking': the Responses API "
                              "cannot accept them",)


async def test_chat_completions_note_other_vendors_reasoning(fake_openai: FakeOpenAIServer) -> None:
    history = [Message.user("q"), Message("assistant", (ReasoningPart("t", "sig", "anthropic.thinking"),
                                                        ReasoningPart("s", "enc", "openai.reasoning", "rs_1"),
                                                        ReasoningPart("plain"), TextPart("a"))),
               Message.user("next")]
    model = OpenAIChatModel("gpt-fake", base_url=fake_openai.base_url, max_retries=0)
    _open.append(model)
    response = await model.complete(ModelRequest(history))
    assert response.notes == (
        "left out 1 reasoning part(s) of format 'anthropic.thinking': chat completions cannot accept them",
        "left out 1 reasoning part(s) of format 'openai.reasoning': chat completions cannot accept them")
    assert fake_openai.requests[0]["messages"][1] == {"role": "assistant", "content": "a"}
