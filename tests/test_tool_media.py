"""Images, audio and files returned by tools reach the model, in the form each API accepts.

A real MCP server (the fixture server, over stdio) returns an image; the agent loop runs each
official SDK against the local fake servers, which check what the real APIs check; the request the
fake received carries the image, and the stored session keeps it.
"""

from __future__ import annotations

import base64
import struct
import sys
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from contextpipe import Agent, Message
from contextpipe._media import UNKNOWN_IMAGE_TOKENS, image_size, image_tokens, media_tokens
from contextpipe.compaction import ClearToolResults, Summarize, compact
from contextpipe.messages import DataPart, FunctionCall, FunctionResult, UriPart
from contextpipe.models import ChatModel, ModelRequest
from contextpipe.models.anthropic import AnthropicChatModel
from contextpipe.models.openai import OpenAIChatModel
from contextpipe.models.openai_responses import OpenAIResponsesModel
from contextpipe.providers import History
from contextpipe.providers.mcp import McpTools, StdioServer
from contextpipe.stores import SQLiteStore
from contextpipe.testing import AnthropicReply, FakeAnthropicServer, FakeOpenAIServer, FakeReply, ScriptedModel
from contextpipe.testing.wire import assert_chat_request, assert_messages_request, assert_responses_request
from contextpipe.tokens import EstimateTokenizer, TokenCounter

SERVER = str(Path(__file__).parent / "fixtures" / "mcp_server.py")
CLIENTS = ["chat", "responses", "anthropic"]


def png(width: int, height: int) -> bytes:
    """A real PNG of `width` x `height` black pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x00" * 3 * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


WAV = (b"RIFF" + struct.pack("<I", 36 + 32000) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
       + b"data" + struct.pack("<I", 32000) + b"\x00" * 32000)  # one second of silence


class Side:
    """One client against its fake server."""

    def __init__(self, kind: str, fake: FakeOpenAIServer, model: ChatModel) -> None:
        self.kind, self.fake, self.model = kind, fake, model

    def enqueue_call(self, name: str) -> None:
        if self.kind == "anthropic":
            self.fake.enqueue(AnthropicReply(tool_calls=((name, "{}"),)), AnthropicReply("A red pixel."))
        else:
            self.fake.enqueue(FakeReply(tool_calls=((name, "{}"),)), FakeReply("A red pixel."))

    def check(self, body: dict[str, Any]) -> None:
        checks = {"chat": assert_chat_request, "responses": assert_responses_request,
                  "anthropic": assert_messages_request}
        checks[self.kind](body)


@pytest.fixture(params=CLIENTS)
async def side(request: pytest.FixtureRequest) -> AsyncIterator[Side]:
    kind = request.param
    fake: FakeOpenAIServer = FakeAnthropicServer() if kind == "anthropic" else FakeOpenAIServer()
    with fake:
        model: Any
        if kind == "anthropic":
            model = AnthropicChatModel("claude-test", base_url=fake.base_url, api_key="k", max_retries=0)
        elif kind == "responses":
            model = OpenAIResponsesModel("gpt-test", base_url=fake.base_url, api_key="k", max_retries=0)
        else:
            model = OpenAIChatModel("gpt-test", base_url=fake.base_url, api_key="k", max_retries=0)
        async with model:
            yield Side(kind, fake, model)


def sent_media(kind: str, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Return the tool result's text and its media, as the request carried them."""
    if kind == "anthropic":
        [result] = [b for b in body["messages"][-1]["content"] if b["type"] == "tool_result"]
        blocks = result["content"]
        assert blocks[0]["type"] == "text"
        return blocks[0]["text"], blocks[1:]
    if kind == "responses":
        [output] = [i for i in body["input"] if i.get("type") == "function_call_output"]
        items = output["output"]
        assert items[0]["type"] == "input_text"
        return items[0]["text"], items[1:]
    *_, call, tool, user = body["messages"]
    assert call["role"] == "assistant" and tool["role"] == "tool" and user["role"] == "user"
    assert isinstance(tool["content"], str)  # a tool message takes text only
    label, *media = user["content"]
    assert label == {"type": "text", "text": f"Image returned by tool 'picture' (call id {tool['tool_call_id']}):"}
    return tool["content"], media


