"""Images and PDFs from a tool's bytes, a skill's file and an artifact reach the model as media parts.

Each runs through `Agent.run` with each official SDK against its local fake server (which checks what
the real API checks): the request carries the file's exact bytes where the API takes them, a model
that does not take them gets the text and a note naming what was left out, the trace counts them,
and the stored session keeps them for a later run.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import Agent, ToolOutcome, tool
from contextpipe.artifacts import put_artifact, read_artifact
from contextpipe.messages import DataPart, FunctionResult
from contextpipe.models import ChatModel
from contextpipe.models.anthropic import AnthropicChatModel
from contextpipe.models.openai import OpenAIChatModel
from contextpipe.models.openai_responses import OpenAIResponsesModel
from contextpipe.providers import Artifacts, Compaction, History, Skills
from contextpipe.stores import MemoryStore, SQLiteStore
from contextpipe.testing import (
    AnthropicReply,
    FakeAnthropicServer,
    FakeOpenAIServer,
    FakeReply,
    ScriptedModel,
    tool_call,
)
from contextpipe.testing.wire import assert_chat_request, assert_messages_request, assert_responses_request
from contextpipe.trace import PromptTrace

PDF = (b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n2 0 obj << /Type /Pages /Kids [3 0 R] /Count 1 >>"
       b" endobj\n3 0 obj << /Type /Page /Parent 2 0 R >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n")
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5Er"
                       "kJggg==")  # 1 x 1 pixel


class Client:
    """One official SDK's client against its fake server."""

    def __init__(self, kind: str, fake: FakeOpenAIServer, model: ChatModel) -> None:
        self.kind, self.fake, self.model = kind, fake, model

    def call_then_answer(self, name: str, **arguments: Any) -> None:
        reply: Any = AnthropicReply if self.kind == "anthropic" else FakeReply
        self.fake.enqueue(reply(tool_calls=((name, json.dumps(arguments)),)), reply("Here it is."))

    def check(self, body: dict[str, Any]) -> None:
        {"chat": assert_chat_request, "responses": assert_responses_request,
         "anthropic": assert_messages_request}[self.kind](body)


