"""AnthropicChatModel end to end: the real anthropic SDK over HTTP against FakeAnthropicServer."""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Iterator
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
from contextpipe.codec import dumps, loads
from contextpipe.models import AnthropicChatModel, ModelRequest, ReasoningDelta, ResponseComplete
from contextpipe.providers import History
from contextpipe.stores import MemoryStore
from contextpipe.testing import (
    AnthropicReply,
    FakeAnthropicCut,
    FakeAnthropicServer,
    FakeError,
    FakeRaw,
    FakeStreamError,
)
from contextpipe.testing.fake_anthropic import signature_for
from contextpipe.testing.wire import assert_messages_request

_open: list[AnthropicChatModel] = []
THINK = {"anthropic_thinking": {"type": "enabled", "budget_tokens": 1024}}


@pytest.fixture
def fake() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture(autouse=True)
async def _close_models(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "ANTHROPIC_AUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield
    while _open:
        await _open.pop().close()


def make_model(server: FakeAnthropicServer, **kwargs: Any) -> AnthropicChatModel:
    kwargs.setdefault("max_retries", 0)
    model = AnthropicChatModel(kwargs.pop("name", "claude-fake"), base_url=server.base_url, api_key="sk-test",
                               **kwargs)
    _open.append(model)
    return model


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def collect(model: AnthropicChatModel, request: ModelRequest) -> tuple[list[Any], Any]:
    events: list[Any] = []
    final = None
    async for event in model.stream(request):
        if isinstance(event, ResponseComplete):
            final = event.response
        else:
            events.append(event)
    return events, final


async def test_text_reply_request_shape_and_usage(fake: FakeAnthropicServer) -> None:
    fake.enqueue(AnthropicReply("Hello, Alice.", input_tokens=42, output_tokens=7))
    model = make_model(fake, settings={"temperature": 0.2})
    request = ModelRequest([Message.user("Hi, I am Alice.")], instructions="Be brief.", tools=[add.spec],
                           settings={"tool_choice": "add", "parallel_tool_calls": False})
    response = await model.complete(request)
    assert response.text == "Hello, Alice."
    assert response.finish_reason == "stop"
    assert response.usage is not None and response.usage.output_tokens == 7
    # Total input = uncached + cache writes + cache reads; the first call writes the whole prefix.
    assert response.usage.input_tokens == 42 + response.usage.cache_write_tokens
    assert response.usage.cache_write_tokens > 0 and response.usage.cache_read_tokens == 0
    body = fake.requests[0]
    assert_messages_request(body)
    assert body["max_tokens"] == 4096
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["tools"] == [{"name": "add", "description": "Add two integers.", "input_schema": add.spec.parameters,
                              "cache_control": {"type": "ephemeral"}}]
    assert body["tool_choice"] == {"type": "tool", "name": "add", "disable_parallel_tool_use": True}
    assert body["temperature"] == 0.2
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Hi, I am Alice.", "cache_control": {"type": "ephemeral"}}]}]
    headers = {k.lower(): v for k, v in fake.headers[0].items()}
    assert "sk-test" in (headers.get("x-api-key") or headers.get("authorization", ""))
    assert "anthropic-version" in headers


async def test_history_wire_format_merges_turns_and_orders_tool_results(fake: FakeAnthropicServer) -> None:
    history = [
        Message("user", (TextPart("what is this?"), UriPart("https://x.test/cat.jpg", "image/jpeg"),
                         DataPart(b"\x89PNG", "image/png"), DataPart(b"%PDF-1.4", "application/pdf"))),
        Message.user("and add numbers"),
        Message("assistant", (TextPart("Let me add."), FunctionCall("c1", "add", '{"a":1,"b":2}'),
                              FunctionCall("c2", "add", '{"a":2,"b":2}'))),
        Message("tool", (FunctionResult("c1", "3"),)),
        Message("tool", (FunctionResult("c2", "Error: overflow", is_error=True),)),
        Message.user("thanks"),
    ]
    await make_model(fake, cache=None).complete(ModelRequest(history, settings={"max_output_tokens": 100}))
    body = fake.requests[0]
    assert_messages_request(body)
    assert body["max_tokens"] == 100
    wire = body["messages"]
    assert [m["role"] for m in wire] == ["user", "assistant", "user"]
    assert wire[0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/cat.jpg"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}},
        {"type": "text", "text": "and add numbers"},
    ]
    assert wire[1]["content"][1:] == [
        {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1, "b": 2}},
        {"type": "tool_use", "id": "c2", "name": "add", "input": {"a": 2, "b": 2}},
    ]
    assert wire[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "3"},
        {"type": "tool_result", "tool_use_id": "c2", "content": "Error: overflow", "is_error": True},
        {"type": "text", "text": "thanks"},
    ]
    assert "cache_control" not in str(body)


