from __future__ import annotations

import pytest
from pydantic import BaseModel

from contextpipe import CodecError, Message, ProviderState, ScriptExhausted, Session, UsageError
from contextpipe.models import ModelRequest, TextDelta
from contextpipe.models.base import ResponseComplete
from contextpipe.testing import ScriptedModel, Turn, tool_call


@pytest.mark.parametrize("bad", ["", " lead", "a" * 201, "semi;colon", "new\nline", "../etc"])
def test_invalid_session_ids_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="invalid session id"):
        Session(bad)


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 65, "sp ace"])
def test_invalid_tenants_are_refused(bad: str) -> None:
    with pytest.raises(UsageError, match="invalid tenant"):
        Session("ok", tenant=bad)


def test_session_json_round_trip_and_corrupt_input() -> None:
    s = Session("alice/chat-1", tenant="acme", state={"k": {"v": [1, 2]}}, version=3, ttl=60.0)
    assert Session.from_json(s.to_json()) == s
    with pytest.raises(CodecError):
        Session.from_json("{nope")
    with pytest.raises(CodecError):
        Session.from_dict({"tenant": "x"})


class Counter(BaseModel):
    n: int = 0


def test_provider_state_default_initialiser_and_validation() -> None:
    state = ProviderState("counter", Counter, default=lambda session: Counter(n=10))
    session = Session("s")
    assert state.get(session).n == 10
    state.get(session).n += 1
    assert Session.from_dict(session.to_dict()).state == {"counter": {"n": 11}}
    assert state.get(None).n == 10  # no session: a fresh value, not stored
    broken = Session("t", state={"counter": {"n": "many"}})
    with pytest.raises(CodecError, match="state under key 'counter' does not match Counter"):
        state.get(broken)


async def test_scripted_model_records_requests_and_runs_out_loudly() -> None:
    model = ScriptedModel(["one", tool_call("f", {"a": 1}) + tool_call("g", "{bad json")])
    req = ModelRequest([Message.user("x")])
    assert (await model.complete(req)).text == "one"
    second = await model.complete(req)
    assert [(c.call_id, c.name, c.arguments) for c in second.messages[0].function_calls] == [
        ("call_1", "f", '{"a": 1}'), ("call_2", "g", "{bad json")]
    assert model.requests == [req, req]
    with pytest.raises(ScriptExhausted, match="received call 3 but its script is empty"):
        await model.complete(req)


async def test_scripted_model_streams_chunks_then_the_response() -> None:
    model = ScriptedModel([Turn(chunks=("Hel", "lo")), "two words"])
    events = [e async for e in model.stream(ModelRequest([]))]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Hel", "lo"]
    assert isinstance(events[-1], ResponseComplete) and events[-1].response.text == "Hello"
    events = [e async for e in model.stream(ModelRequest([]))]
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["two ", "words"]


async def test_scripted_model_assert_done_names_the_unused_steps() -> None:
    model = ScriptedModel(["one", "two", tool_call("lookup", key="k1")], name="weather")
    await model.complete(ModelRequest([Message.user("x")]))
    with pytest.raises(AssertionError, match=r"ScriptedModel 'weather' received 1 calls but 2 scripted steps were "
                                             r"never used: 'two', Turn\(text='', calls=\(FunctionCall\(") as failed:
        model.assert_done()
    assert "lookup" in str(failed.value)
    await model.complete(ModelRequest([Message.user("y")]))
    await model.complete(ModelRequest([Message.user("z")]))
    model.assert_done()  # used up: passes
    model.enqueue("late")
    with pytest.raises(AssertionError, match="1 scripted steps were never used: 'late'"):
        model.assert_done()
