"""The stores' fast decoders against their plain references, and the compact form.

Every accelerator of `contextpipe.stores._fastdecode` must equal the plain decoder beside it:
`loads_many` and `loads_arrays` (with their directly built shapes) equal `contextpipe.codec.loads`
on the full form and `decode_compact` on the compact one, field for field and type for type.
"""

from __future__ import annotations

import gc
import itertools
import json
import weakref
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import CodecError, Message
from contextpipe.codec import dumps, loads, message_to_dict
from contextpipe.messages import FunctionCall, FunctionResult, ReasoningPart, Source, TextPart
from contextpipe.stores._fastdecode import decode_compact, dumps_compact, loads_arrays, loads_many, loads_stored
from message_strategies import BAD_FULL_FORM, anatomy, calls, common, messages, plain_texts, wide_values_messages


def _plain_compact(text: str) -> Message:
    """The plain reference of the compact form: the JSON parsed, then `decode_compact` (the full form: `loads`)."""
    value = json.loads(text)
    return decode_compact(value) if type(value) is list else loads(text)


@given(st.lists(messages | common | plain_texts | calls, max_size=80), st.lists(st.integers(0, 80), max_size=3))
def test_the_fast_decoders_equal_the_plain_ones(log: list[Message], cuts: list[int]) -> None:
    # In both stored forms, the batch decoders (whose common shapes are built from shells) give
    # exactly what the plain decoders give, field for field and type for type, and that is the input.
    full, compact = [dumps(m) for m in log], [dumps_compact(m) for m in log]
    references = {"full": [loads(t) for t in full], "compact": [_plain_compact(t) for t in compact]}
    bounds = [0, *sorted(min(c, len(log)) for c in cuts), len(log)]
    for form, texts in (("full", full), ("compact", compact)):
        plain = references[form]
        assert plain == log, form  # the round trip through the plain decoder is lossless
        assert [dumps(m) for m in plain] == full, form
        arrays = loads_arrays(["[" + ",".join(texts[a:b]) + "]" for a, b in itertools.pairwise(bounds)])
        for fast in (loads_many(texts), [m for array in arrays for m in array]):
            assert [anatomy(m) for m in fast] == [anatomy(m) for m in plain], form


@given(st.lists(messages | plain_texts, max_size=120))
def test_loads_many_decodes_a_log_as_loads_does(log: list[Message]) -> None:
    texts = [dumps(m) for m in log]
    decoded = loads_many(texts)
    assert decoded == [loads(t) for t in texts] == log
    assert [type(m) for m in decoded] == [Message] * len(log)
    assert [m.tool_flag for m in decoded] == [m.tool_flag for m in log]
    assert [dumps(m) for m in decoded] == texts


@given(st.lists(messages | plain_texts | calls, max_size=60), st.lists(st.integers(0, 60), max_size=4))
def test_loads_arrays_decodes_as_loads_many(log: list[Message], cuts: list[int]) -> None:
    # The log cut anywhere into arrays (as a store reads it, a few thousand messages per value).
    texts = [dumps(m) for m in log]
    bounds = [0, *sorted(min(c, len(texts)) for c in cuts), len(texts)]
    chunks = [texts[a:b] for a, b in itertools.pairwise(bounds)]
    decoded = loads_arrays(["[" + ",".join(chunk) + "]" for chunk in chunks])
    assert [len(d) for d in decoded] == [len(c) for c in chunks]
    flat = [m for d in decoded for m in d]
    assert flat == loads_many(texts) == log
    assert [type(m) for m in flat] == [Message] * len(log)
    assert [type(p) for m in flat for p in m.parts] == [type(p) for m in log for p in m.parts]
    assert [m.tool_flag for m in flat] == [m.tool_flag for m in log]
    assert [dumps(m) for m in flat] == texts


@given(messages | common)
def test_compact_codec_round_trip_is_lossless(message: Message) -> None:
    text = dumps_compact(message)
    assert text.startswith("[")  # every message of these kinds fits the compact form
    decoded = loads_stored(text)
    assert decoded == message
    assert [type(p) for p in decoded.parts] == [type(p) for p in message.parts]
    assert decoded.tool_flag == message.tool_flag
    # Every field as it was (created_at a float, the same metadata, source, author): the full form is the same.
    assert dumps(decoded) == dumps(message)
    assert dumps_compact(decoded) == text


@given(st.lists(st.tuples(messages | common | plain_texts, st.booleans()), max_size=60),
       st.lists(st.integers(0, 60), max_size=3))