def image_bytes(kind: str, media: dict[str, Any]) -> bytes:
    if kind == "anthropic":
        assert media["type"] == "image" and media["source"]["type"] == "base64"
        assert media["source"]["media_type"] == "image/png"
        return base64.b64decode(media["source"]["data"])
    url = media["image_url"] if kind == "responses" else media["image_url"]["url"]
    assert media["type"] == ("input_image" if kind == "responses" else "image_url")
    assert url.startswith("data:image/png;base64,")
    return base64.b64decode(url.split(",", 1)[1])


async def test_an_mcp_image_reaches_the_model_and_the_stored_session(side: Side, tmp_path: Path) -> None:
    side.enqueue_call("picture")
    store = SQLiteStore(tmp_path / "sessions.db")
    async with McpTools(StdioServer(sys.executable, [SERVER]), include=["picture"], offer_resources=False) as mcp:
        agent = Agent(side.model, providers=[History(store), mcp])
        session = await agent.session("pixel")
        result = await agent.run("Show me the pixel.", session=session)
    assert result.text == "A red pixel."
    _first, second = side.fake.requests
    side.check(second)
    text, media = sent_media(side.kind, second)
    assert text.startswith("A red pixel.\n[image: image/png, ")
    [image] = media
    sent = image_bytes(side.kind, image)
    assert sent.startswith(b"\x89PNG") and image_size(sent) == (1, 1)
    # The stored session round-trips the image: a new store object reads the file back.
    await store.close()
    reopened = SQLiteStore(tmp_path / "sessions.db")
    stored = (await reopened.load("default", "pixel")).messages
    await reopened.close()
    [tool_result] = [r for m in stored for r in m.function_results]
    assert tool_result.parts == (DataPart(sent, "image/png"),)
    assert [m.id for m in stored] == [m.id for m in [*result.input, *result.messages]]


def call_and_result(*parts: DataPart | UriPart, text: str = "Here it is.") -> list[Message]:
    return [Message.user("Fetch it."), Message("assistant", (FunctionCall("call_1", "fetch", "{}"),)),
            Message("tool", (FunctionResult("call_1", text, parts=parts),))]


async def test_media_an_api_cannot_take_is_named_in_the_text_and_the_trace(side: Side) -> None:
    bmp = DataPart(b"BM" + b"\x00" * 60, "image/bmp")
    parts = (DataPart(png(2, 2), "image/png"), DataPart(WAV, "audio/wav"), bmp,
             UriPart("https://example.com/report.pdf", "application/pdf"))
    side.fake.enqueue(AnthropicReply("ok") if side.kind == "anthropic" else FakeReply("ok"))
    response = await side.model.complete(ModelRequest(call_and_result(*parts)))
    [body] = side.fake.requests
    side.check(body)
    text, media = sent_media(side.kind, body) if side.kind != "chat" else chat_media(body)
    kinds = [m["type"] for m in media]
    left_out = {"chat": ["image/bmp", "application/pdf at https://example.com/report.pdf"],
                "responses": ["audio/wav", "image/bmp"], "anthropic": ["audio/wav", "image/bmp"]}[side.kind]
    assert kinds == {"chat": ["image_url", "input_audio"], "responses": ["input_image", "input_file"],
                     "anthropic": ["image", "document"]}[side.kind]
    assert text.startswith("Here it is.\n")
    note = text.splitlines()[-1]
    assert note.startswith("[left out of this result: ") and all(what in note for what in left_out)
    [traced] = [n for n in response.notes if n.startswith("left out of tool result call_1")]
    assert all(what in traced for what in left_out)


def chat_media(body: dict[str, Any], what: str = "Audio and image") -> tuple[str, list[dict[str, Any]]]:
    *_, tool, user = body["messages"]
    label, *media = user["content"]
    assert label["text"] == f"{what} returned by tool 'fetch' (call id call_1):"
    return tool["content"], media


async def test_chat_completions_sends_media_after_every_tool_message_of_the_turn(tmp_path: Path) -> None:
    calls = Message("assistant", (FunctionCall("a", "chart", "{}"), FunctionCall("b", "lookup", "{}")))
    results = [Message("tool", (FunctionResult("a", "chart", parts=(DataPart(png(1, 1), "image/png"),)),)),
               Message("tool", (FunctionResult("b", "plain text"),))]
    with FakeOpenAIServer() as fake:
        async with OpenAIChatModel("gpt-test", base_url=fake.base_url, api_key="k", max_retries=0) as model:
            await model.complete(ModelRequest([Message.user("go"), calls, *results, Message.user("and?")]))
    [body] = fake.requests
    assert_chat_request(body)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "tool", "user", "user"]
    assert body["messages"][4]["content"][0]["text"] == "Image returned by tool 'chart' (call id a):"
    assert body["messages"][2]["content"].endswith("[1 attachment(s) of this result follow in the next user message]")