async def test_unsupported_media_is_a_clear_usage_error(fake: FakeAnthropicServer) -> None:
    with pytest.raises(UsageError, match="cannot take 'audio/wav'"):
        await make_model(fake).complete(ModelRequest([Message("user", (DataPart(b"RIFF", "audio/wav"),))]))


async def test_streamed_thinking_and_parallel_tool_calls_are_assembled(fake: FakeAnthropicServer) -> None:
    fake.enqueue(AnthropicReply("Adding both.", thinking="Two sums; call add twice.", chunk_size=3, pings=2,
                                tool_calls=(("add", '{"a": 10, "b": 20}'), ("add", '{"a": 7, "b": 8}'))))
    events, final = await collect(make_model(fake), ModelRequest([Message.user("sums")], tools=[add.spec],
                                                                  settings=THINK))
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "Two sums; call add twice."
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Adding both."
    [message] = final.messages
    thinking = message.parts[0]
    assert thinking == ReasoningPart("Two sums; call add twice.", signature_for("Two sums; call add twice."),
                                     "anthropic.thinking")
    assert [(c.name, c.arguments) for c in message.function_calls] == [
        ("add", '{"a": 10, "b": 20}'), ("add", '{"a": 7, "b": 8}')]
    assert final.finish_reason == "tool_calls"
    assert fake.requests[0]["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    # The stored form keeps the signature, so it can be sent back after a reload.
    assert loads(dumps(message)) == message


async def test_thinking_signatures_and_redacted_thinking_go_back_unchanged_in_a_tool_loop() -> None:
    with FakeAnthropicServer() as fake:
        fake.enqueue(
            AnthropicReply(thinking="Need the sum first.", redacted_thinking="opaque-blob-1",
                           tool_calls=(("add", '{"a": 2, "b": 3}'),)),
            AnthropicReply(thinking="Now the second sum.", tool_calls=(("add", '{"a": 5, "b": 5}'),)),
            AnthropicReply("The total is 10.", thinking="Done."),
        )
        store = MemoryStore()
        agent = Agent(make_model(fake), tools=[add], providers=[History(store)], settings=THINK)
        session = await agent.session("s")
        result = await agent.run("Add 2+3, then add 5 to it.", session=session)
        assert result.text == "The total is 10."
        # Every request passed the server's checks: signatures verified, redacted data recognised.
        for body in fake.requests:
            assert_messages_request(body)
        third = fake.requests[2]["messages"]
        assert third[1]["content"][:2] == [
            {"type": "redacted_thinking", "data": "opaque-blob-1"},
            {"type": "thinking", "thinking": "Need the sum first.", "signature": signature_for("Need the sum first.")},
        ]
        assert third[3]["content"][0]["signature"] == signature_for("Now the second sum.")
        # Stored, reloaded, and sent again on the next run: still accepted.
        stored = await agent.history(session)
        kinds = [type(p).__name__ for p in stored[1].parts]
        assert kinds == ["ReasoningPart", "ReasoningPart", "FunctionCall"]
        fake.enqueue(AnthropicReply("Still 10."))
        assert (await agent.run("And again?", session=session)).text == "Still 10."
        assert fake.requests[-1]["messages"][1]["content"][0] == {"type": "redacted_thinking", "data": "opaque-blob-1"}


async def test_a_changed_signature_is_rejected_by_the_server(fake: FakeAnthropicServer) -> None:
    history = [Message.user("q"), Message("assistant", (ReasoningPart("thought", "sig_forged", "anthropic.thinking"),
                                                        FunctionCall("c1", "add", '{"a":1,"b":1}'))),
               Message("tool", (FunctionResult("c1", "2"),))]
    with pytest.raises(ModelBadRequest, match="Invalid `signature`"):
        await make_model(fake).complete(ModelRequest(history, settings=THINK))


async def test_prompt_caching_reads_the_previous_prefix_in_a_multi_step_loop(fake: FakeAnthropicServer) -> None:
    fake.enqueue(AnthropicReply(thinking="first", tool_calls=(("add", '{"a": 1, "b": 2}'),)),
                 AnthropicReply(thinking="second", tool_calls=(("add", '{"a": 3, "b": 3}'),)),
                 AnthropicReply("3 and 6.", thinking="third"))
    agent = Agent(make_model(fake), instructions="You add numbers. " * 40, tools=[add], settings=THINK)
    result = await agent.run("Add 1+2, then 3+3.")
    usages = [t.usage for t in result.traces]
    assert all(u is not None for u in usages)
    assert usages[0].cache_read_tokens == 0 and usages[0].cache_write_tokens > 0  # type: ignore[union-attr]
    for previous, current in itertools.pairwise(usages):
        # Each call reads everything the previous call wrote, and writes only what is new.
        assert current.cache_read_tokens == previous.cache_read_tokens + previous.cache_write_tokens  # type: ignore
        assert current.cache_write_tokens < current.cache_read_tokens  # type: ignore[union-attr]
    assert result.usage.cache_read_tokens == sum(u.cache_read_tokens for u in usages)  # type: ignore[union-attr]
    for body in fake.requests:
        assert_messages_request(body)
        assert str(body).count("cache_control") <= 4
    assert "cache 0 read" in result.traces[0].table()
    assert result.traces[1].to_dict()["usage"]["cache_read_tokens"] > 0


async def test_caching_off_and_one_hour_ttl(fake: FakeAnthropicServer) -> None:
    await make_model(fake, cache=None).complete(ModelRequest([Message.user("x")], instructions="sys"))
    assert "cache_control" not in str(fake.requests[0]) and fake.requests[0]["system"] == "sys"
    response = await make_model(fake, cache=None).complete(ModelRequest([Message.user("x")], instructions="sys"))
    assert response.usage is not None and response.usage.cache_read_tokens == 0
    await make_model(fake, cache="1h").complete(ModelRequest([Message.user("x")], instructions="sys"))
    assert fake.requests[2]["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    with pytest.raises(UsageError, match="cache must be"):
        make_model(fake, cache="10m")  # type: ignore[arg-type]


@pytest.mark.parametrize(("stop", "expected"), [("max_tokens", "length"), ("refusal", "content_filter"),
                                                ("stop_sequence", "stop"), ("end_turn", "stop")])
async def test_stop_reasons_are_mapped(fake: FakeAnthropicServer, stop: str, expected: str) -> None:
    fake.enqueue(AnthropicReply("partial", stop_reason=stop), AnthropicReply("partial", stop_reason=stop))
    model = make_model(fake)
    assert (await model.complete(ModelRequest([Message.user("x")]))).finish_reason == expected
    assert (await collect(model, ModelRequest([Message.user("x")])))[1].finish_reason == expected


@pytest.mark.parametrize("streaming", [False, True])
async def test_pause_turn_is_continued_into_one_answer(fake: FakeAnthropicServer, streaming: bool) -> None:
    fake.enqueue(AnthropicReply("Searching... ", stop_reason="pause_turn", output_tokens=3),
                 AnthropicReply("found it.", output_tokens=4))
    model = make_model(fake)
    request = ModelRequest([Message.user("look it up")])
    response = (await collect(model, request))[1] if streaming else await model.complete(request)
    assert response.text == "Searching... found it."
    assert response.finish_reason == "stop"
    assert response.usage.output_tokens == 7
    assert fake.requests[1]["messages"][-1]["role"] == "assistant"
    assert fake.requests[1]["messages"][-1]["content"][0]["text"] == "Searching... "


@pytest.mark.parametrize(
    ("step", "error", "fragment"),
    [
        (FakeError(401, "invalid x-api-key"), ModelAuthError, "check ANTHROPIC_API_KEY"),
        (FakeError(403, "not allowed"), ModelAuthError, "refused the credentials"),
        (FakeError(404, "model: claude-nope"), ModelBadRequest, "check the model name"),
        (FakeError(400, "messages: roles must alternate"), ModelBadRequest, "rejected the request"),
        (FakeError(400, "prompt is too long: 210000 tokens > 200000 maximum"), ContextWindowExceeded,
         "context window"),
        (FakeError(413, "Request exceeds the maximum allowed number of bytes."), ModelBadRequest, "HTTP 413"),
        (FakeError(529, "Overloaded"), ModelServerError, "overloaded"),
        (FakeError(500, "Internal server error"), ModelServerError, "HTTP 500"),
        (FakeRaw(b"<html>not json</html>"), ModelResponseError, "could not be read"),
    ],
)
async def test_http_errors_map_to_contextpipe_errors(
    fake: FakeAnthropicServer, step: Any, error: type[Exception], fragment: str
) -> None:
    fake.enqueue(step)
    with pytest.raises(error, match=fragment) as info:
        await make_model(fake).complete(ModelRequest([Message.user("x")]))
    if isinstance(step, FakeError):
        assert info.value.status_code == step.status  # type: ignore[attr-defined]
        assert info.value.provider == "anthropic"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("headers", "expected"), [({"retry-after": "7"}, 7.0), ({}, None)])
async def test_rate_limit_carries_retry_after(fake: FakeAnthropicServer, headers: dict[str, str],
                                              expected: float | None) -> None:
    fake.enqueue(FakeError(429, "Number of request tokens has exceeded your per-minute rate limit", headers=headers))
    with pytest.raises(ModelRateLimited) as info:
        await make_model(fake).complete(ModelRequest([Message.user("x")]))
    assert info.value.retry_after == expected


async def test_sdk_retries_overloaded_then_succeeds(fake: FakeAnthropicServer) -> None:
    fake.enqueue(FakeError(529, "Overloaded", headers={"retry-after-ms": "10"}), AnthropicReply("after retry"))
    model = make_model(fake, max_retries=2)
    assert (await model.complete(ModelRequest([Message.user("x")]))).text == "after retry"
    assert len(fake.requests) == 2


async def test_error_event_and_cut_connection_mid_stream(fake: FakeAnthropicServer) -> None:
    fake.enqueue(FakeStreamError(AnthropicReply("a long answer that never ends"), after_events=4))
    with pytest.raises(ModelServerError, match=r"overloaded.*in the stream after 3 event") as info:
        await collect(make_model(fake), ModelRequest([Message.user("x")]))
    assert info.value.status_code == 529
    fake.enqueue(FakeAnthropicCut(AnthropicReply("abcdefghijklmnop", chunk_size=2), after_events=5))
    with pytest.raises(ModelResponseError, match=r"was cut after 4 event"):
        await collect(make_model(fake), ModelRequest([Message.user("x")]))


async def test_timeout_and_connection_errors(fake: FakeAnthropicServer) -> None:
    def slow(body: dict[str, Any]) -> AnthropicReply:
        time.sleep(1.0)
        return AnthropicReply("late")

    fake.enqueue(slow)
    with pytest.raises(ModelTimeout, match=r"did not answer within 0\.2 s for model"):
        await make_model(fake, timeout=0.2).complete(ModelRequest([Message.user("x")]))
    closed = AnthropicChatModel("claude", base_url="http://127.0.0.1:9", api_key="k", max_retries=0)
    _open.append(closed)
    with pytest.raises(ModelConnectionError, match="could not reach"):
        await closed.complete(ModelRequest([Message.user("x")]))


async def test_exact_token_count_endpoint(fake: FakeAnthropicServer) -> None:
    model = make_model(fake)
    small = await model.count_tokens(ModelRequest([Message.user("hi")]))
    large = await model.count_tokens(ModelRequest([Message.user("hi " * 400)], instructions="Be brief.",
                                                  tools=[add.spec]))
    assert 0 < small < large
    assert "max_tokens" not in fake.requests[-1]


def test_configuration_from_environment_and_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="ANTHROPIC_MODEL"):
        AnthropicChatModel()
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        AnthropicChatModel("claude-sonnet-5")
    monkeypatch.setenv("ANTHROPIC_MODEL", "from-env")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    model = AnthropicChatModel()
    assert (model.name, model.provider, model.client.api_key) == ("from-env", "anthropic", "sk-env")