def test_a_log_mixing_both_forms_decodes_as_loads_does(log: list[tuple[Message, bool]], cuts: list[int]) -> None:
    # A store upgraded in place holds rows in the full form and, after them, rows in the compact one.
    texts = [dumps_compact(m) if compact else dumps(m) for m, compact in log]
    expected = [m for m, _ in log]
    bounds = [0, *sorted(min(c, len(texts)) for c in cuts), len(texts)]
    arrays = loads_arrays(["[" + ",".join(texts[a:b]) + "]" for a, b in itertools.pairwise(bounds)])
    flat = [m for part in arrays for m in part]
    assert flat == loads_many(texts) == [loads_stored(t) for t in texts] == expected
    assert [type(m) for m in flat] == [Message] * len(expected)
    assert [[type(p) for p in m.parts] for m in flat] == [[type(p) for p in m.parts] for m in expected]
    assert [m.tool_flag for m in flat] == [m.tool_flag for m in expected]
    assert [dumps(m) for m in flat] == [dumps(m) for m in expected]


def test_the_compact_form_holds_every_field() -> None:
    m = Message("assistant", (TextPart("Checking."), FunctionCall("c1", "get_order", '{"id": 7}'),
                              ReasoningPart("", "enc", "openai.reasoning", "rs_1")),
                id="msg_1", author_name="Ann", created_at=1_700_000_000, metadata={"run": "r1", "n": [1, 2]},
                source=Source("model", "gpt"))
    text = dumps_compact(m)
    head = 2 + 32 + 64 + 16  # assistant, author, metadata, source "model"
    assert json.loads(text)[:6] == [head, "msg_1", 1_700_000_000.0, "gpt", "Ann", {"run": "r1", "n": [1, 2]}]
    decoded = loads_stored(text)
    assert decoded == m and type(decoded.created_at) is float and decoded.parts[2] == m.parts[2]
    error = Message("tool", (FunctionResult("c1", "boom", is_error=True),), id="msg_2", created_at=2.0)
    assert json.loads(dumps_compact(error))[4] == message_to_dict(error)["parts"][0]  # full part form inside
    assert loads_stored(dumps_compact(error)) == error
    odd = Message("user", (TextPart("x"),), id=7, created_at=1.0)  # type: ignore[arg-type]
    assert dumps_compact(odd) == dumps(odd)  # what the compact form cannot hold is written in the full form
    late = Message.user("x", created_at=2**60)
    assert dumps_compact(late) == dumps(late)
    # A time no float holds, or not a number, is refused when written: no decoder could read it back.
    for when in (10**400, "now", True):
        with pytest.raises(CodecError, match="created_at must be seconds since the epoch"):
            dumps_compact(Message.user("x", created_at=when))  # type: ignore[arg-type]
    # Values only the standard library reads exactly (NaN, integers beyond 64 bits) come back too.
    unusual = Message.user("x", metadata={"score": float("nan"), "big": 2**70})
    [decoded_log] = loads_arrays(["[" + dumps_compact(Message.user("a")) + "," + dumps_compact(unusual) + "]"])
    big = decoded_log[1].metadata["big"]
    assert type(big) is int and big == 2**70 and decoded_log[1].id == unusual.id


_PLAIN_PARTS = ["hi", ["c", "n", "{}"], ["c", "ok"]]
_COMPACT_CHANGES: list[tuple[int, object]] = [
    (0, 0), (0, 3), (0, 4), (0, 23), (0, 24), (0, 28), (0, 32), (0, 64), (0, 128), (0, -1), (0, True), (0, 1.0),
    (0, "1"), (1, 7), (1, None), (2, 2), (2, "now"), (2, None), (2, True), (3, "src"), (3, 5), (3, ["s"]),
    (4, ["c", 1]), (4, ["c"]), (4, []), (4, ["c", "n", "a", "x"]), (4, 5), (4, None),
    (4, {"kind": "text", "text": "x"}),
    (4, {"kind": "function_result", "call_id": "c", "result": "r", "is_error": True}), (4, {"text": "x"}),
    (5, "extra"),
]
NEAR_COMPACT = [
    [*base[:at], value, *base[at + 1:]] if at < len(base) else [*base, value]
    for part in _PLAIN_PARTS for head in (2, 14)  # without and with a source ("model")
    for base in [[head, "m1", 1.5, None if head < 4 else "gpt", part]]
    for at, value in [(0, head), *_COMPACT_CHANGES]
]


def test_loads_arrays_checks_compact_rows_as_loads_does() -> None:
    # Each compact shape next to the ones built directly decodes as `loads` decodes it, or both refuse it.
    for d in NEAR_COMPACT:
        _same_decoding([json.dumps(d)])


@given(st.lists(st.sampled_from(NEAR_COMPACT), min_size=1, max_size=8))
def test_loads_arrays_checks_mixed_compact_arrays(log: list[list[object]]) -> None:
    _same_decoding([json.dumps(d) for d in log])


