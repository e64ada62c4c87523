"""Exported spans checked against the OpenTelemetry GenAI semantic conventions as published.

The attribute names per operation and the JSON schemas of ``gen_ai.input.messages``,
``gen_ai.output.messages`` and ``gen_ai.system_instructions`` below are written from the published
conventions (open-telemetry/semantic-conventions: docs/gen-ai/gen-ai-spans.md,
gen-ai-agent-spans.md, gen-ai-input-messages.json, gen-ai-output-messages.json,
gen-ai-system-instructions.json). The model is the real OpenAI SDK talking HTTP to a local fake server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from contextpipe import Agent, Message, ModelError, ToolOutcome, tool
from contextpipe.messages import DataPart
from contextpipe.models import DescribedModel, ModelInfo, ModelRequest, ResponseComplete
from contextpipe.models.anthropic import AnthropicChatModel
from contextpipe.models.openai import OpenAIChatModel
from contextpipe.models.openai_responses import OpenAIResponsesModel
from contextpipe.telemetry import Telemetry
from contextpipe.testing import FakeAnthropicServer, FakeError, FakeOpenAIServer, FakeReply

# --- the conventions ----------------------------------------------------------------------------------

COMMON = {"gen_ai.operation.name", "gen_ai.provider.name", "error.type", "server.address", "server.port"}
INFERENCE = COMMON | {
    "gen_ai.request.model", "gen_ai.conversation.id", "gen_ai.output.type", "gen_ai.request.choice.count",
    "gen_ai.request.seed", "gen_ai.request.frequency_penalty", "gen_ai.request.max_tokens",
    "gen_ai.request.presence_penalty", "gen_ai.request.stop_sequences", "gen_ai.request.temperature",
    "gen_ai.request.top_k", "gen_ai.request.top_p", "gen_ai.response.finish_reasons", "gen_ai.response.id",
    "gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.reasoning.output_tokens",
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.tool.definitions",
}
ALLOWED = {
    "chat": INFERENCE,
    "invoke_agent": INFERENCE | {"gen_ai.agent.id", "gen_ai.agent.name", "gen_ai.agent.description",
                                 "gen_ai.agent.version", "gen_ai.data_source.id"},
    "execute_tool": {"gen_ai.operation.name", "error.type", "gen_ai.tool.call.id", "gen_ai.tool.description",
                     "gen_ai.tool.name", "gen_ai.tool.type", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"},
}
REQUIRED = {"chat": {"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model"},
            "invoke_agent": {"gen_ai.operation.name", "gen_ai.provider.name"},
            "execute_tool": {"gen_ai.operation.name", "gen_ai.tool.name"}}
WELL_KNOWN_PROVIDERS = {"openai", "anthropic", "azure.ai.openai", "azure.ai.inference", "aws.bedrock", "cohere",
                        "deepseek", "gcp.gemini", "gcp.gen_ai", "gcp.vertex_ai", "groq", "ibm.watsonx.ai",
                        "mistral_ai", "perplexity", "x_ai"}
FINISH_REASONS = ["stop", "length", "content_filter", "tool_call", "error"]

_MODALITY = {"anyOf": [{"enum": ["image", "video", "audio"]}, {"type": "string"}]}
_NULLABLE_STRING = {"anyOf": [{"type": "string"}, {"type": "null"}]}
PART_DEFS: dict[str, Any] = {
    "TextPart": {"type": "object", "required": ["type", "content"],
                 "properties": {"type": {"const": "text"}, "content": {"type": "string"}}},
    "ToolCallRequestPart": {"type": "object", "required": ["type", "name"],
                            "properties": {"type": {"const": "tool_call"}, "id": _NULLABLE_STRING,
                                           "name": {"type": "string"}, "arguments": {}}},
    "ToolCallResponsePart": {"type": "object", "required": ["type", "response"],
                             "properties": {"type": {"const": "tool_call_response"}, "id": _NULLABLE_STRING,
                                            "response": {}}},
    "BlobPart": {"type": "object", "required": ["type", "modality", "content"],
                 "properties": {"type": {"const": "blob"}, "mime_type": _NULLABLE_STRING, "modality": _MODALITY,
                                "content": {"type": "string"}}},
    "UriPart": {"type": "object", "required": ["type", "modality", "uri"],
                "properties": {"type": {"const": "uri"}, "mime_type": _NULLABLE_STRING, "modality": _MODALITY,
                               "uri": {"type": "string"}}},
    "ReasoningPart": {"type": "object", "required": ["type", "content"],
                      "properties": {"type": {"const": "reasoning"}, "content": {"type": "string"}}},
}
_ANY_PART = {"oneOf": [{"$ref": f"#/$defs/{name}"} for name in PART_DEFS]}
INPUT_MESSAGES_SCHEMA = {
    "$defs": PART_DEFS, "type": "array",
    "items": {"type": "object", "required": ["role", "parts"],
              "properties": {"role": {"anyOf": [{"enum": ["system", "user", "assistant", "tool"]},
                                                {"type": "string"}]},
                             "parts": {"type": "array", "items": _ANY_PART}, "name": _NULLABLE_STRING}},
}
OUTPUT_MESSAGES_SCHEMA = {
    "$defs": PART_DEFS, "type": "array",
    "items": {"type": "object", "required": ["role", "parts", "finish_reason"],
              "properties": {"role": {"type": "string"}, "parts": {"type": "array", "items": _ANY_PART},
                             "finish_reason": {"anyOf": [{"enum": FINISH_REASONS}, {"type": "string"}]}}},
}
SYSTEM_INSTRUCTIONS_SCHEMA = {"$defs": PART_DEFS, "type": "array", "items": _ANY_PART}


def check_span(span: ReadableSpan) -> str:
    """Check one exported span against the conventions; return its operation name."""
    attributes = dict(span.attributes or {})
    operation = attributes["gen_ai.operation.name"]
    assert isinstance(operation, str) and operation in ALLOWED, operation
    assert span.name.startswith(f"{operation} ")
    ours = {k for k in attributes if k.startswith("contextpipe.")}
    unknown = set(attributes) - ALLOWED[operation] - ours
    assert not unknown, f"{span.name}: attributes outside the conventions: {unknown}"
    assert REQUIRED[operation] <= set(attributes), f"{span.name}: missing {REQUIRED[operation] - set(attributes)}"
    if "gen_ai.provider.name" in attributes:
        assert attributes["gen_ai.provider.name"] in WELL_KNOWN_PROVIDERS
    if "server.address" in attributes:
        assert isinstance(attributes["server.address"], str) and isinstance(attributes["server.port"], int)
    if "gen_ai.input.messages" in attributes:
        jsonschema.validate(json.loads(str(attributes["gen_ai.input.messages"])), INPUT_MESSAGES_SCHEMA)
    if "gen_ai.output.messages" in attributes:
        jsonschema.validate(json.loads(str(attributes["gen_ai.output.messages"])), OUTPUT_MESSAGES_SCHEMA)
    if "gen_ai.system_instructions" in attributes:
        jsonschema.validate(json.loads(str(attributes["gen_ai.system_instructions"])), SYSTEM_INSTRUCTIONS_SCHEMA)
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "server.port"):
        if key in attributes:
            assert isinstance(attributes[key], int)
    if span.status.status_code == StatusCode.ERROR:
        assert isinstance(attributes.get("error.type"), str) and attributes["error.type"]
    expected_kind = SpanKind.CLIENT if operation == "chat" else SpanKind.INTERNAL
    assert span.kind == expected_kind
    return str(operation)


# --- the run ------------------------------------------------------------------------------------------


@tool
def get_weather(city: str) -> str:
    """Return the weather for a city."""
    return f"{city}: 24 C, sunny"


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


async def test_exported_spans_follow_the_published_conventions(
        server: FakeOpenAIServer, exporter: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, spans = exporter
    server.enqueue(FakeReply(tool_calls=(("get_weather", '{"city": "Suzhou"}'),), usage=(80, 12)),
                   FakeReply("Wear a T-shirt.", usage=(120, 6)))
    async with OpenAIChatModel("gpt-4o", base_url=server.base_url, api_key="sk-test", max_retries=0) as model:
        agent = Agent(model, tools=[get_weather], instructions="You give clothing advice.", name="stylist",
                      telemetry=Telemetry(tracer_provider=provider, capture_content=True))
        result = await agent.run("What should I wear in Suzhou?", session=await agent.session("conv-7"))
    assert result.text == "Wear a T-shirt."
    finished = spans.get_finished_spans()
    operations = [check_span(s) for s in finished if "gen_ai.operation.name" in (s.attributes or {})]
    assert sorted(operations) == ["chat", "chat", "execute_tool", "invoke_agent"]

    port = int(server.base_url.split(":")[2].split("/")[0])
    agent_span = next(s for s in finished if s.name == "invoke_agent stylist")
    chats = [s for s in finished if s.name == "chat gpt-4o"]
    for span in [agent_span, *chats]:
        attributes = span.attributes or {}
        assert attributes["gen_ai.provider.name"] == "openai"
        assert (attributes["server.address"], attributes["server.port"]) == ("127.0.0.1", port)
    first, second = (dict(s.attributes or {}) for s in chats)
    ids = [first["gen_ai.response.id"], second["gen_ai.response.id"]]
    assert all(str(i).startswith("chatcmpl-") for i in ids) and ids[0] != ids[1]  # the server's completion ids
    assert first["gen_ai.response.model"] == "gpt-4o"  # as the server answered
    assert first["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert json.loads(str(first["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "You give clothing advice."}]
    assert json.loads(str(first["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "What should I wear in Suzhou?"}]}]
    [call] = json.loads(str(first["gen_ai.output.messages"]))
    assert call["finish_reason"] == "tool_call" and call["role"] == "assistant"
    assert call["parts"][0]["type"] == "tool_call" and call["parts"][0]["arguments"] == {"city": "Suzhou"}
    history = json.loads(str(second["gen_ai.input.messages"]))
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert history[2]["parts"] == [{"type": "tool_call_response", "id": call["parts"][0]["id"],
                                    "response": "Suzhou: 24 C, sunny"}]
    assert json.loads(str(second["gen_ai.output.messages"])) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "Wear a T-shirt."}], "finish_reason": "stop"}]


async def test_a_failed_call_carries_error_type(
        server: FakeOpenAIServer, exporter: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, spans = exporter
    server.enqueue(FakeError(503, "overloaded"))
    async with OpenAIChatModel("gpt-4o", base_url=server.base_url, api_key="sk-test", max_retries=0) as model:
        agent = Agent(model, telemetry=Telemetry(tracer_provider=provider))
        with pytest.raises(ModelError):
            await agent.run("hi")
    finished = spans.get_finished_spans()
    for span in finished:
        if "gen_ai.operation.name" in (span.attributes or {}):
            check_span(span)
    chat = next(s for s in finished if s.name == "chat gpt-4o")
    assert chat.status.status_code == StatusCode.ERROR and chat.attributes
    assert chat.attributes["error.type"] == "ModelServerError"


def test_the_checker_catches_violations() -> None:
    good = [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    jsonschema.validate(good, INPUT_MESSAGES_SCHEMA)
    for bad in ([{"role": "user", "content": "hi"}],  # our old storage format, not the conventions'
                [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}],
                [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1"}]}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, INPUT_MESSAGES_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"role": "assistant", "parts": []}], OUTPUT_MESSAGES_SCHEMA)  # no finish_reason


@tool
def draw_chart(metric: str) -> ToolOutcome:
    """Draw a chart of a metric."""
    return ToolOutcome(f"A chart of {metric}.", parts=(DataPart(b"\x89PNG\r\n\x1a\n", "image/png"),))


async def test_a_streamed_call_carries_the_response_id_the_server_sent(
        server: FakeOpenAIServer, exporter: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, spans = exporter
    server.enqueue(FakeReply(tool_calls=(("draw_chart", '{"metric": "sales"}'),)), FakeReply("Sales rose."))
    async with OpenAIChatModel("gpt-4o", base_url=server.base_url, api_key="sk-test", max_retries=0) as model:
        agent = Agent(model, tools=[draw_chart], telemetry=Telemetry(tracer_provider=provider, capture_content=True))
        async with agent.stream("How did sales go?") as events:
            async for _ in events:
                pass
        assert events.result is not None and events.result.text == "Sales rose."
    assert all(r.get("stream") for r in server.requests)
    finished = spans.get_finished_spans()
    for span in finished:
        if "gen_ai.operation.name" in (span.attributes or {}):
            check_span(span)
    chats = [dict(s.attributes or {}) for s in finished if s.name == "chat gpt-4o"]
    assert [c["gen_ai.response.id"] for c in chats] == server.response_ids  # the chunks' id, per call
    assert len(set(server.response_ids)) == 2
    tool_message = json.loads(str(chats[1]["gen_ai.input.messages"]))[2]
    assert [p["type"] for p in tool_message["parts"]] == ["tool_call_response", "blob"]  # the image, as a blob
    assert tool_message["parts"][1]["mime_type"] == "image/png" and tool_message["parts"][1]["modality"] == "image"


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_every_client_reports_the_response_id(kind: str, streamed: bool) -> None:
    fake: FakeOpenAIServer = FakeAnthropicServer() if kind == "anthropic" else FakeOpenAIServer()
    with fake:
        model: Any = (AnthropicChatModel("claude-test", base_url=fake.base_url, api_key="k", max_retries=0)
                      if kind == "anthropic" else
                      (OpenAIResponsesModel if kind == "responses" else OpenAIChatModel)(
                          "gpt-test", base_url=fake.base_url, api_key="k", max_retries=0))
        async with model:
            request = ModelRequest([Message.user("hi")])
            if streamed:
                events = [e async for e in model.stream(request)]
                assert isinstance(events[-1], ResponseComplete)
                response = events[-1].response
            else:
                response = await model.complete(request)
    [sent] = fake.response_ids
    assert response.id == sent and sent.startswith({"chat": "chatcmpl-", "responses": "resp_",
                                                    "anthropic": "msg_"}[kind])


class _Described:
    """A model of one's own that says who serves it."""

    name = "mistral-small"

    @property
    def info(self) -> ModelInfo:
        return ModelInfo("mistral", "https://api.mistral.ai/v1")