def rejects(call: Callable[[], Any]) -> str:
    """Return the 400 error the fake server answered `call` with."""
    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as info:
        call()
    return str(info.value)


async def test_the_fake_servers_reject_media_where_the_apis_reject_it() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    with FakeOpenAIServer() as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
        tool_with_image = [{"role": "user", "content": "hi"}, call,
                           {"role": "tool", "tool_call_id": "c1", "content": [image]}]
        assert "image_url" in rejects(lambda: client.chat.completions.create(model="m", messages=tool_with_image))
        user_between = [{"role": "user", "content": "hi"}, call, {"role": "user", "content": [image]},
                        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
        assert "did not have response messages: c1" in rejects(
            lambda: client.chat.completions.create(model="m", messages=user_between))
        fake.enqueue(FakeReply(tool_calls=(("f", "{}"),)))
        first = client.responses.create(model="m", input="hi", store=True)
        call_id = first.output[0].call_id  # type: ignore[union-attr]
        audio = [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]
        assert "output[0].type" in rejects(lambda: client.responses.create(
            model="m", previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call_id, "output": audio}]))  # type: ignore[list-item]
    with FakeAnthropicServer() as fake_claude:
        claude = anthropic.Anthropic(base_url=fake_claude.base_url, api_key="k", max_retries=0)
        bmp = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "Qk0="}}
        messages: Any = [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [bmp]}]}]
        assert "media_type" in rejects(lambda: claude.messages.create(model="m", max_tokens=5, messages=messages))


# --- token counts and compaction --------------------------------------------------------------------------


def test_image_sizes_are_read_from_headers() -> None:
    assert image_size(png(3, 2)) == (3, 2)
    jpeg = (b"\xff\xd8" + b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
            + b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 480, 640) + b"\x03" + b"\x00" * 9)
    assert image_size(jpeg) == (640, 480)
    webp = b"RIFF" + b"\x00" * 4 + b"WEBPVP8X" + b"\x00" * 8 + (799).to_bytes(3, "little") + (599).to_bytes(3, "little")
    assert image_size(webp) == (800, 600)
    assert image_size(b"GIF89a" + struct.pack("<HH", 10, 20)) == (10, 20)
    assert image_size(b"not an image") is None and image_size(b"\xff\xd8\xff") is None


def test_real_files_are_recognised_whole_and_from_their_first_64_kib() -> None:
    from contextpipe._media import sniff

    segment = lambda marker, size: b"\xff" + bytes([marker]) + struct.pack(">H", size) + bytes(size - 2)  # noqa: E731
    frame = b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 480, 640) + b"\x03" + bytes(9)
    # EXIF (60 KB) and a 200 KB ICC profile in four APP2 segments: the frame header is past 64 KiB
    jpeg = (b"\xff\xd8" + segment(0xE1, 60_000) + segment(0xE2, 65_535) * 3 + segment(0xE2, 3_400) + frame
            + b"\xff\xda" + bytes(100) + b"\xff\xd9")
    gif = (b"GIF89a" + struct.pack("<HHBBB", 2, 2, 0x80, 0, 0) + bytes(6)
           + b"\x2c" + struct.pack("<HHHHB", 0, 0, 2, 2, 0) + b"\x02\x02\x44\x01\x00;")
    vp8l = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + ((63) | (47 << 14)).to_bytes(4, "little") + b"\x00"
    webp = b"RIFF" + struct.pack("<I", 4 + len(vp8l)) + b"WEBP" + vp8l
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n" + bytes(80_000) + b"\ntrailer << >>\n%%EOF\n"
    for data, kind in [(png(3, 2), "image/png"), (jpeg, "image/jpeg"), (gif, "image/gif"), (webp, "image/webp"),
                       (pdf, "application/pdf")]:
        assert sniff(data) == kind and sniff(data[:65536], size=len(data), tail=data[-1024:]) == kind
    assert image_size(jpeg) == (640, 480) and media_tokens(DataPart(jpeg, "image/jpeg")) == image_tokens(640, 480)
    assert image_size(webp) == (64, 48)
    bad = jpeg[:60_004] + b"\x00" + jpeg[60_005:]  # the second segment's marker broken
    assert sniff(bad) is None and sniff(bad[:65536], size=len(bad), tail=bad[-1024:]) is None
    assert sniff(jpeg[:65536]) is None  # a whole file (no size given) must reach its frame header