_TEXT = {"kind": "text", "text": "hi"}
_CALL = {"kind": "function_call", "call_id": "c", "name": "n", "arguments": "{}"}
_RESULT = {"kind": "function_result", "call_id": "c", "result": "ok"}
_MISSING = object()
# Each change makes a common shape into one next to it (or leaves it as it is: _MISSING on an absent key).
_CHANGES: list[tuple[str, object]] = [
    ("v", 2), ("v", 0), ("v", True), ("v", 1.0), ("v", "1"), ("v", _MISSING), ("id", 7), ("id", None),
    ("id", _MISSING), ("role", "robot"), ("role", ["user"]), ("role", 3), ("role", _MISSING),
    ("created_at", 2), ("created_at", "now"), ("created_at", None), ("created_at", True), ("created_at", _MISSING),
    ("parts", []), ("parts", "text"), ("parts", [["text"]]), ("parts", [_TEXT, _TEXT]), ("parts", [_CALL, _RESULT]),
    ("parts", [{"kind": "future", "x": 1}]), ("parts", [{"kind": "text"}]), ("parts", [{"kind": "text", "text": 3}]),
    ("parts", [{**_TEXT, "extra": 1}]), ("parts", [{**_CALL, "name": 5}]), ("parts", [{**_CALL, "extra": 1}]),
    ("parts", [{k: v for k, v in _CALL.items() if k != "arguments"}]), ("parts", [{**_RESULT, "is_error": True}]),
    ("parts", [{**_RESULT, "result": None}]), ("parts", [{**_RESULT, "call_id": 1}]),
    ("parts", [{**_RESULT, "parts": [{"kind": "uri", "uri": "u", "media_type": "image/png"}]}]),
    ("metadata", {"k": 1}), ("source", {"kind": "history", "source_id": None}), ("author_name", "Ann"),
    ("author_name", None), ("extra", 1),
]
NEAR_PLAIN = [{k: v for k, v in {"v": 1, "id": "m1", "role": "assistant", "parts": [part], "created_at": 1.5,
                                  key: value}.items() if v is not _MISSING}
              for part in (_TEXT, _CALL, _RESULT) for key, value in [("v", 1), *_CHANGES]]


def _decoded(decode: Callable[[], list[Message]]) -> list[Message] | str:
    try:
        return decode()
    except CodecError:
        return "refused"


def _same_decoding(texts: list[str]) -> None:
    expected = _decoded(lambda: [loads_stored(t) for t in texts])
    got = _decoded(lambda: loads_arrays(["[" + ",".join(texts) + "]"])[0])
    assert got == expected, texts
    if isinstance(got, list) and isinstance(expected, list):
        assert [[type(p) for p in m.parts] for m in got] == [[type(p) for p in m.parts] for m in expected]
        assert [m.tool_flag for m in got] == [m.tool_flag for m in expected]
        assert [dumps(m) for m in got] == [dumps(m) for m in expected], texts


def test_loads_arrays_checks_what_loads_checks() -> None:
    # Every shape next to the ones built directly decodes exactly as `loads` does, or both refuse it.
    for d in NEAR_PLAIN:
        _same_decoding([json.dumps(d)])


@given(st.lists(st.sampled_from(NEAR_PLAIN), min_size=1, max_size=8))
def test_loads_arrays_checks_mixed_arrays(log: list[dict[str, object]]) -> None:
    _same_decoding([json.dumps(d) for d in log])


@pytest.mark.parametrize(("payload", "fragment"), [
    ('{"v": 1}', "must be a JSON array"),
    ("[1, 2", "not valid JSON"),
    ("[1]", "must be a JSON object or array"),
    ("[[1]]", "at least 4 fields"),
    ('[{"v": 1, "id": "m", "role": "robot", "parts": [], "created_at": 1.0}]', "unknown message role"),
])
def test_loads_arrays_rejects_what_is_not_an_array_of_messages(payload: str, fragment: str) -> None:
    good = "[" + ",".join([dumps(Message.user("fine"))] * 150) + "]"
    with pytest.raises(CodecError, match=fragment):
        loads_arrays([good, payload])
    assert gc.isenabled()  # paused while decoding, enabled again after a failure too