def test_bedrock_and_vertex_clients_are_built_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUD_ML_REGION", raising=False)
    bedrock = AnthropicChatModel.bedrock("anthropic.claude-sonnet-5-v1:0", aws_region="us-east-1",
                                         api_key="bedrock-key")
    assert (bedrock.provider, type(bedrock.client).__name__) == ("aws.bedrock", "AsyncAnthropicBedrock")
    assert "bedrock-runtime.us-east-1" in str(bedrock.client.base_url)
    vertex = AnthropicChatModel.vertex("claude-sonnet-5", region="us-east5", project_id="proj",
                                       access_token="token")
    assert (vertex.provider, type(vertex.client).__name__) == ("gcp.vertex_ai", "AsyncAnthropicVertex")
    with pytest.raises(UsageError, match="CLOUD_ML_REGION"):
        AnthropicChatModel.vertex("claude")


async def test_claude_on_vertex_through_the_sdk_against_the_fake(fake: FakeAnthropicServer) -> None:
    fake.enqueue(AnthropicReply("Hi from Vertex."), AnthropicReply("Streamed from Vertex."))
    model = AnthropicChatModel.vertex("claude-sonnet-5", region="us-east5", project_id="proj", access_token="token",
                                      base_url=fake.base_url + "/v1", max_retries=0)
    _open.append(model)
    assert (await model.complete(ModelRequest([Message.user("hi")]))).text == "Hi from Vertex."
    _, final = await collect(model, ModelRequest([Message.user("hi")]))
    assert final.text == "Streamed from Vertex."
    assert [body["model"] for body in fake.requests] == ["claude-sonnet-5"] * 2
    assert all("anthropic_version" in body for body in fake.requests)
    assert await model.count_tokens(ModelRequest([Message.user("hi")])) > 0


