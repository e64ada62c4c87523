"""The message and part types: ids, copies with a source, and the helpers that read parts."""

from __future__ import annotations

from contextpipe import Message
from contextpipe.messages import FunctionCall, FunctionResult, Source, TextPart, as_messages


def test_message_ids_are_assigned_at_creation_and_unique() -> None:
    a, b = Message.user("x"), Message.user("x")
    assert a.id and b.id and a.id != b.id


def test_with_source_returns_a_copy_and_leaves_the_original() -> None:
    original = Message.user("hello")
    tagged = original.with_source(Source("context", "memory"))
    assert original.source is None
    assert tagged.source == Source("context", "memory")
    assert tagged.id == original.id and tagged.parts == original.parts
    assert tagged is not original


def test_text_and_function_helpers() -> None:
    m = Message("assistant", (TextPart("a"), FunctionCall("c1", "f", "{}"), TextPart("b")))
    assert m.text == "ab"
    assert [c.call_id for c in m.function_calls] == ["c1"]
    assert Message("tool", (FunctionResult("c1", "r"),)).function_results[0].result == "r"


def test_tool_flag_says_which_function_parts_a_message_has() -> None:
    call, result = FunctionCall("c1", "f", "{}"), FunctionResult("c1", "r")
    flags = [Message("assistant", parts).tool_flag
             for parts in [(), (TextPart("a"),), (call,), (result,), (TextPart("a"), call, result)]]
    assert flags == [0, 0, 1, 2, 3]


def test_as_messages_takes_text_a_message_or_a_list() -> None:
    m = Message.user("hi")
    assert as_messages(m) == [m] and as_messages([m, m]) == [m, m]
    [only] = as_messages("hello")
    assert (only.role, only.text) == ("user", "hello")