def test_decoding_logs_leaves_an_applications_cyclic_garbage_to_the_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    log = "[" + ",".join(dumps_compact(Message.user(f"m{i}")) for i in range(400)) + "]"

    class Node:
        def __init__(self) -> None:
            self.me = self

    gc.collect()
    probes = []
    for _ in range(300):  # an application making cyclic garbage between reads of a session
        garbage = Node()
        probes.append(weakref.ref(garbage))
        del garbage
        assert len(loads_arrays([log])[0]) == 400
        assert gc.isenabled()  # paused while decoding only
    # Found by the collector's own young collections (no gc.collect() here): none was moved to the
    # oldest generation behind its back, where only a full collection, which might never come, finds it.
    assert sum(probe() is not None for probe in probes) <= 2
    gc.freeze()  # as a pre-fork server does: its frozen set stays as it is
    try:
        frozen = gc.get_freeze_count()
        calls: list[str] = []
        with monkeypatch.context() as patched:
            patched.setattr(gc, "freeze", lambda: calls.append("freeze"))
            patched.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
            assert len(loads_arrays([log])[0]) == 400
        assert calls == [] and gc.isenabled()
        # Nothing joined the frozen set, nor was it thawed (it would be empty). Its count alone cannot
        # be compared exactly: the suite's other threads may free frozen objects meanwhile.
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_loads_arrays_reads_what_only_the_standard_library_parses() -> None:
    odd = Message.user("x", metadata={"score": float("nan"), "big": 2**70})
    decoded = loads_arrays(["[" + dumps(Message.user("a")) + "," + dumps(odd) + "]"])[0]
    assert decoded[0].text == "a" and type(decoded[1].metadata["big"]) is int and decoded[1].metadata["big"] == 2**70


@pytest.mark.parametrize("encode", [dumps, dumps_compact])
def test_integers_beyond_64_bits_come_back_from_every_decoder(encode: Callable[[Message], str]) -> None:
    # orjson reads them as floats; every decoder gives back the integers (a float equal to 2**64 is not enough).
    wide = [*wide_values_messages(), Message.user("x", metadata={"k": -14136784903946279993}, created_at=2.5)]
    expected = [dumps(m) for m in wide]
    common_log = [Message.user(f"m{i}", created_at=float(i)) for i in range(150)]  # past the GC pause, built directly
    texts = [encode(m) for m in common_log[:99] + wide + common_log[99:]]
    one_by_one = [loads_stored(t) for t in texts]
    many = loads_many(texts)
    for message, text in zip(wide, texts[99:], strict=False):  # each alone too: no other one to set off a fall-back
        for decoded_alone in (loads_stored(text), loads_many([text])[0], loads_arrays(["[" + text + "]"])[0][0]):
            assert dumps(decoded_alone) == dumps(message)
    [array] = loads_arrays(["[" + ",".join(texts) + "]"])
    for decoded in (one_by_one, many, array):
        assert [dumps(m) for m in decoded[99:99 + len(wide)]] == expected
        assert type(decoded[102].metadata["k"]) is int
        assert [anatomy(m) for m in decoded] == [anatomy(m) for m in one_by_one]
        assert decoded[:99] + decoded[99 + len(wide):] == common_log



def test_a_batch_with_a_float_as_large_stays_floats_and_builds_as_plain() -> None:
    # A genuine float past 2**63 makes a batch be parsed again by the standard library: it must stay a float.
    log = [Message.user(f"m{i}", created_at=float(i)) for i in range(150)]
    log[7] = Message.user("x", metadata={"size": 2.0**64, "n": 3}, created_at=7.0)
    texts = [dumps_compact(m) for m in log[:75]] + [dumps(m) for m in log[75:]]
    for decoded in (loads_many(texts), loads_arrays(["[" + ",".join(texts) + "]"])[0]):
        assert [anatomy(m) for m in decoded] == [anatomy(loads_stored(t)) for t in texts] and decoded == log
        assert type(decoded[7].metadata["size"]) is float

@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "at least 4 fields"),
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




@pytest.mark.parametrize(("payload", "fragment"), [("[1, 2]", "at least 4 fields"), *BAD_FULL_FORM])
def test_a_stored_text_that_is_not_a_message_raises_codec_error(payload: str, fragment: str) -> None:
    with pytest.raises(CodecError, match=fragment):
        loads_stored(payload)


def test_a_long_log_decodes_to_messages_that_share_nothing_mutable() -> None:
    # Past the batch size where the cache of sources starts afresh (4,096) and the GC pause (100 texts):
    # every message has parts and metadata of its own, even when its stored text repeats another's.
    source = Source("history", "h")
    one = Message("assistant", (TextPart("same"), FunctionCall("c", "f", "{}")), created_at=1.0, source=source,
                  metadata={"k": [1, 2]})
    texts = [dumps_compact(one)] * 5000
    for fast in (loads_many(texts), [m for array in loads_arrays(["[" + ",".join(texts) + "]"]) for m in array]):
        assert len(fast) == 5000 and all(m == one for m in fast)
        assert len({id(m.parts) for m in fast}) == len({id(m.metadata) for m in fast}) == 5000
        assert len({id(m.metadata["k"]) for m in fast}) == 5000
