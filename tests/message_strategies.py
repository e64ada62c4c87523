"""Hypothesis strategies for messages: every part kind, source and optional field, and odd text."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from hypothesis import strategies as st

from contextpipe.messages import (
    DataPart,
    FunctionCall,
    FunctionResult,
    Message,
    ReasoningPart,
    Source,
    TextPart,
    UnknownPart,
    UriPart,
)

WIDE_INTS = [2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, 7**300, -(2**63), -(2**63) - 1, -14136784903946279993]
"""Integers at and past the edges of 64 bits (orjson reads those outside ``[-2**63, 2**64)`` as floats)."""
wide_ints = st.sampled_from(WIDE_INTS) | st.integers(min_value=2**64) | st.integers(max_value=-(2**63) - 1)
"""Integers beyond what a double holds exactly, drawn on purpose: an ``int`` strategy rarely goes that far."""
WIDE_FLOATS = [2.0**63, 2.0**64, -(2.0**63), 1e20, -1.5e300]
"""Floats as large as the nearest float to such an integer: they must stay floats."""
json_scalars = (st.none() | st.booleans() | st.integers(-(2**53), 2**53) | wide_ints
                | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(WIDE_FLOATS)
                | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
texts = st.text(max_size=50)
"""Any text without surrogates (Hypothesis leaves them out): empty, non-ASCII, control characters."""
roles = st.sampled_from(["system", "user", "assistant", "tool"])
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
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
    st.builds(ReasoningPart, texts, st.none() | texts, st.none() | texts, st.none() | texts),
    unknown_parts,
)
sources = st.none() | st.builds(
    Source, st.sampled_from(["input", "history", "context", "model", "tool"]), st.none() | texts
)
messages = st.builds(
    Message,
    role=roles,
    parts=st.lists(parts, max_size=5).map(tuple),
    id=st.text(min_size=1, max_size=40),
    author_name=st.none() | texts,
    created_at=times,
    metadata=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
    source=sources,
)
"""Any message: no parts or several of every kind, with or without each optional field."""
plain_texts = st.builds(Message, role=roles, parts=st.builds(TextPart, texts).map(lambda p: (p,)), created_at=times)
calls = st.builds(Message, role=st.sampled_from(["assistant", "tool"]),
                  parts=st.one_of(st.builds(FunctionCall, texts, texts, texts),
                                  st.builds(FunctionResult, texts, texts, st.booleans())).map(lambda p: (p,)),
                  created_at=times)
common = st.builds(Message, role=roles,
                   parts=st.one_of(st.builds(TextPart, texts), st.builds(FunctionCall, texts, texts, texts),
                                   st.builds(FunctionResult, texts, texts, st.booleans())).map(lambda p: (p,)),
                   created_at=times, source=sources)
"""The shapes most of a log is made of (one part, no author or metadata), with and without a source."""


def wide_values_messages() -> list[Message]:
    """Messages holding integers past 64 bits (and floats as large), one for each place a message holds free JSON.

    The metadata, a part of a newer kind, and one inside a function result: each on its own, so that
    a decoder that overlooks one place is not saved by another of the same message.
    """
    metadata = {"k": -14136784903946279993, "ints": WIDE_INTS, "floats": WIDE_FLOATS, "deep": [{"n": 2**64}]}
    newer = UnknownPart("hologram", {"frames": [2**64, -(2**63) - 1], "fps": 10**30})
    result = FunctionResult("c1", "ok", parts=(UnknownPart("tensor", {"shape": [2**70]}),))
    return [Message.user("x", metadata=metadata, created_at=1.5), Message("assistant", (newer,), created_at=2.5),
            Message("tool", (result,), created_at=3.5)]


def anatomy(value: Any) -> Any:
    """Every field of `value`, nested, with the type of each: equal anatomies are indistinguishable objects.

    A message's lazily computed tool flag is compared through `Message.tool_flag`; reading a slot
    that a decoder left unset raises `AttributeError`.
    """
    if isinstance(value, Message):
        return ("Message", *[(f.name, anatomy(getattr(value, f.name))) for f in fields(value)
                             if f.name != "_tool_flag"], ("tool_flag", value.tool_flag))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, *[(f.name, anatomy(getattr(value, f.name))) for f in fields(value)])
    if isinstance(value, tuple | list):
        return (type(value).__name__, *[anatomy(v) for v in value])
    if isinstance(value, dict) or type(value).__name__ == "mappingproxy":
        return (type(value).__name__, *[(k, anatomy(v)) for k, v in value.items()])
    return (type(value).__name__, value)

BAD_FULL_FORM = [
    ("not json", "not valid JSON"),
    ('{"id": "m", "role": "robot", "parts": [], "created_at": 1}', "unknown message role"),
    ('{"id": "m", "role": "user", "parts": [], "created_at": "yesterday"}', "created_at must be a number"),
    ('{"id": "m", "role": "user", "created_at": 1}', "not a valid encoded message"),
    ('{"id": "m", "role": "user", "parts": [{"kind": "text", "text": 3}], "created_at": 1}', "must be a string"),
    ('{"v": 0, "id": "m", "role": "user", "parts": [], "created_at": 1}', "unsupported message codec version"),
    ('{"id": "m", "role": "tool", "parts": [{"kind": "function_result", "call_id": "c", "result": "r", '
     '"parts": [{"kind": "text", "text": "x"}]}], "created_at": 1}', "only carry data and uri parts"),
    ('{"id": "m", "role": "tool", "parts": [{"kind": "function_result", "call_id": "c", "result": "r", '
     '"parts": {"kind": "data"}}], "created_at": 1}', "parts must be a list"),
]
"""Texts that are not an encoded message in the full (JSON object) form, each with what the error says."""