async def test_claude_on_bedrock_through_the_sdk_against_the_fake(fake: FakeAnthropicServer) -> None:
    fake.enqueue(AnthropicReply("Hi from Bedrock.", thinking="hm"))
    model = AnthropicChatModel.bedrock("anthropic.claude-sonnet-5-v1:0", aws_region="us-east-1", api_key="br-key",
                                       base_url=fake.base_url, max_retries=0)
    _open.append(model)
    response = await model.complete(ModelRequest([Message.user("hi")], instructions="sys", settings=THINK))
    assert response.text == "Hi from Bedrock."
    assert response.messages[0].parts[0] == ReasoningPart("hm", signature_for("hm"), "anthropic.thinking")
    body = fake.requests[0]
    assert body["model"] == "anthropic.claude-sonnet-5-v1:0" and "anthropic_version" in body
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}


async def test_max_tokens_leaves_room_above_a_large_thinking_budget(fake: FakeAnthropicServer) -> None:
    model = make_model(fake, max_tokens=2000)
    await model.complete(ModelRequest([Message.user("x")],
                                      settings={"anthropic_thinking": {"type": "enabled", "budget_tokens": 16000}}))
    assert fake.requests[0]["max_tokens"] == 18000
    await model.complete(ModelRequest([Message.user("x")], settings=THINK))
    assert fake.requests[1]["max_tokens"] == 2000


async def test_parts_it_cannot_send_are_noted_and_its_own_unknown_blocks_go_back(fake: FakeAnthropicServer) -> None:
    from contextpipe.messages import UnknownPart

    history = [Message("user", (TextPart("q"), UnknownPart("future_kind", {"x": 1}))),
               Message("assistant", (UnknownPart("anthropic.text", {"type": "text", "text": "kept verbatim"}),)),
               Message.user("more")]
    response = await make_model(fake, cache=None).complete(ModelRequest(history))
    assert response.notes == ("left out 1 part(s) of kind 'future_kind': Claude cannot accept them",)
    assert fake.requests[0]["messages"][1]["content"] == [{"type": "text", "text": "kept verbatim"}]