@pytest.fixture(params=["chat", "responses", "anthropic"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    kind = request.param
    fake: FakeOpenAIServer = FakeAnthropicServer() if kind == "anthropic" else FakeOpenAIServer()
    with fake:
        model: Any = {"anthropic": AnthropicChatModel, "responses": OpenAIResponsesModel, "chat": OpenAIChatModel}[kind]
        async with model("model-test", base_url=fake.base_url, api_key="k", max_retries=0) as opened:
            yield Client(kind, fake, opened)


def decoded(url: str) -> tuple[str, bytes]:
    head, data = url.split(",", 1)
    return head.removeprefix("data:").removesuffix(";base64"), base64.b64decode(data)


def attachments(kind: str, body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """Every image or file a request carries, as (media type, bytes), wherever its API puts a tool's media."""
    found: list[tuple[str, bytes]] = []
    if kind == "anthropic":
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else ():
                content = block.get("content") if block["type"] == "tool_result" else None
                for item in content if isinstance(content, list) else ():
                    if item["type"] in ("image", "document"):
                        found.append((item["source"]["media_type"], base64.b64decode(item["source"]["data"])))
    elif kind == "responses":
        for item in body["input"]:
            for out in item["output"] if item.get("type") == "function_call_output" and isinstance(
                    item["output"], list) else ():
                if out["type"] in ("input_image", "input_file"):
                    found.append(decoded(out.get("image_url") or out["file_data"]))
    else:  # chat completions: a user message after the tool messages (which take text only)
        for message in body["messages"]:
            content = message["content"]
            for part in content if message["role"] == "user" and isinstance(content, list) else ():
                if part["type"] == "image_url":
                    found.append(decoded(part["image_url"]["url"]))
                elif part["type"] == "file":
                    found.append(decoded(part["file"]["file_data"]))
    return found


async def test_a_tool_returning_bytes_sends_them_and_a_later_run_sends_them_again(client: Client,
                                                                                    tmp_path: Path) -> None:
    @tool
    def brochure() -> bytes:
        """Return the brochure, a PDF."""
        return PDF

    client.call_then_answer("brochure")
    store = SQLiteStore(tmp_path / "media.db")
    agent = Agent(client.model, tools=[brochure], providers=[History(store)])
    session = await agent.session("s")
    result = await agent.run("Show me the brochure.", session=session)
    second = client.fake.requests[1]
    client.check(second)
    assert attachments(client.kind, second) == [("application/pdf", PDF)]
    assert media_counted(result.traces[1])  # a PDF of one page: 2,000 tokens, not its text's 15
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    assert stored.parts == (DataPart(PDF, "application/pdf"),)
    assert stored.result == f"[the tool's result: application/pdf, {len(PDF)} bytes, attached]"
    client.fake.enqueue(AnthropicReply("Again.") if client.kind == "anthropic" else FakeReply("Again."))
    await agent.run("Once more?", session=session)  # the history holds the PDF: it is sent again
    assert attachments(client.kind, client.fake.requests[2]) == [("application/pdf", PDF)]
    await store.close()


async def test_a_skill_pdf_is_given_to_the_model(client: Client, tmp_path: Path) -> None:
    folder = tmp_path / "skills" / "theme-factory"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: theme-factory\ndescription: Themes for slides.\n---\n"
                                     "Display `theme-showcase.pdf` to the user first.\n")
    (folder / "theme-showcase.pdf").write_bytes(PDF)
    client.call_then_answer("read_skill_resource", skill="theme-factory", path="theme-showcase.pdf")
    await Agent(client.model, providers=[Skills(tmp_path / "skills")]).run("Which themes are there?")
    second = client.fake.requests[1]
    client.check(second)
    assert attachments(client.kind, second) == [("application/pdf", PDF)]


async def test_an_artifact_image_is_given_to_the_model(client: Client) -> None:
    store = MemoryStore()
    agent = Agent(client.model, store=store, providers=[Artifacts(store)])
    session = await agent.session("s")
    await put_artifact(store, "default", "s", "floor-plan", PNG, "image/png")
    client.call_then_answer("read_artifact", handle="floor-plan")
    result = await agent.run("What does the floor plan show?", session=session)
    second = client.fake.requests[1]
    client.check(second)
    assert attachments(client.kind, second) == [("image/png", PNG)]
    assert media_counted(result.traces[1])  # an image of 1 x 1 pixel: 255 tokens


async def test_a_model_that_does_not_take_the_media_gets_the_text_and_a_note(client: Client) -> None:
    @tool
    def floor_plan() -> bytes:
        """Return the floor plan, an image."""
        return PNG

    client.model.media_types = ("application/pdf",)  # type: ignore[attr-defined]  # reads PDFs, not images
    client.call_then_answer("floor_plan")
    result = await Agent(client.model, tools=[floor_plan]).run("Show me the floor plan.")
    second = client.fake.requests[1]
    client.check(second)
    assert attachments(client.kind, second) == []
    note = (f"[the tool's result: image/png, {len(PNG)} bytes, attached]\n[left out of this result: image/png "
            f"({len(PNG)} bytes); model 'model-test' cannot take this content here]")
    assert json.dumps(note)[1:-1] in json.dumps(second)
    assert any(n.startswith("left out of tool result") for n in result.traces[1].notes)


async def test_artifacts_keep_a_file_too_big_to_attach_out_of_the_log() -> None:
    big = PDF.replace(b"trailer", b"%" + b"x" * 5_000 + b"\ntrailer")

    @tool
    def report() -> bytes:
        """Return the report."""
        return big

    @tool
    def dump() -> bytes:
        """Return a core dump."""
        return b"\x7fELF\x00" + bytes(100)

    store = MemoryStore()
    model = ScriptedModel([tool_call("report"), tool_call("dump"), lambda r: tool_call("read_artifact", handle=_h(r)),
                           "done"])
    agent = Agent(model, store=store, tools=[report, dump], providers=[Artifacts(store, max_media_bytes=1_000)])
    session = await agent.session("s")
    await agent.run("go", session=session)
    report_result, dump_result = _results(model.requests[2])
    assert report_result.parts == () and dump_result.parts == ()  # neither is sent again
    assert [r.parts for m in await agent.history(session) for r in m.function_results][:2] == [(), ()]  # nor logged
    assert report_result.result.startswith(f"[application/pdf ({len(big):,} bytes) is stored as artifact ")
    assert "over the 1,000-byte limit for attached files" in report_result.result
    assert dump_result.result.startswith("[application/octet-stream (105 bytes) is stored as artifact")
    assert "attached]" not in report_result.result + dump_result.result  # one note each: not "attached", then not
    assert await read_artifact(store, "default", "s", _h(model.requests[1]), length=len(big)) == big  # exactly
    read = _results(model.requests[3])[-1]
    assert read.is_error and read.parts == () and "over the 1,000-byte limit for attached files" in read.result


def media_counted(trace: PromptTrace) -> bool:
    """Whether the tool result's media dominate the call's tokens (the trace scales estimates by the usage reported)."""
    [result] = [m for m in trace.messages if m.role == "tool"]
    return result.tokens * 2 > trace.total_tokens


def _results(request: Any) -> list[FunctionResult]:
    return [r for m in request.messages for r in m.function_results]


def _h(request: Any) -> str:
    return str(_results(request)[0].result.split("stored as artifact '", 1)[1].split("'", 1)[0])


@given(st.binary(max_size=64) | st.sampled_from([PDF, PNG, b"GIF89a\x01\x00\x01\x00", b"\xff\xd8\xff\xe0"]))
def test_bytes_a_tool_returns_are_kept_exactly(data: bytes) -> None:
    import asyncio

    @tool
    def raw() -> bytes:
        """Return bytes."""
        return data

    outcome = asyncio.run(raw.invoke("{}"))
    if outcome.parts:
        [part] = outcome.parts
        assert isinstance(part, DataPart) and part.data == data
    else:
        assert outcome.result.encode() == data


TEXT_LIKE_MEDIA = [b"GIF89a is the format of the old banner; keep it;", b"%PDF-1.7 is the version we write.",
                   b"RIFF....WEBP is a container", b"GIF87a: the first GIF, 1987."]


@pytest.mark.parametrize("data", TEXT_LIKE_MEDIA)
async def test_text_that_starts_like_a_gif_or_a_pdf_stays_text(data: bytes, tmp_path: Path) -> None:
    @tool
    def notes() -> bytes:
        """Return the notes."""
        return data

    @tool
    def notes_str() -> str:
        """Return the notes as text."""
        return data.decode()

    assert (await notes.invoke("{}")).parts == () and (await notes.invoke("{}")).result == data.decode()
    assert (await notes_str.invoke("{}")).result == data.decode()
    folder = tmp_path / "skills" / "notes"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: notes\ndescription: Notes.\n---\nRead notes.txt.\n")
    (folder / "notes.txt").write_bytes(data)
    model = ScriptedModel([tool_call("load_skill", name="notes"),
                           tool_call("read_skill_resource", skill="notes", path="notes.txt"), "done"])
    await Agent(model, providers=[Skills(tmp_path / "skills")]).run("go")
    listing, read = (_results(model.requests[i])[-1] for i in (1, 2))
    assert "notes.txt (text," in listing.result
    assert read.parts == () and read.result == data.decode()


async def test_an_artifact_of_bytes_that_start_like_a_pdf_is_not_attached() -> None:
    store = MemoryStore()
    await put_artifact(store, "default", "s", "notes", b"%PDF-1.7 is the version we write, \x00 not a PDF",
                       "application/octet-stream")
    model = ScriptedModel([tool_call("read_artifact", handle="notes"), "done"])
    agent = Agent(model, store=store, providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    read = _results(model.requests[1])[-1]
    assert read.is_error and read.parts == () and "neither text nor an image or a PDF" in read.result


async def test_bytes_no_model_reads_cost_only_their_note_so_compaction_keeps_the_earlier_turn() -> None:
    @tool
    def dump() -> bytes:
        """Return a core dump."""
        return b"\x7fELF\x00" + bytes(400_000)

    store = MemoryStore()
    model = ScriptedModel([tool_call("dump"), "It is a core dump.", "Yes, the dump from before."])
    agent = Agent(model, store=store, tools=[dump],
                  providers=[History(store), Compaction(max_input_tokens=50_000)])
    session = await agent.session("s")
    await agent.run("What is in the dump?", session=session)
    result = await agent.run("Is that the same dump?", session=session)
    assert "What is in the dump?" in [m.text for m in model.requests[2].messages]  # not dropped for its size
    [tool_message] = [m for m in result.traces[0].messages if m.role == "tool"]
    assert tool_message.tokens < 200  # the octet-stream's note, not 100,000 tokens of bytes sent nowhere


async def test_a_file_too_big_for_an_artifact_is_an_error_and_logged(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("contextpipe.providers.artifacts.MAX_ARTIFACT_BYTES", 100)

    @tool
    def photo() -> DataPart:
        """Return the photo."""
        return DataPart(PNG + bytes(200), "image/png")

    store = MemoryStore()
    model = ScriptedModel([tool_call("photo"), "done"])
    agent = Agent(model, store=store, tools=[photo], providers=[Artifacts(store, max_media_bytes=50)])
    with caplog.at_level("WARNING", logger="contextpipe.artifacts"):
        await agent.run("go", session=await agent.session("s"))
    [result] = _results(model.requests[1])
    assert result.is_error and result.parts == () and "nothing is stored and it is not attached" in result.result
    assert any("photo" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)


async def test_reading_an_image_artifact_again_from_an_offset_attaches_no_second_copy() -> None:
    store = MemoryStore()
    await put_artifact(store, "default", "s", "plan", PNG, "image/png")
    model = ScriptedModel([tool_call("read_artifact", handle="plan"),
                           tool_call("read_artifact", handle="plan", offset=40, length=40), "done"])
    agent = Agent(model, store=store, providers=[Artifacts(store)])
    session = await agent.session("s")
    await agent.run("go", session=session)
    first, second = (r for m in await agent.history(session) for r in m.function_results)
    assert first.parts == (DataPart(PNG, "image/png"),)
    assert second.is_error and second.parts == () and "attaches it whole with offset 0" in second.result


async def test_an_artifact_gone_before_it_is_read_is_an_error_not_an_empty_attachment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from contextpipe.artifacts import Artifact

    async def there_a_moment_ago(store: Any, tenant: str, session_id: str, artifact_id: str) -> Artifact:
        return Artifact(artifact_id, "image/png", len(PNG))

    monkeypatch.setattr("contextpipe.artifacts.artifact_info", there_a_moment_ago)
    store = MemoryStore()
    model = ScriptedModel([tool_call("read_artifact", handle="plan"), "done"])
    agent = Agent(model, store=store, providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    [read] = _results(model.requests[1])
    assert read.is_error and read.parts == () and "no longer in this session" in read.result


async def test_a_text_result_holding_an_image_is_stored_and_read_back_attached() -> None:
    @tool
    def screenshot() -> str:
        """Return the screenshot, its bytes kept in a str."""
        return PNG.decode("utf-8", "surrogateescape")

    store = MemoryStore()
    model = ScriptedModel([tool_call("screenshot"), lambda r: tool_call("read_artifact", handle=_h(r)), "done"])
    agent = Agent(model, store=store, tools=[screenshot], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    [told] = _results(model.requests[1])
    assert "it is image/png: read_artifact(handle=" in told.result and "attaches it" in told.result
    read = _results(model.requests[2])[-1]
    assert not read.is_error and read.parts == (DataPart(PNG, "image/png"),)


async def test_artifacts_keep_any_file_no_model_reads_out_of_the_log() -> None:
    @tool
    def bundle() -> ToolOutcome:
        """Return the bundle."""
        return ToolOutcome("The bundle.", parts=(DataPart(b"PK\x03\x04" + bytes(60), "application/zip"),))

    store = MemoryStore()
    model = ScriptedModel([tool_call("bundle"), "done"])
    agent = Agent(model, store=store, tools=[bundle], providers=[Artifacts(store)])
    session = await agent.session("s")
    await agent.run("go", session=session)
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    assert stored.parts == () and stored.result.startswith("The bundle.\n[application/zip (64 bytes) is stored as")


LATIN1 = "Café au lait, crème brûlée: the menu of the café, served daily from eight to noon.".encode("cp1252")


@pytest.mark.parametrize("spill", [False, True])
async def test_text_that_is_not_utf8_is_shown_and_its_bytes_kept(spill: bool) -> None:
    @tool
    def menu() -> bytes:
        """Return the menu, as the old system wrote it."""
        return LATIN1

    store = MemoryStore()
    steps: list[Any] = [tool_call("menu"), "done"]
    if spill:
        steps.insert(1, lambda r: tool_call("read_artifact", handle=_h(r)))
    model = ScriptedModel(steps)
    agent = Agent(model, store=store, tools=[menu], providers=[History(store)] + ([Artifacts(store)] if spill else []))
    session = await agent.session("s")
    await agent.run("What is on the menu?", session=session)
    told = _results(model.requests[1])[0]
    assert told.result.startswith("Caf\N{REPLACEMENT CHARACTER} au lait, cr\N{REPLACEMENT CHARACTER}me")
    assert f"5 of the {len(LATIN1)} bytes of the tool's result are not UTF-8" in told.result
    [stored] = [r for m in await agent.history(session) for r in m.function_results][:1]
    if spill:
        assert stored.parts == () and await read_artifact(store, "default", "s", _h(model.requests[1]),
                                                          length=1000) == LATIN1
        read = _results(model.requests[2])[-1]
        assert not read.is_error and "Caf\N{REPLACEMENT CHARACTER} au lait" in read.result
    else:
        assert stored.parts == (DataPart(LATIN1, "text/plain; charset=unknown-8bit"),)  # exactly, for your code


@pytest.mark.parametrize("artifacts", [False, True])
async def test_a_big_file_kept_in_a_result_is_warned_of(artifacts: bool, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("contextpipe._media.MAX_MEDIA_BYTES", 50)

    @tool
    def plan() -> bytes:
        """Return the floor plan."""
        return PNG  # 70 bytes

    store = MemoryStore()
    model = ScriptedModel([tool_call("plan"), "done"])
    agent = Agent(model, store=store, tools=[plan],
                  providers=[Artifacts(store, max_media_bytes=50)] if artifacts else [])
    with caplog.at_level("WARNING", logger="contextpipe.tools"):
        await agent.run("go", session=await agent.session("s"))
    warned = [r.getMessage() for r in caplog.records if r.name == "contextpipe.tools"]
    assert warned == ([] if artifacts else [f"tool 'plan' (call call_1) returned image/png ({len(PNG)} bytes), over 50 "
                      "bytes each: the session keeps them and every later request sends them (an API may refuse "
                      "them all); Artifacts(store) with max_media_bytes at most 50 keeps such files as artifacts"])


async def test_bytes_no_model_reads_are_stored_named_and_not_sent(client: Client) -> None:
    dump = b"\x7fELF\x00" + bytes(20_000)

    @tool
    def core() -> bytes:
        """Return the core dump."""
        return dump

    client.call_then_answer("core")
    store = MemoryStore()
    agent = Agent(client.model, store=store, tools=[core], providers=[History(store)])
    session = await agent.session("s")
    result = await agent.run("What crashed?", session=session)
    second = client.fake.requests[1]
    client.check(second)
    assert attachments(client.kind, second) == []
    assert base64.b64encode(dump[:30]).decode()[:20] not in json.dumps(second)
    note = (f"[the tool's result: {len(dump):,} bytes of application/octet-stream, not text]\n[left out of this "
            f"result: application/octet-stream ({len(dump):,} bytes);")
    assert json.dumps(note)[1:-1] in json.dumps(second)
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    assert stored.parts == (DataPart(dump, "application/octet-stream"),)  # kept exactly, for your code
    [tool_message] = [m for m in result.traces[1].messages if m.role == "tool"]
    assert tool_message.tokens < 200  # its notes, not 5,000 tokens of bytes no model receives


def test_a_pdf_whose_pages_are_compressed_is_counted_by_its_size_or_page_count() -> None:
    from contextpipe._media import media_tokens

    hidden = b"%PDF-1.7\n" + bytes(500_000) + b"\n%%EOF\n"  # page objects in compressed object streams: unseen
    assert media_tokens(DataPart(hidden, "application/pdf")) == 5 * 2000
    counted = PDF.replace(b"/Count 1", b"/Count 30") + bytes(5_000)
    assert media_tokens(DataPart(counted, "application/pdf")) == 30 * 2000
    assert media_tokens(DataPart(PDF, "application/pdf")) == 2000
    photo = PDF.replace(b"trailer", b"4 0 obj << /Type /Page >> endobj\n" + bytes(3_700_000) + b"\ntrailer")
    assert media_tokens(DataPart(photo, "application/pdf")) == 2 * 2000  # its pages are seen: not 37 by its size
