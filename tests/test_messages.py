from __future__ import annotations

import gc
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import CodecError, Message
from contextpipe.messages import (
    CODEC_VERSION,
    DataPart,
    FunctionCall,
    FunctionResult,
    ReasoningPart,
    Source,
    TextPart,
    UnknownPart,
    UriPart,
    dumps,
    loads,
    loads_many,
    message_from_dict,
    message_to_dict,
)

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
texts = st.text(max_size=50)
media_parts = st.one_of(
    st.builds(DataPart, st.binary(max_size=40), st.sampled_from(["image/png", "audio/wav", "application/pdf"])),
    st.builds(UriPart, texts, texts),
)
unknown_parts = st.builds(
    UnknownPart,
    st.text(min_size=1, max_size=12).filter(
        lambda k: k not in {"text", "function_call", "function_result", "data", "uri", "reasoning"}
    ),
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "kind"), json_values, max_size=3),
)
parts = st.one_of(
    st.builds(TextPart, texts),
    st.builds(FunctionCall, texts, texts, texts),
    st.builds(FunctionResult, texts, texts, st.booleans(),
              st.lists(media_parts | unknown_parts, max_size=3).map(tuple)),  # a newer kind is kept too
    media_parts,
    st.builds(ReasoningPart, texts, st.none() | texts),
    unknown_parts,
)
sources = st.none() | st.builds(
    Source, st.sampled_from(["input", "history", "context", "model", "tool"]), st.none() | texts
)
messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    parts=st.lists(parts, max_size=5).map(tuple),
    id=st.text(min_size=1, max_size=40),
    author_name=st.none() | texts,
    created_at=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    metadata=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    source=sources,
)


@given(messages)
def test_codec_round_trip_is_lossless(message: Message) -> None:
    decoded = loads(dumps(message))
    assert decoded == message
    # Encoding the decoded message again gives the same JSON: nothing drifts over repeated saves.
    assert dumps(decoded) == dumps(message)


@given(messages)
def test_dict_codec_round_trip(message: Message) -> None:
    assert message_from_dict(json.loads(json.dumps(message_to_dict(message)))) == message


plain_texts = st.builds(Message, role=st.sampled_from(["system", "user", "assistant", "tool"]),
                        parts=st.builds(TextPart, texts).map(lambda p: (p,)),
                        created_at=st.floats(min_value=0, max_value=4e9, allow_nan=False))


@given(st.lists(messages | plain_texts, max_size=120))
def test_loads_many_decodes_a_log_as_loads_does(log: list[Message]) -> None:
    texts = [dumps(m) for m in log]
    decoded = loads_many(texts)
    assert decoded == [loads(t) for t in texts] == log
    assert [type(m) for m in decoded] == [Message] * len(log)
    assert [m.tool_flag for m in decoded] == [m.tool_flag for m in log]
    assert [dumps(m) for m in decoded] == texts


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"v": 1, "id": "m", "role": "robot", "parts": [{"kind": "text", "text": "x"}], "created_at": 1.0}',
         "unknown message role"),
        ('{"v": 1, "id": "m", "role": ["user"], "parts": [{"kind": "text", "text": "x"}], "created_at": 1.0}',
         "not a valid encoded message"),
        ('{"v": 1, "id": 7, "role": "user", "parts": [{"kind": "text", "text": "x"}], "created_at": 1.0}',
         "must be a string"),
        ('{"v": 1, "id": "m", "role": "user", "parts": [{"kind": "text", "text": 3}], "created_at": 1.0}',
         "must be a string"),
        ('{"v": 1, "id": "m", "role": "user", "parts": [{"kind": "text", "text": "x"}], "created_at": "now"}',
         "created_at must be a number"),
    ],
)
def test_loads_many_rejects_what_loads_rejects(payload: str, fragment: str) -> None:
    good = dumps(Message.user("fine"))
    with pytest.raises(CodecError, match=fragment):
        loads_many([good] * 150 + [payload])
    assert gc.isenabled()  # paused while decoding, enabled again after a failure too


def test_function_result_parts_are_stored_as_nested_parts() -> None:
    result = FunctionResult("c1", "A chart.", parts=(DataPart(b"\x89PNG", "image/png"),
                                                     UriPart("https://example.com/a.wav", "audio/wav")))
    encoded = message_to_dict(Message("tool", (result,)))["parts"][0]
    assert encoded == {"kind": "function_result", "call_id": "c1", "result": "A chart.",
                       "parts": [{"kind": "data", "media_type": "image/png", "data": "iVBORw=="},
                                 {"kind": "uri", "media_type": "audio/wav", "uri": "https://example.com/a.wav"}]}
    plain = message_to_dict(Message("tool", (FunctionResult("c2", "ok"),)))["parts"][0]
    assert "parts" not in plain  # results without media are written as before (older readers read them)


def test_unknown_part_from_newer_version_is_preserved() -> None:
    newer = {
        "v": CODEC_VERSION + 1,
        "id": "m1",
        "role": "assistant",
        "created_at": 1.5,
        "parts": [{"kind": "text", "text": "hi"}, {"kind": "hologram", "frames": [1, 2], "fps": 30}],
    }
    message = message_from_dict(newer)
    assert message.parts[1] == UnknownPart("hologram", {"frames": [1, 2], "fps": 30})
    assert message_to_dict(message)["parts"][1] == {"kind": "hologram", "frames": [1, 2], "fps": 30}


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


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"id": "m", "role": "robot", "parts": [], "created_at": 1}', "unknown message role"),
        ('{"id": "m", "role": "user", "parts": [], "created_at": "yesterday"}', "created_at must be a number"),
        ('{"id": "m", "role": "user", "created_at": 1}', "not a valid encoded message"),
        ('{"id": "m", "role": "user", "parts": [{"kind": "text", "text": 3}], "created_at": 1}', "must be a string"),
        ('{"v": 0, "id": "m", "role": "user", "parts": [], "created_at": 1}', "unsupported message codec version"),
        ('{"id": "m", "role": "tool", "parts": [{"kind": "function_result", "call_id": "c", "result": "r", '
         '"parts": [{"kind": "text", "text": "x"}]}], "created_at": 1}', "only carry data and uri parts"),
        ('{"id": "m", "role": "tool", "parts": [{"kind": "function_result", "call_id": "c", "result": "r", '
         '"parts": {"kind": "data"}}], "created_at": 1}', "parts must be a list"),
    ],
)
def test_bad_input_raises_codec_error(payload: str, fragment: str) -> None:
    with pytest.raises(CodecError, match=fragment):
        loads(payload)
