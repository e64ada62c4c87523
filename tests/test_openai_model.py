"""OpenAIChatModel end to end: the real openai SDK over HTTP against the local fake server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from contextpipe import (
    Agent,
    ContextWindowExceeded,
    DataPart,
    FunctionCall,
    FunctionResult,
    Message,
    ModelAuthError,
    ModelBadRequest,
    ModelConnectionError,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
    ReasoningPart,
    TextDelta,
    TextPart,
    UriPart,
    UsageError,
    tool,
)
from contextpipe.models import ModelRequest, OpenAIChatModel, ResponseComplete
from contextpipe.testing import FakeError, FakeOpenAIServer, FakeRaw, FakeReply, FakeStreamCut

_open: list[OpenAIChatModel] = []


def make_model(server: FakeOpenAIServer | None = None, name: str = "fake-model", **kwargs: Any) -> OpenAIChatModel:
    if server is not None:
        kwargs.setdefault("base_url", server.base_url)
    kwargs.setdefault("max_retries", 0)
    model = OpenAIChatModel(name, **kwargs)
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


async def collect(model: OpenAIChatModel, request: ModelRequest) -> tuple[list[str], Any]:
    deltas: list[str] = []
    final = None
    async for event in model.stream(request):
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        elif isinstance(event, ResponseComplete):
            final = event.response
    return deltas, final


async def test_text_reply_usage_and_request_shape(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply("Hello, Alice.", usage=(42, 7)))
    model = make_model(fake_openai, settings={"temperature": 0.2})
    request = ModelRequest(
        [Message.user("Hi, I am Alice.", author_name="alice")],
        instructions="Be brief.",
        tools=[add.spec],
        settings={"max_output_tokens": 50, "tool_choice": "add", "parallel_tool_calls": False, "seed": 3},
    )
    response = await model.complete(request)
    assert response.text == "Hello, Alice."
    assert (response.usage.input_tokens, response.usage.output_tokens) == (42, 7)  # type: ignore[union-attr]
    assert response.finish_reason == "stop"
    body = fake_openai.requests[0]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi, I am Alice.", "name": "alice"},
    ]
    assert body["tools"][0]["function"]["name"] == "add"
    assert body["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    assert body["temperature"] == 0.2
    assert body["max_completion_tokens"] == 50
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["parallel_tool_calls"] is False
    assert body["seed"] == 3


async def test_parallel_tool_calls_and_reasoning(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(tool_calls=(("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')),
                                  reasoning="two sums needed"))
    response = await make_model(fake_openai).complete(ModelRequest([Message.user("sums")], tools=[add.spec]))
    [message] = response.messages
    assert isinstance(message.parts[0], ReasoningPart) and message.parts[0].text == "two sums needed"
    calls = message.function_calls
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')]
    assert calls[0].call_id != calls[1].call_id
    assert response.finish_reason == "tool_calls"


async def test_history_with_tool_exchange_and_media_is_sent_in_wire_format(fake_openai: FakeOpenAIServer) -> None:
    history = [
        Message("user", (TextPart("what is this?"), UriPart("https://x.test/cat.jpg", "image/jpeg"),
                         DataPart(b"\x89PNG", "image/png"))),
        Message("assistant", (TextPart("Let me add."), FunctionCall("c1", "add", '{"a":1,"b":2}'),
                              FunctionCall("c2", "add", '{"a":2,"b":2}'))),
        Message("tool", (FunctionResult("c1", "3"), FunctionResult("c2", "4"))),
    ]
    await make_model(fake_openai).complete(ModelRequest(history))
    wire = fake_openai.requests[0]["messages"]
    assert wire[0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "https://x.test/cat.jpg"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
    ]
    assert wire[1] == {
        "role": "assistant", "content": "Let me add.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":2}'}},
        ],
    }
    assert wire[2:] == [{"role": "tool", "tool_call_id": "c1", "content": "3"},
                        {"role": "tool", "tool_call_id": "c2", "content": "4"}]


async def test_unsupported_media_is_a_clear_usage_error(fake_openai: FakeOpenAIServer) -> None:
    message = Message("user", (DataPart(b"%PDF", "application/pdf"),))
    with pytest.raises(UsageError, match="cannot take 'application/pdf'"):
        await make_model(fake_openai).complete(ModelRequest([message]))


async def test_streaming_text_assembles_and_reports_usage(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply("The weather is sunny today.", usage=(12, 6), chunk_size=3))
    deltas, final = await collect(make_model(fake_openai), ModelRequest([Message.user("weather?")]))
    assert len(deltas) == 9
    assert "".join(deltas) == "The weather is sunny today."
    assert final.text == "The weather is sunny today."
    assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 6)
    assert fake_openai.requests[0]["stream_options"] == {"include_usage": True}


async def test_streaming_tool_call_deltas_are_assembled(fake_openai: FakeOpenAIServer) -> None:
    args_a, args_b = '{"a": 10, "b": 20}', '{"a": 7, "b": 8}'
    fake_openai.enqueue(FakeReply("Adding.", tool_calls=(("add", args_a), ("add", args_b)), chunk_size=2))
    _, final = await collect(make_model(fake_openai), ModelRequest([Message.user("sums")], tools=[add.spec]))
    calls = final.messages[0].function_calls
    assert [(c.name, c.arguments) for c in calls] == [("add", args_a), ("add", args_b)]
    assert final.finish_reason == "tool_calls"
    assert final.text == "Adding."


async def test_stream_cut_midway_is_a_response_error(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeStreamCut(FakeReply("abcdefghijklmnop"), after_chunks=3))
    model = make_model(fake_openai)
    with pytest.raises(ModelResponseError, match="cut after 3 chunk"):
        await collect(model, ModelRequest([Message.user("x")]))


@pytest.mark.parametrize(
    ("step", "error", "fragment"),
    [
        (FakeError(401, "Incorrect API key"), ModelAuthError, "check OPENAI_API_KEY"),
        (FakeError(403, "forbidden"), ModelAuthError, "refused the credentials"),
        (FakeError(404, "The model does not exist"), ModelBadRequest, "check the model"),
        (FakeError(400, "messages[0] is invalid"), ModelBadRequest, "rejected the request"),
        (FakeError(400, "This model's maximum context length is 8192 tokens", code="context_length_exceeded"),
         ContextWindowExceeded, "context window"),
        (FakeError(500, "upstream exploded"), ModelServerError, "HTTP 500"),
        (FakeError(503, "overloaded"), ModelServerError, "retry later"),
        (FakeRaw(b"<html>not json</html>"), ModelResponseError, "could not be read"),
        (FakeRaw(b'{"unexpected": true}'), ModelResponseError, "without choices"),
    ],
)
async def test_http_errors_map_to_contextpipe_errors(
    fake_openai: FakeOpenAIServer, step: Any, error: type[Exception], fragment: str
) -> None:
    fake_openai.enqueue(step)
    with pytest.raises(error, match=fragment) as info:
        await make_model(fake_openai).complete(ModelRequest([Message.user("x")]))
    if isinstance(step, FakeError):
        assert info.value.status_code == step.status  # type: ignore[attr-defined]


@pytest.mark.parametrize(("headers", "expected"), [({"retry-after": "7"}, 7.0), ({"retry-after-ms": "1500"}, 1.5),
                                                   ({}, None)])
async def test_rate_limit_carries_retry_after(
    fake_openai: FakeOpenAIServer, headers: dict[str, str], expected: float | None
) -> None:
    fake_openai.enqueue(FakeError(429, "Rate limit reached", headers=headers))
    with pytest.raises(ModelRateLimited) as info:
        await make_model(fake_openai).complete(ModelRequest([Message.user("x")]))
    assert info.value.retry_after == expected
    assert ("retry after" if expected else "retry later") in str(info.value)


async def test_sdk_retries_then_succeeds(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeError(429, "slow down", headers={"retry-after-ms": "10"}), FakeReply("after retry"))
    model = make_model(fake_openai, max_retries=2)
    assert (await model.complete(ModelRequest([Message.user("x")]))).text == "after retry"
    assert len(fake_openai.requests) == 2


async def test_timeout_and_connection_errors(fake_openai: FakeOpenAIServer) -> None:
    def slow(body: dict[str, Any]) -> FakeReply:
        time.sleep(1.0)
        return FakeReply("late")

    fake_openai.enqueue(slow)
    with pytest.raises(ModelTimeout, match=r"did not answer within 0.2 s for model .fake-model.; raise timeout="):
        await make_model(fake_openai, timeout=0.2).complete(ModelRequest([Message.user("x")]))
    closed = make_model(name="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ModelConnectionError, match="could not reach"):
        await closed.complete(ModelRequest([Message.user("x")]))


def test_configuration_from_environment_and_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="OPENAI_MODEL"):
        OpenAIChatModel()
    with pytest.raises(UsageError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")
    monkeypatch.setenv("OPENAI_MODEL", "from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:1234/v1")
    model = make_model(name="")
    assert model.name == "from-env"
    assert str(model.client.base_url).startswith("http://127.0.0.1:1234/v1")
    with pytest.raises(UsageError, match="AZURE_OPENAI_ENDPOINT"):
        OpenAIChatModel.azure("my-deployment")


async def test_agent_tool_loop_over_http(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        FakeReply(tool_calls=(("add", '{"a": 2, "b": 3}'), ("add", '{"a": 4, "b": 5}'))),
        FakeReply("The sums are 5 and 9."),
    )
    agent = Agent(make_model(fake_openai), instructions="Use tools.", tools=[add])
    chunks: list[str] = []
    async with agent.stream("Add 2+3 and 4+5.") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                chunks.append(event.text)
    assert events.result is not None
    assert events.result.text == "The sums are 5 and 9." == "".join(chunks)
    second = fake_openai.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert [m["content"] for m in second[3:]] == ["5", "9"]
    assert events.result.usage.input_tokens == 20
