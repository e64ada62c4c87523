"""Every file a spilled tool result stores is named where the model and the user find it, through each SDK.

`Artifacts` may store a result's text (too long), its bytes (binary) and each of its files (too big,
or of a type no model client takes) in one call: each stored handle must be in the result the session
keeps and in the request the model gets, and a file neither kept nor stored must be said to be lost.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, ToolOutcome, tool
from contextpipe.artifacts import read_artifact
from contextpipe.messages import DataPart
from contextpipe.providers import Artifacts, History, Skills
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, tool_call
from test_media_sources import PNG, Client, attachments, client  # noqa: F401 (the fixture)

LATIN1 = "Café au lait, crème brûlée: the menu of the café, served daily from eight to noon.\n".encode("cp1252")
LONG_LATIN1 = LATIN1 * 300  # 25,500 bytes: over the 20,000-character limit, 1,500 of them not UTF-8


def stored_handles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the handle of every artifact a run stores (the real store still stores it)."""
    import contextpipe.artifacts as artifacts

    handles: list[str] = []
    put = artifacts.put_artifact

    async def recording(store: Any, tenant: str, session_id: str, artifact_id: str, *args: Any, **kw: Any) -> Any:
        handles.append(artifact_id)
        return await put(store, tenant, session_id, artifact_id, *args, **kw)

    monkeypatch.setattr(artifacts, "put_artifact", recording)
    return handles


