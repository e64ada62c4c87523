"""Big tool results spill to artifacts (`contextpipe.providers.Artifacts`), through `Agent.run` on the memory and
SQLite stores: what the model and the log get, reading back by range, errors, and the write before the save."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import Agent, LeaseLost, UsageError, tool
from contextpipe.artifacts import artifact_info, read_artifact
from contextpipe.messages import FunctionResult
from contextpipe.models import ModelRequest
from contextpipe.providers import Artifacts
from contextpipe.providers.artifacts import _utf8_window
from contextpipe.stores import MemoryStore, SessionStore, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call

BIG = "".join(f"line {i:06d}: Zürich → 北京 ✓\n" for i in range(60_000))  # 2 MB of text, multi-byte characters
DATA = BIG.encode()


@tool
def dump() -> str:
    """Return the whole log."""
    return BIG


@tool
def small() -> str:
    """Return a short answer."""
    return "short and sweet"


def results(request: ModelRequest) -> list[FunctionResult]:
    return [r for m in request.messages for r in m.function_results]


def handle_of(request: ModelRequest) -> str:
    found = re.search(r"stored as artifact '([^']+)'", results(request)[-1].result)
    assert found is not None, results(request)[-1].result[:300]
    return found.group(1)


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> SessionStore:
    return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "spill.db")


async def test_a_big_result_is_stored_whole_and_the_model_reads_a_range(store: SessionStore) -> None:
    offset = DATA.index(b"line 031000")
    model = ScriptedModel([
        tool_call("dump"),
        lambda request: tool_call("read_artifact", handle=handle_of(request), offset=offset, length=200),
        "done"])
    agent = Agent(model, store=store, tools=[dump], providers=[Artifacts(store)])
    session = await agent.session("s")
    await agent.run("show me the log", session=session)
    seen = results(model.requests[1])[0].result
    assert len(seen) < 5_000 and BIG[:2_000] in seen and BIG[-2_000:] in seen and f"{len(DATA):,} bytes" in seen
    head_end, tail_at = len(BIG[:2_000].encode()), len(DATA) - len(BIG[-2_000:].encode())  # where the middle is
    assert f"(bytes 0 to {head_end:,})" in seen and f"(bytes {tail_at:,} to {len(DATA):,})" in seen
    assert f"not shown: bytes {head_end:,} to {tail_at:,}" in seen
    handle = handle_of(model.requests[1])
    assert await read_artifact(store, "default", "s", handle, length=len(DATA) + 1) == DATA
    stored = [r.result for m in await agent.history(session) for r in m.function_results]
    assert stored[0] == seen  # the log keeps what the model saw, not the 2 MB
    read = results(model.requests[2])[1]
    assert not read.is_error
    assert read.result == (f"[artifact {handle!r}, bytes {offset:,} to {offset + 200:,} of {len(DATA):,}; "
                           f"{len(DATA) - offset - 200:,} more after it]\n" + DATA[offset:offset + 200].decode())
    assert "read_artifact" in [t.name for t in model.requests[0].tools]


async def test_a_small_result_passes_whole_and_the_reader_is_offered_anyway(store: SessionStore) -> None:
    model = ScriptedModel([tool_call("small"), "ok"])
    agent = Agent(model, store=store, tools=[small], providers=[Artifacts(store)])
    await agent.run("hi", session=await agent.session("s"))
    assert results(model.requests[1])[0].result == "short and sweet"
    assert [t.name for t in model.requests[1].tools] == ["small", "read_artifact"]  # the same tools every call


async def test_bad_handles_and_ranges_are_errors_the_model_can_act_on(store: SessionStore) -> None:
    model = ScriptedModel([
        tool_call("dump"),
        lambda r: tool_call("read_artifact", handle="nope", offset=0, length=10),
        lambda r: tool_call("read_artifact", handle=handle_of(model.requests[1]), offset=len(DATA), length=10),
        lambda r: tool_call("read_artifact", handle=handle_of(model.requests[1]), offset=0, length=10**9),
        "done"])
    agent = Agent(model, store=store, tools=[dump], providers=[Artifacts(store, max_read=1_000)])
    await agent.run("go", session=await agent.session("s"))
    unknown, past, clamped = (results(model.requests[i])[-1] for i in (2, 3, 4))
    assert unknown.is_error and "no artifact 'nope'" in unknown.result
    assert past.is_error and f"has {len(DATA):,} bytes; give an offset from 0 to {len(DATA) - 1:,}" in past.result
    assert not clamped.is_error and "bytes 0 to 1,000 of" in clamped.result
    assert clamped.result.endswith(DATA[:1_000].decode(errors="ignore"))


async def test_the_artifact_is_saved_before_the_result_that_names_it(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    store = SQLiteStore(path)
    model = ScriptedModel([tool_call("dump"), RuntimeError("the model's server went away")])
    agent = Agent(model, store=store, tools=[dump], providers=[Artifacts(store)])
    with pytest.raises(RuntimeError):
        await agent.run("go", session=await agent.session("s"))
    await store.close()
    reopened = SQLiteStore(path)  # what a new process finds
    log = await reopened.load("default", "s")
    spilled = [r.result for m in log.messages for r in m.function_results]
    assert len(spilled) == 1
    handle = re.search(r"stored as artifact '([^']+)'", spilled[0])
    assert handle is not None
    assert (await artifact_info(reopened, "default", "s", handle.group(1))) is not None
    assert await read_artifact(reopened, "default", "s", handle.group(1), length=len(DATA)) == DATA
    await reopened.close()


async def test_a_run_whose_session_was_erased_meanwhile_spills_nothing(store: SessionStore) -> None:
    @tool
    async def forgotten() -> str:
        """Return an export after the user was forgotten."""
        assert await store.erase_session("default", "s") is not None  # forget_user, while the tool ran
        return BIG

    agent = Agent(ScriptedModel([tool_call("forgotten"), "done"]), store=store, tools=[forgotten],
                  providers=[Artifacts(store)])
    with pytest.raises(LeaseLost):
        await agent.run("go", session=await agent.session("s"))
    assert await store.get_session("default", "s") is None  # not brought back, holding the export
    assert await store.erase_session("default", "s") is None


async def test_forget_user_erases_the_artifacts_kept_in_another_store(store: SessionStore) -> None:
    from contextpipe.session import set_user_id

    sessions = MemoryStore()  # the agent's sessions here, its artifacts in `store`
    model = ScriptedModel([tool_call("dump"), "ok"])
    agent = Agent(model, store=sessions, tools=[dump], providers=[Artifacts(store)])
    session = await agent.session("chat")
    set_user_id(session, "alice")
    await agent.run("go", session=session)
    handle = handle_of(model.requests[1])
    report = await agent.forget_user("default", "alice")
    assert report.artifacts == 1
    assert await artifact_info(store, "default", "chat", handle) is None


async def test_a_fork_copies_the_artifacts_kept_in_another_store(store: SessionStore) -> None:
    sessions = MemoryStore()  # the agent's sessions here, its artifacts in `store`
    model = ScriptedModel([tool_call("dump"), "ok"])
    agent = Agent(model, store=sessions, tools=[dump], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("orig"))
    handle = handle_of(model.requests[1])
    await agent.fork("orig", at=len((await sessions.load("default", "orig")).messages), new_id="branch")
    assert await read_artifact(store, "default", "branch", handle, length=30) == DATA[:30]
    erased = await store.erase_session("default", "branch")
    assert erased is not None and erased.artifacts == 1  # its own copy: the original keeps its artifact
    assert await artifact_info(store, "default", "orig", handle) is not None


async def test_a_result_that_is_not_utf8_text_is_stored_whole_as_binary(store: SessionStore) -> None:
    raw = b"\x7fELF\x02\x01" + bytes(range(256))  # small, but no model can read it as text (nor as an image)

    @tool
    def snapshot() -> str:
        """Return the screen, as the bytes a file held."""
        return raw.decode("utf-8", "surrogateescape")  # how Python keeps undecodable bytes in a str

    model = ScriptedModel([
        tool_call("snapshot"),
        lambda request: tool_call("read_artifact", handle=handle_of(request), offset=0, length=10),
        "done"])
    agent = Agent(model, store=store, tools=[snapshot], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    seen = results(model.requests[1])[0].result
    handle = handle_of(model.requests[1])
    assert seen.startswith(f"[This tool result is not UTF-8 text: {len(raw):,} bytes of application/octet-stream.")
    seen.encode("utf-8")  # what the model gets is text: no lone surrogates for its provider's JSON to choke on
    assert await artifact_info(store, "default", "s", handle) is not None
    assert await read_artifact(store, "default", "s", handle, length=1_000) == raw  # the bytes, exactly
    read = results(model.requests[2])[1]
    assert read.is_error and f"is binary (application/octet-stream, {len(raw):,} bytes), neither text" in read.result


def test_bad_limits_are_refused() -> None:
    with pytest.raises(UsageError, match="limit >= head \\+ tail"):
        Artifacts(MemoryStore(), limit=100, head=80, tail=80)
    with pytest.raises(UsageError, match="max_media_bytes=-1"):
        Artifacts(MemoryStore(), max_media_bytes=-1)


def char_edges(data: bytes) -> list[int]:
    """Where each character of UTF-8 `data` starts (a lone surrogate is one 3-byte character), and its end."""
    return [i for i in range(len(data)) if data[i] & 0xC0 != 0x80] + [len(data)]


@given(st.text(max_size=60), st.integers(0, 250), st.integers(1, 40))
def test_a_window_is_the_whole_characters_of_the_range(text: str, offset: int, length: int) -> None:
    data = text.encode("utf-8", "surrogatepass")
    if offset >= max(len(data), 1):
        return
    start, end, got = _utf8_window(data[offset:offset + length + 6], offset, length, len(data))
    edges = char_edges(data)
    first = min(e for e in edges if e >= offset)  # a range starting inside a character skips its rest
    last = max(e for e in edges if e <= min(offset + length, len(data)))  # one ending inside it ends before it
    if last <= first:  # too short for even one character: that character comes back whole
        last = min([e for e in edges if e > first], default=first)
    assert (start, end) == (first, last)
    assert got.encode("utf-8", "surrogatepass") == data[first:last]  # the whole window, not just a part of it


@pytest.mark.parametrize("call_id", ["call\x00one", "call\ud800two", "call'\"three", "call\nfour"])
async def test_a_call_id_no_artifact_id_may_hold_still_spills(store: SessionStore, call_id: str) -> None:
    model = ScriptedModel([
        tool_call("dump", call_id=call_id),
        lambda request: tool_call("read_artifact", handle=handle_of(request), offset=0, length=30),
        "done"])
    agent = Agent(model, store=store, tools=[dump], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    handle = handle_of(model.requests[1])
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", handle), handle  # a handle the model can repeat exactly
    assert await read_artifact(store, "default", "s", handle, length=len(DATA)) == DATA
    read = results(model.requests[2])[1]
    assert not read.is_error and read.result.endswith(DATA[:30].decode(errors="ignore"))


async def test_a_fork_whose_artifact_copy_fails_says_it_is_half_done(store: SessionStore,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from contextpipe import StoreError
    from contextpipe.stores import _artifacts_sql

    sessions = MemoryStore()  # the agent's sessions here, its artifacts in `store`
    agent = Agent(ScriptedModel([tool_call("dump"), "ok"]), store=sessions, tools=[dump], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("orig"))
    cause, copy = StoreError("sqlite store: disk full"), _artifacts_sql.copy_artifacts

    async def copy_fails(into: SessionStore, *args: Any) -> int:  # in the provider's store only
        if into is store:
            raise cause
        return await copy(into, *args)

    monkeypatch.setattr(_artifacts_sql, "copy_artifacts", copy_fails)
    with pytest.raises(StoreError, match="fork 'branch' of 'orig' is half done") as failed:
        await agent.fork("orig", at=2, new_id="branch")
    assert "erase_session('default', 'branch')" in str(failed.value) and "fork again" in str(failed.value)
    assert failed.value.__cause__ is cause and failed.value.session_id == "branch"
    assert await sessions.get_session("default", "branch") is not None  # the half the message speaks of


async def test_a_result_over_what_an_artifact_may_hold_is_shown_in_part_as_an_error(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextpipe.providers import artifacts

    monkeypatch.setattr(artifacts, "MAX_ARTIFACT_BYTES", len(DATA) - 1)  # the same check, without 512 MiB in a test
    model = ScriptedModel([tool_call("dump"), "done"])
    agent = Agent(model, store=store, tools=[dump], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    seen = results(model.requests[1])[0]
    assert seen.is_error and BIG[:2_000] in seen.result and BIG[-2_000:] in seen.result
    assert (f"({len(DATA):,} bytes), too long to show whole. It is over the {len(DATA) - 1:,} bytes an artifact may "
            "hold: only the head and tail are shown, nothing is stored.") in seen.result
    assert f"(bytes 0 to {len(BIG[:2_000].encode()):,})" in seen.result and "read_artifact(" not in seen.result
    assert (await store.erase_session("default", "s")).artifacts == 0  # type: ignore[union-attr]


def test_the_documented_maximum_is_the_one_the_provider_checks() -> None:
    from contextpipe import artifacts
    from contextpipe.providers.artifacts import _over

    assert artifacts.MAX_ARTIFACT_BYTES == 512 * 1024 * 1024
    assert _over() == "over the 536,870,912 bytes (512 MiB) an artifact may hold"


async def test_a_binary_result_over_what_an_artifact_may_hold_is_an_error(
        store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextpipe.providers import artifacts

    monkeypatch.setattr(artifacts, "MAX_ARTIFACT_BYTES", 100)

    @tool
    def snapshot() -> str:
        """Return the screen, as the bytes a file held."""
        return bytes(range(256)).decode("utf-8", "surrogateescape")

    model = ScriptedModel([tool_call("snapshot"), "done"])
    agent = Agent(model, store=store, tools=[snapshot], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    seen = results(model.requests[1])[0]
    assert seen.is_error and "256 bytes of application/octet-stream, over the 100 bytes an artifact may hold: " \
        "nothing is stored" in seen.result


async def test_a_short_result_with_a_byte_that_is_not_utf8_passes_as_text(store: SessionStore) -> None:
    @tool
    def menu() -> str:
        """Return the menu, as a Latin-1 file read as UTF-8."""
        return b"caf\xe9 au lait".decode("utf-8", "surrogateescape")

    model = ScriptedModel([tool_call("menu"), "done"])
    agent = Agent(model, store=store, tools=[menu], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    seen = results(model.requests[1])[0]
    assert not seen.is_error and seen.result == "caf\N{REPLACEMENT CHARACTER} au lait"  # nothing stored, no note
    assert (await store.erase_session("default", "s")).artifacts == 0  # type: ignore[union-attr]


async def test_a_long_result_that_is_mostly_text_is_stored_as_text_and_read_back(store: SessionStore) -> None:
    raw = DATA[:30_000] + b"\xe9\xff" + DATA[30_000:60_000]  # two bytes that are not UTF-8 among 60 KB of text

    @tool
    def export() -> str:
        """Return an export with a stray Latin-1 byte."""
        return raw.decode("utf-8", "surrogateescape")

    model = ScriptedModel([
        tool_call("export"),
        lambda request: tool_call("read_artifact", handle=handle_of(request), offset=29_990, length=20),
        "done"])
    agent = Agent(model, store=store, tools=[export], providers=[Artifacts(store)])
    await agent.run("go", session=await agent.session("s"))
    seen = results(model.requests[1])[0].result
    assert f"({len(raw):,} bytes)" in seen and "2 of its bytes are not UTF-8" in seen
    seen.encode("utf-8")  # text a model's provider can send
    handle = handle_of(model.requests[1])
    assert (await artifact_info(store, "default", "s", handle)).media_type == "text/plain; charset=utf-8"  # type: ignore[union-attr]
    assert await read_artifact(store, "default", "s", handle, length=len(raw)) == raw  # the bytes, exactly
    read = results(model.requests[2])[1]
    assert not read.is_error and read.result == (
        f"[artifact {handle!r}, bytes 29,990 to 30,010 of {len(raw):,}; {len(raw) - 30_010:,} more after it]\n"
        + raw[29_990:30_010].decode("utf-8", "replace"))