class _Undeclared:
    """A model whose private attributes look like a client's: telemetry reads only what is declared."""

    name = "m"
    _provider = "openai"
    _client = type("Client", (), {"base_url": "https://example.com/v1"})()


async def test_telemetry_reads_the_declared_model_info_and_nothing_private() -> None:
    from contextpipe._semconv import agent_attributes

    assert isinstance(_Described(), DescribedModel)
    assert agent_attributes(_Described()) == {"gen_ai.provider.name": "mistral_ai", "server.address": "api.mistral.ai",
                                              "server.port": 443}
    assert agent_attributes(_Undeclared()) == {"gen_ai.provider.name": "_undeclared"}
    async with AnthropicChatModel("claude", api_key="k", base_url="http://127.0.0.1:9") as claude:
        assert claude.info == ModelInfo("anthropic", str(claude.client.base_url))
        assert agent_attributes(claude) == {"gen_ai.provider.name": "anthropic", "server.address": "127.0.0.1",
                                            "server.port": 9}


class _OtherInfo:
    name = "m"

    def info(self) -> str:  # an attribute that happens to be called info: no ModelInfo
        return "not telemetry"


def test_an_unrelated_info_attribute_is_not_read_as_model_info() -> None:
    from contextpipe._semconv import agent_attributes

    assert agent_attributes(_OtherInfo()) == {"gen_ai.provider.name": "_otherinfo"}
