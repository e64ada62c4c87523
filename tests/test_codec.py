"""The JSON codec: lossless round trips, versions, parts of unknown kinds, and what it refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from contextpipe import CodecError, Message
from contextpipe.codec import CODEC_VERSION, dumps, loads, message_from_dict, message_to_dict
from contextpipe.messages import DataPart, FunctionResult, UnknownPart, UriPart
from message_strategies import BAD_FULL_FORM, WIDE_FLOATS, WIDE_INTS, anatomy, messages, wide_values_messages


@given(messages)
def test_codec_round_trip_is_lossless(message: Message) -> None:
    decoded = loads(dumps(message))
    assert decoded == message
    # Encoding the decoded message again gives the same JSON: nothing drifts over repeated saves.
    assert dumps(decoded) == dumps(message)


@given(messages)
def test_dict_codec_round_trip(message: Message) -> None:
    assert message_from_dict(json.loads(json.dumps(message_to_dict(message)))) == message


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


def test_integers_beyond_64_bits_come_back_as_the_same_integers() -> None:
    # orjson reads an integer outside [-2**63, 2**64) as the nearest float, which equals the integer
    # when the float holds it exactly (2**64): compared by type and value, not by `==` alone.
    for message in wide_values_messages():
        decoded = loads(dumps(message))
        assert dumps(decoded) == dumps(message)
        assert anatomy(decoded) == anatomy(message_from_dict(json.loads(dumps(message))))  # the standard library's
    metadata = loads(dumps(wide_values_messages()[0])).metadata
    assert type(metadata["k"]) is int and metadata["k"] == -14136784903946279993
    assert [type(v) for v in metadata["ints"]] == [int] * len(WIDE_INTS)
    assert [type(v) for v in metadata["floats"]] == [float] * len(WIDE_FLOATS)


BAD_INPUT = [
    ("[1, 2]", "must be a JSON object, got list"),  # a store's compact form: `contextpipe.stores._fastdecode`
    ('"text"', "must be a JSON object, got str"),
    *BAD_FULL_FORM,
]


@pytest.mark.parametrize(("payload", "fragment"), BAD_INPUT)
def test_bad_input_raises_codec_error(payload: str, fragment: str) -> None:
    with pytest.raises(CodecError, match=fragment):
        loads(payload)


def deeply_nested(depth: int) -> list[tuple[str, str]]:
    """Stored bodies nesting `depth` levels deep, each a different way: (what, body)."""
    arrays, objects = "[" * depth + "]" * depth, '{"k":' * depth + "1" + "}" * depth
    levels = depth // 2
    result = ('{"kind":"function_result","call_id":"c","result":"r","parts":[' * levels
              + '{"kind":"uri","media_type":"text/plain","uri":"u"}' + "]}" * levels)
    head = '"v":1,"role":"user","id":"a","created_at":1.0'
    return [
        ("metadata arrays", f'{{{head},"parts":[{{"kind":"text","text":"x"}}],"metadata":{{"k":{arrays}}}}}'),
        ("metadata objects", f'{{{head},"parts":[{{"kind":"text","text":"x"}}],"metadata":{objects}}}'),
        ("a newer kind's payload", f'{{{head},"parts":[{{"kind":"later","payload":{arrays}}}]}}'),
        ("function result parts", f'{{{head},"parts":[{result}]}}'),
        ("compact metadata", f'[8,"a",1.0,null,{{"k":{arrays}}},"x"]'),
        ("compact parts", f'[0,"a",1.0,null,"x",{result}]'),
    ]


def as_array(body: str | bytes) -> str | bytes:
    return b"[" + body + b"]" if isinstance(body, bytes) else f"[{body}]"


@pytest.mark.parametrize("depth", [1100, 100_000])
def test_a_body_nested_too_deeply_is_a_codec_error_in_every_decoder(depth: int) -> None:
    # orjson refuses JSON past 1,024 levels, and the standard library's parser (and a recursive
    # decoder) then meets Python's recursion limit: a CodecError, never a RecursionError.
    from contextpipe.stores._fastdecode import loads_arrays, loads_many, loads_stored

    for what, body in deeply_nested(depth):
        decoders = [loads_stored, lambda b: loads_many([b]), lambda b: loads_arrays([as_array(b)])]
        if not body.startswith("["):
            decoders.append(loads)
        for decode in decoders:
            with pytest.raises(CodecError, match="nested too deeply"):
                decode(body)
            with pytest.raises(CodecError, match="nested too deeply"):
                decode(body.encode())
        assert what


def test_metadata_nested_as_deep_as_orjson_reads_decodes() -> None:
    # Up to orjson's 1,024 levels, values decode (the check for wide floats walks them without recursion).
    deep = "[" * 1015 + "1.5" + "]" * 1015  # (a float the walk must look at, at the bottom)
    body = ('{"v":1,"role":"user","id":"a","created_at":1.0,"parts":[{"kind":"text","text":"x"}],'
            f'"metadata":{{"k":{deep}}}}}')
    from contextpipe.stores._fastdecode import loads_many

    assert loads_many([body])[0].id == "a"