def test_image_tokens_follow_the_documented_rules() -> None:
    assert image_tokens(1092, 1092) == 1590  # Anthropic's table: 1092 x 1092 is about 1,590 tokens
    assert image_tokens(200, 200) == 255  # a small image: OpenAI's one tile (85 + 170) is the larger
    assert image_tokens(8000, 8000) <= 1600  # scaled down like the APIs do, never unbounded
    assert media_tokens(UriPart("https://example.com/x.png", "image/png")) == UNKNOWN_IMAGE_TOKENS
    assert media_tokens(DataPart(b"broken", "image/png")) == UNKNOWN_IMAGE_TOKENS
    assert media_tokens(DataPart(WAV, "audio/wav")) == 10  # one second
    assert media_tokens(DataPart(b"%PDF /Type /Pages /Type /Page x /Type /Page", "application/pdf")) == 4000


def test_a_result_counts_its_images_and_clearing_drops_them() -> None:
    counter = TokenCounter(EstimateTokenizer())
    big = DataPart(png(1024, 1024), "image/png")
    plain = Message("tool", (FunctionResult("c1", "A chart."),))
    with_image = Message("tool", (FunctionResult("c1", "A chart.", parts=(big,)),))
    assert counter.raw_message(with_image) - counter.raw_message(plain) == image_tokens(1024, 1024) == 1399


async def test_clear_tool_results_clears_a_large_image() -> None:
    big = DataPart(png(1024, 1024), "image/png")
    messages = [*call_and_result(big, text="A chart."), Message.assistant("Done."), Message.user("Again."),
                Message("assistant", (FunctionCall("call_2", "fetch", "{}"),)),
                Message("tool", (FunctionResult("call_2", "small"),)), Message.assistant("Done.")]
    result = await compact(messages, ClearToolResults(keep_last=1, min_tokens=500), TokenCounter(EstimateTokenizer()))
    [cleared] = [r for m in result.messages for r in m.function_results if r.call_id == "call_1"]
    assert cleared.parts == () and cleared.result.startswith("[cleared to save context: ")
    assert "image/png" in cleared.result and result.tokens_after < result.tokens_before - 1000


async def test_summaries_name_the_media_of_the_results_they_fold() -> None:
    summariser = ScriptedModel(["The user fetched a chart."])
    messages = [*call_and_result(DataPart(png(4, 4), "image/png"), text="A chart."), Message.assistant("Done."),
                Message.user("Next."), Message.assistant("Sure."), Message.user("And?"), Message.assistant("Yes.")]
    result = await compact(messages, Summarize(summariser, keep_last_turns=1), TokenCounter(EstimateTokenizer()))
    assert result.changed
    [request] = summariser.requests
    assert "tool: result: A chart. [with image/png (" in request.messages[0].text


async def test_a_model_told_what_it_reads_gets_only_that(side: Side) -> None:
    side.model.media_types = ("image/*",)  # type: ignore[attr-defined]
    side.fake.enqueue(AnthropicReply("ok") if side.kind == "anthropic" else FakeReply("ok"))
    parts = (DataPart(png(2, 2), "image/png"), DataPart(WAV, "audio/wav"))
    response = await side.model.complete(ModelRequest(call_and_result(*parts)))
    [body] = side.fake.requests
    side.check(body)
    text, media = sent_media(side.kind, body) if side.kind != "chat" else chat_media(body, "Image")
    assert len(media) == 1 and "image" in media[0]["type"]  # the PNG; the WAV was left out for this model
    note = (f"[left out of this result: audio/wav (32,044 bytes); model {side.model.name!r} cannot take this "
            "content here]")
    assert text.splitlines()[1] == note
    assert any("reads only image/*" in n for n in response.notes)


async def test_a_text_only_model_gets_the_text_and_a_note() -> None:
    with FakeOpenAIServer() as fake:
        async with OpenAIChatModel("llama3.2", base_url=fake.base_url, api_key="k", max_retries=0,
                                   media_types=()) as model:
            response = await model.complete(ModelRequest(call_and_result(DataPart(png(1, 1), "image/png"))))
    [body] = fake.requests
    assert_chat_request(body)
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool"]  # no media message
    assert body["messages"][2]["content"].startswith("Here it is.\n[left out of this result: image/png (")
    assert any("reads only text" in n for n in response.notes)
