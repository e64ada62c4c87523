"""Property: whatever a session holds (any vendor's reasoning, compaction cuts), the request is valid.

Conversations are generated with parts from every vendor, optionally cut at an exchange boundary
the way compaction cuts them, and built into Messages API and Responses API requests; the fake
servers' request checks (the rules the real APIs enforce) must accept every one, and the reasoning
each vendor can accept must be sent back unchanged.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextpipe import FunctionCall, FunctionResult, Message, ReasoningPart, TextPart
from contextpipe.exchanges import group_messages
from contextpipe.messages import DataPart, UnknownPart, UriPart
from contextpipe.models import AnthropicChatModel, ModelRequest, OpenAIChatModel, OpenAIResponsesModel
from contextpipe.testing import AnthropicReply, FakeAnthropicServer, FakeOpenAIServer, FakeReply
from contextpipe.testing.wire import (
    assert_chat_request,
    assert_messages_request,
    assert_responses_request,
    chat_request_problem,
    messages_request_problem,
    responses_request_items,
    signature_for,
)
from helpers import get_weather_forecast

VENDORS = ("anthropic", "anthropic-redacted", "openai", "plain", None)
MEDIA = st.sampled_from([
    DataPart(b"\x89PNG\r\n\x1a\n", "image/png"), DataPart(b"\xff\xd8\xff", "image/jpeg"),
    DataPart(b"GIF89a", "image/gif"), DataPart(b"BM", "image/bmp"), DataPart(b"RIFF", "audio/wav"),
    DataPart(b"ID3", "audio/mpeg"), DataPart(b"OggS", "audio/ogg"), DataPart(b"%PDF-1.7", "application/pdf"),
    DataPart(b"notes", "text/plain"), DataPart(b"\x00", "application/octet-stream"),
    UriPart("https://example.com/a.png", "image/png"), UriPart("https://example.com/a.svg", "image/svg+xml"),
    UriPart("https://example.com/a.pdf", "application/pdf"), UriPart("https://example.com/a.mp3", "audio/mpeg"),
    UriPart("data:image/png;base64,iVBORw0KGgo=", "image/png"),
    UnknownPart("video", {"uri": "https://example.com/a.mp4"}),  # a kind written by a newer contextpipe
])


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = [Message.user(draw(st.text(min_size=1, max_size=20)))]
    for turn in range(draw(st.integers(1, 6))):
        reasoning = draw(st.sampled_from(VENDORS))
        calls = draw(st.integers(0, 2))
        parts: list[Any] = []
        if reasoning == "anthropic":
            thought = draw(st.text(max_size=15))
            parts.append(ReasoningPart(thought, signature_for(thought), "anthropic.thinking"))
        elif reasoning == "anthropic-redacted":
            parts.append(ReasoningPart("", "blob", "anthropic.redacted_thinking"))
        elif reasoning == "openai":
            parts.append(ReasoningPart("summary", f"enc_{turn}", "openai.reasoning", f"rs_{turn}"))
        elif reasoning == "plain":
            parts.append(ReasoningPart("chat-completions reasoning"))
        if draw(st.booleans()) or not calls:
            parts.append(TextPart(draw(st.text(min_size=1, max_size=20))))
        ids = [f"call_{turn}_{i}" for i in range(calls)]
        parts += [FunctionCall(i, "get_weather_forecast", '{"location_code": "SZ"}') for i in ids]
        messages.append(Message("assistant", tuple(parts)))
        if ids:
            results = tuple(FunctionResult(i, "Sunny", draw(st.booleans()), tuple(draw(st.lists(MEDIA, max_size=3))))
                            for i in ids)
            messages.append(Message("tool", results))
        if not ids or draw(st.booleans()):
            messages.append(Message.user(draw(st.text(min_size=1, max_size=20))))
    groups = group_messages(messages)
    cut = draw(st.integers(0, len(groups) - 1))  # compaction drops whole groups from the front
    return messages[groups[cut].start:]


ANTHROPIC = AnthropicChatModel("claude-fake", api_key="k")
RESPONSES = OpenAIResponsesModel("gpt-fake", api_key="k")
CHAT = OpenAIChatModel("gpt-fake", api_key="k")


def media_accounted(messages: list[Message], sent: int, notes: list[str]) -> None:
    """Every media part of a tool result is either sent or named in a note: none is dropped silently."""
    total = sum(len(r.parts) for m in messages for r in m.function_results)
    named = sum(len(n.split(": ", 1)[1].rsplit(" (", 1)[0].split(", ")) for n in notes
                if n.startswith("left out of tool result"))
    assert sent + named == total, (sent, named, total, notes)


@settings(max_examples=80, deadline=None)
@given(conversations(), st.booleans(), st.sampled_from(["5m", None]))
def test_every_session_becomes_a_valid_messages_api_request(messages: list[Message], thinking: bool,
                                                            cache: str | None) -> None:
    ANTHROPIC.cache = cache  # type: ignore[assignment]
    request = ModelRequest(messages, instructions="Be brief.", tools=[get_weather_forecast.spec],
                           settings={"anthropic_thinking": {"type": "enabled", "budget_tokens": 1024}}
                           if thinking else {})
    body, notes = ANTHROPIC._build(request)
    assert messages_request_problem(body, {"blob"}) is None, (body, notes)
    assert_messages_request(body)
    media_accounted(messages, sum(1 for m in body["messages"] for b in m["content"] if b["type"] == "tool_result"
                                  for c in b.get("content") or () if isinstance(c, dict) and c["type"] != "text"),
                    notes)
    sent = [b for m in body["messages"] for b in m["content"] if b["type"] in ("thinking", "redacted_thinking")]
    kept = [p for m in messages if m.role == "assistant" for p in m.parts
            if isinstance(p, ReasoningPart) and (p.format or "").startswith("anthropic.")]
    assert len(sent) == len(kept)
    assert [b.get("signature", b.get("data")) for b in sent] == [p.encrypted for p in kept]
    others = sum(1 for m in messages for p in m.parts
                 if isinstance(p, ReasoningPart) and not (p.format or "").startswith("anthropic."))
    assert bool(others) == any("left out" in n and "reasoning" in n for n in notes)


@settings(max_examples=80, deadline=None)
@given(conversations())
def test_every_session_becomes_a_valid_responses_api_request(messages: list[Message]) -> None:
    body, notes = RESPONSES._build(ModelRequest(messages, tools=[get_weather_forecast.spec]))
    issued = {f"rs_{i}": f"enc_{i}" for i in range(6)}
    _, problem = responses_request_items(body, issued=issued.get)
    assert problem is None, (body, notes)
    assert_responses_request(body)
    media_accounted(messages, sum(1 for i in body["input"] if i.get("type") == "function_call_output"
                                  for o in i["output"] if isinstance(o, dict) and o["type"] != "input_text"), notes)
    sent = [i["id"] for i in body["input"] if i.get("type") == "reasoning"]
    followed = [p.id for m in messages if m.role == "assistant" for n, p in enumerate(m.parts)
                if isinstance(p, ReasoningPart) and p.format == "openai.reasoning"
                and any(not isinstance(q, ReasoningPart) for q in m.parts[n + 1:])]
    assert sent == followed


@settings(max_examples=80, deadline=None)
@given(conversations())
def test_every_session_becomes_a_valid_chat_completions_request(messages: list[Message]) -> None:
    body, notes = CHAT._build(ModelRequest(messages, tools=[get_weather_forecast.spec]))
    assert chat_request_problem(body) is None, (body, notes)
    assert_chat_request(body)
    media = [c for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], list)
             for c in m["content"]]
    media_accounted(messages, sum(1 for c in media if c["type"] != "text"), notes)


@st.composite
def replies(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    args = draw(st.lists(st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=8),
                                         max_size=3), max_size=2))
    fields = {"text": draw(st.text(max_size=30)), "thinking": draw(st.none() | st.text(max_size=30)),
              "tool_calls": tuple(("get_weather_forecast", json.dumps(a)) for a in args)}
    return fields, draw(st.integers(1, 7))


@settings(max_examples=12, deadline=None)
@given(replies())
def test_streamed_answers_assemble_to_the_plain_answer(reply: tuple[dict[str, Any], int]) -> None:
    fields, chunk = reply

    async def both() -> tuple[Any, Any, Any, Any]:
        with FakeAnthropicServer() as claude, FakeOpenAIServer() as openai:
            claude.enqueue(AnthropicReply(**fields, chunk_size=chunk), AnthropicReply(**fields, chunk_size=chunk))
            openai_fields = {"text": fields["text"], "tool_calls": fields["tool_calls"],
                             "reasoning": fields["thinking"]}
            openai.enqueue(FakeReply(**openai_fields, chunk_size=chunk), FakeReply(**openai_fields, chunk_size=chunk))
            request = ModelRequest([Message.user("q")], tools=[get_weather_forecast.spec])
            results = []
            async with AnthropicChatModel("claude-fake", base_url=claude.base_url, api_key="k", max_retries=0) as a, \
                    OpenAIResponsesModel("gpt-fake", base_url=openai.base_url, max_retries=0) as o:
                for model in (a, o):
                    plain = await model.complete(request)
                    streamed = [e async for e in model.stream(request)][-1].response  # type: ignore[attr-defined]
                    results += [plain, streamed]
            return tuple(results)  # type: ignore[return-value]

    claude_plain, claude_streamed, openai_plain, openai_streamed = asyncio.run(both())
    for plain, streamed in ((claude_plain, claude_streamed), (openai_plain, openai_streamed)):
        assert [_shape(p) for p in streamed.messages[0].parts] == [_shape(p) for p in plain.messages[0].parts]
        assert streamed.finish_reason == plain.finish_reason
    assert claude_streamed.text == fields["text"]
    assert [json.loads(c.arguments) for c in claude_streamed.messages[0].function_calls] == [
        json.loads(a) for _, a in fields["tool_calls"]]


def _shape(part: Any) -> Any:
    """A part without the ids each answer gets anew."""
    if isinstance(part, FunctionCall):
        return ("call", part.name, json.loads(part.arguments))
    if isinstance(part, ReasoningPart) and part.format == "openai.reasoning":
        return ("reasoning", part.text)
    return part