@pytest.mark.parametrize("kind", ["long text and a big image", "long mostly-text bytes", "binary text and an image"])
async def test_every_stored_file_is_named_in_the_session_and_the_request(client: Client, kind: str,  # noqa: F811
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    image = DataPart(PNG + bytes(200), "image/png")

    @tool
    def report() -> ToolOutcome | bytes:
        """Return the report."""
        if kind == "long mostly-text bytes":
            return LONG_LATIN1
        text = "line\n" * 10_000 if kind == "long text and a big image" else "caf\udce9 ok"
        return ToolOutcome(text, parts=(image,))

    handles = stored_handles(monkeypatch)
    client.call_then_answer("report")
    store = MemoryStore()
    agent = Agent(client.model, store=store, tools=[report],
                  providers=[Artifacts(store, max_media_bytes=50), History(store)])
    session = await agent.session("s")
    await agent.run("Show me the report.", session=session)
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    sent = client.fake.requests[1]
    client.check(sent)
    assert handles and all(repr(h) in stored.result and repr(h) in json.dumps(sent) for h in handles)
    assert stored.parts == () and attachments(client.kind, sent) == []
    if kind == "long mostly-text bytes":  # stored once, exactly; the preview's offsets are the bytes'
        [handle] = handles
        assert await read_artifact(store, "default", "s", handle, length=10**6) == LONG_LATIN1
        assert f"({len(LONG_LATIN1):,} bytes)" in stored.result and "1,500 of its bytes are not UTF-8" in stored.result
    if kind != "long mostly-text bytes":
        assert f"image/png ({len(image.data)} bytes) is stored as artifact" in stored.result


async def test_a_lost_file_is_named_after_a_long_text(client: Client,  # noqa: F811
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("contextpipe.providers.artifacts.MAX_ARTIFACT_BYTES", 100_000)

    @tool
    def report() -> ToolOutcome:
        """Return the report."""
        return ToolOutcome("line\n" * 10_000, parts=(DataPart(PNG + bytes(200_000), "image/png"),))

    client.call_then_answer("report")
    store = MemoryStore()
    agent = Agent(client.model, store=store, tools=[report], providers=[Artifacts(store, tail=0, max_media_bytes=50)])
    session = await agent.session("s")
    await agent.run("Show me the report.", session=session)
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    assert stored.is_error and stored.parts == ()
    assert stored.result.endswith("bytes): over the 100,000 bytes an artifact may hold; nothing is stored and it is "
                                  "not attached]")


async def test_only_what_a_client_sends_is_counted_as_sent_and_kept_in_the_log() -> None:
    from contextpipe._media import media_tokens

    assert media_tokens(DataPart(bytes(1_000_000), "audio/ogg")) < 100  # its note: no client sends audio/ogg
    assert media_tokens(DataPart(bytes(16_000), "audio/mpeg")) == 10  # a second, which OpenAI's chat sends
    assert media_tokens(DataPart(b"BM" + bytes(60), "image/bmp")) < 100  # an image type no client sends

    @tool
    def recording() -> ToolOutcome:
        """Return the recording and its waveform."""
        return ToolOutcome("The call.", parts=(DataPart(bytes(300), "audio/ogg"),
                                               DataPart(b"BM" + bytes(60), "image/bmp")))

    store = MemoryStore()
    agent = Agent(ScriptedModel([tool_call("recording"), "done"]), store=store, tools=[recording],
                  providers=[Artifacts(store), History(store)])
    session = await agent.session("s")
    await agent.run("go", session=session)
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    assert stored.parts == () and stored.result.count("no model client takes") == 2


async def test_a_skill_pdf_over_the_media_limit_is_refused_for_that_limit(tmp_path: Path) -> None:
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%" + b"x" * 20_000 + b"\ntrailer << >>\n%%EOF\n"
    folder = tmp_path / "skills" / "theme"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: theme\ndescription: The theme.\n---\nShow theme.pdf.\n")
    (folder / "theme.pdf").write_bytes(pdf)
    model = ScriptedModel([tool_call("read_skill_resource", skill="theme", path="theme.pdf"), "done"])
    await Agent(model, providers=[Skills(tmp_path / "skills", max_media_bytes=10_000, max_resource_bytes=5_000)]).run(
        "go")
    [read] = [r for m in model.requests[1].messages for r in m.function_results]
    assert read.is_error and read.result == ("Error: 'theme.pdf' is application/pdf, 20.1 KB, over the 10.0 KB limit "
                                             "for skill files sent as attachments.")


@pytest.mark.parametrize("spill", [False, True])
async def test_what_each_client_sends_of_text_that_is_not_utf8(client: Client, spill: bool) -> None:  # noqa: F811
    @tool
    def menu() -> bytes:
        """Return the menu, as the old system wrote it."""
        return LATIN1

    client.call_then_answer("menu")
    store = MemoryStore()
    agent = Agent(client.model, store=store, tools=[menu],
                  providers=([Artifacts(store)] if spill else []) + [History(store)])
    session = await agent.session("s")
    await agent.run("What is on the menu?", session=session)
    sent = client.fake.requests[1]
    client.check(sent)
    body = json.dumps(sent, ensure_ascii=False)
    assert "Caf\N{REPLACEMENT CHARACTER} au lait, cr\N{REPLACEMENT CHARACTER}me" in body
    assert f"5 of the {len(LATIN1)} bytes of the tool's result are not UTF-8" in body
    assert attachments(client.kind, sent) == [] and base64.b64encode(LATIN1[:30]).decode() not in body
    [stored] = [r for m in await agent.history(session) for r in m.function_results]
    if spill:  # stored, and named where the model reads it
        handle = stored.result.split("is stored as artifact '", 1)[1].split("'", 1)[0]
        assert stored.parts == () and repr(handle) in body
        assert await read_artifact(store, "default", "s", handle, length=1000) == LATIN1
        assert "no model client takes text/plain; charset=unknown-8bit in a tool result" in body
    else:  # kept exactly in the session; each client names it as left out
        assert stored.parts == (DataPart(LATIN1, "text/plain; charset=unknown-8bit"),)
        assert f"[left out of this result: text/plain; charset=unknown-8bit ({len(LATIN1)} bytes);" in body


def test_a_crafted_jpeg_is_walked_in_few_steps_and_refused() -> None:
    from contextpipe import _media

    steps = 0
    real = _media._FILL.match

    class Counting:  # counts the walk's steps (one fill match each), not its time
        @staticmethod
        def match(data: bytes, index: int) -> object:
            nonlocal steps
            steps += 1
            return real(data, index)

    _media._FILL, saved = Counting, _media._FILL  # type: ignore[assignment]
    try:
        assert _media.sniff(b"\xff\xd8" + b"\xff" * 5_000_000 + b"\xe0\x00\x02" * 10) is None  # fill bytes
        assert steps <= 2  # one step over the whole run of fill bytes
        steps = 0
        assert _media.sniff(b"\xff\xd8" + b"\xff\xe0\x00\x02" * 1_000_000) is None  # a million empty segments
        assert steps == _media._JPEG_MAX_SEGMENTS
    finally:
        _media._FILL = saved
    assert _media.sniff(b"\xff\xd8\xff\xe0\x00\x01" + bytes(20)) is None  # a segment length below 2
