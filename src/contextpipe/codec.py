"""The JSON codec of messages: `message_to_dict` / `message_from_dict` and `dumps` / `loads`.

It is the one place where messages and their parts become JSON, and it is versioned and lossless:
every message carries the codec's version (key ``"v"``), a newer version's message is read as long
as its fields are known, and content parts of kinds this version does not know (written by a newer
contextpipe) are kept as `UnknownPart`, so reading and writing them back never drops data.

>>> from contextpipe.messages import DataPart, FunctionResult, Message
>>> m = Message.user("What should I wear in Suzhou today?")
>>> loads(dumps(m)) == m
True
>>> png = DataPart(b"(the bytes of a PNG file)", "image/png")
>>> r = FunctionResult("call_1", "A chart of the week's sales.", parts=(png,))
>>> loads(dumps(Message("tool", (r,)))).parts[0] == r
True

Stores keep their own, denser form of the same fields and decode logs in batches, faster
(`contextpipe.stores._fastdecode`); what they read equals what this codec reads.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from .errors import CodecError
from .messages import (
    EMPTY_METADATA,
    DataPart,
    FunctionCall,
    FunctionResult,
    ReasoningPart,
    Source,
    TextPart,
    UnknownPart,
    UriPart,
    _new_message,
    _new_text,
)

if TYPE_CHECKING:
    from .messages import Message, Part

try:
    import orjson

    _fast_loads = orjson.loads
    """Parses JSON several times faster than the standard library, but not always exactly (see `_decode`)."""
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library still works
    _fast_loads = json.loads  # type: ignore[assignment]

__all__ = ["CODEC_VERSION", "dumps", "loads", "message_from_dict", "message_to_dict"]

CODEC_VERSION: Final = 1
"""Version written into every encoded message (key ``"v"``)."""

_ROLES: Final = frozenset(("system", "user", "assistant", "tool"))
_SOURCE_KINDS: Final = frozenset(("input", "history", "context", "model", "tool"))


def _part_to_dict(part: Part) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"kind": "text", "text": part.text}
    if isinstance(part, FunctionCall):
        return {"kind": "function_call", "call_id": part.call_id, "name": part.name, "arguments": part.arguments}
    if isinstance(part, FunctionResult):
        d: dict[str, Any] = {"kind": "function_result", "call_id": part.call_id, "result": part.result}
        if part.is_error:
            d["is_error"] = True
        if part.parts:
            d["parts"] = [_part_to_dict(p) for p in part.parts]
        return d
    if isinstance(part, DataPart):
        return {"kind": "data", "media_type": part.media_type, "data": base64.b64encode(part.data).decode()}
    if isinstance(part, UriPart):
        return {"kind": "uri", "media_type": part.media_type, "uri": part.uri}
    if isinstance(part, ReasoningPart):
        d = {"kind": "reasoning", "text": part.text}
        if part.encrypted is not None:
            d["encrypted"] = part.encrypted
        if part.format is not None:
            d["format"] = part.format
        if part.id is not None:
            d["id"] = part.id
        return d
    return {**part.payload, "kind": part.kind}


def _part_from_dict(d: Mapping[str, Any]) -> Part:
    kind = d["kind"]
    if kind == "text":
        text = d["text"]
        if type(text) is str:
            return TextPart(text)
        return TextPart(_str(d, "text"))
    if kind == "function_call":
        return FunctionCall(_str(d, "call_id"), _str(d, "name"), _str(d, "arguments"))
    if kind == "function_result":
        raw = d.get("parts")
        return FunctionResult(_str(d, "call_id"), _str(d, "result"), bool(d.get("is_error", False)),
                              _media_parts(raw) if raw else ())
    if kind == "data":
        return DataPart(base64.b64decode(_str(d, "data"), validate=True), _str(d, "media_type"))
    if kind == "uri":
        return UriPart(_str(d, "uri"), _str(d, "media_type"))
    if kind == "reasoning":
        encrypted, fmt, rid = d.get("encrypted"), d.get("format"), d.get("id")
        return ReasoningPart(_str(d, "text"), None if encrypted is None else str(encrypted),
                             None if fmt is None else str(fmt), None if rid is None else str(rid))
    if not isinstance(kind, str):
        raise CodecError(f"content part kind must be a string, got {kind!r}")
    return UnknownPart(kind, MappingProxyType({k: v for k, v in d.items() if k != "kind"}))


def _media_parts(raw: Any) -> tuple[DataPart | UriPart | UnknownPart, ...]:
    """Decode the data and URI parts of a function result (and kinds of a newer version, kept as they are)."""
    if type(raw) is not list:
        raise CodecError(f"function result parts must be a list, got {type(raw).__name__}")
    out: list[DataPart | UriPart | UnknownPart] = []
    for item in raw:
        part = _part_from_dict(item)
        if not isinstance(part, DataPart | UriPart | UnknownPart):
            raise CodecError(f"a function result may only carry data and uri parts, got kind {part.kind!r}")
        out.append(part)
    return tuple(out)


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d[key]
    if not isinstance(value, str):
        raise CodecError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _time(value: Any) -> float | int:
    """Return `value` if it is a time every decoder reads back (an int a float holds), else raise `CodecError`."""
    if type(value) is int:
        try:
            float(value)
            return value
        except OverflowError:
            pass
    raise CodecError(f"created_at must be seconds since the epoch as a float or an int, got {str(value)[:40]!r}")


def message_to_dict(message: Message) -> dict[str, Any]:
    """Encode `message` as a JSON-ready dict (codec version `CODEC_VERSION`)."""
    d: dict[str, Any] = {
        "v": CODEC_VERSION,
        "id": message.id,
        "role": message.role,
        "parts": [_part_to_dict(p) for p in message.parts],
        "created_at": message.created_at if type(message.created_at) is float else _time(message.created_at),
    }
    if message.author_name is not None:
        d["author_name"] = message.author_name
    if message.metadata:
        d["metadata"] = dict(message.metadata)
    if message.source is not None:
        d["source"] = {"kind": message.source.kind, "source_id": message.source.source_id}
    return d


def message_from_dict(d: Mapping[str, Any]) -> Message:
    """Decode a dict written by `message_to_dict` (this or a newer version).

    Raises `CodecError` naming what is wrong when the dict is not a message.
    """
    try:
        version = d.get("v", CODEC_VERSION)
        if version is not CODEC_VERSION and (not isinstance(version, int) or version < 1):
            raise CodecError(f"unsupported message codec version {version!r}")
        role = d["role"]
        if role not in _ROLES:
            raise CodecError(f"unknown message role {role!r}; expected one of {sorted(_ROLES)}")
        raw_source = d.get("source")
        source = None if raw_source is None else _source_from_dict(raw_source)
        metadata = d.get("metadata")
        created_at = d["created_at"]
        if type(created_at) is not float and type(created_at) is not int:
            raise CodecError(f"created_at must be a number, got {created_at!r}")
        message_id = d["id"]
        if type(message_id) is not str:
            message_id = _str(d, "id")
        return _new_message(role, _parts_from_list(d["parts"]), message_id, d.get("author_name"), float(created_at),
                            MappingProxyType(dict(metadata)) if metadata else EMPTY_METADATA, source)
    except CodecError:
        raise
    except RecursionError as exc:  # function result parts nested past Python's recursion limit
        raise too_deep(exc) from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise CodecError(f"not a valid encoded message: {type(exc).__name__}: {exc}") from exc


def too_deep(exc: RecursionError) -> CodecError:
    """Return the `CodecError` of a text or value nested too deeply to decode (past Python's recursion limit)."""
    return CodecError(f"an encoded message nested too deeply to decode (RecursionError: {exc})")


def _parts_from_list(raw_parts: Any) -> tuple[Part, ...]:
    if type(raw_parts) is list and len(raw_parts) == 1:
        only = raw_parts[0]
        # The common case, a single text part, built without the general dispatch.
        if type(only) is dict and len(only) == 2 and only.get("kind") == "text" and type(only["text"]) is str:
            return (_new_text(only["text"]),)
        return (_part_from_dict(only),)
    return tuple([_part_from_dict(p) for p in raw_parts])


def _source_from_dict(raw: Mapping[str, Any]) -> Source:
    kind = raw["kind"]
    if kind not in _SOURCE_KINDS:
        raise CodecError(f"unknown source kind {kind!r}; expected one of {sorted(_SOURCE_KINDS)}")
    return Source(kind, raw.get("source_id"))


_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_DECODER: Final = json.JSONDecoder()


def dumps(message: Message) -> str:
    """Encode `message` as compact JSON text."""
    return _ENCODER.encode(message_to_dict(message))


def _parse(text: str | bytes) -> Any:
    """Parse JSON text: with orjson (several times faster) when it can, else with the standard library.

    The standard library reads what orjson refuses but `dumps` may write (NaN and infinities, and
    integers too large for a float), so every encoded message still decodes. orjson reads an integer
    outside ``[-2**63, 2**64)`` as the nearest float without a word: see `_decode`.
    """
    try:
        return _fast_loads(text)
    except ValueError:  # (also JSON nested past orjson's 1,024 levels: the standard library then says RecursionError)
        return _DECODER.decode(text if isinstance(text, str) else text.decode())


def _parse_or_raise(text: str | bytes) -> Any:
    """Parse JSON text as `_parse` does, raising `CodecError` when it is not JSON (or is nested too deeply)."""
    try:
        return _parse(text)
    except ValueError as exc:
        raise CodecError(f"message is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise too_deep(exc) from None


def _parse_exactly(text: str | bytes) -> Any:
    """Parse JSON text with the standard library (every integer an int), raising `CodecError` when it is not JSON.

    JSON nested past Python's recursion limit is a `CodecError` too, never a `RecursionError`.
    """
    try:
        return _DECODER.decode(text if isinstance(text, str) else text.decode())
    except ValueError as exc:
        raise CodecError(f"message is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise too_deep(exc) from None


_WIDE: Final = float(2**63)
"""The size from which a float may be an integer orjson read beyond 64 bits (it reads them as the nearest float)."""


def _holds_wide_float(values: Iterable[Any]) -> bool:
    """Whether JSON `values` hold, at any depth, a float of size `_WIDE` or more.

    Walked with a stack of its own, not by recursion: orjson reads JSON nested 1,024 levels deep, past
    what Python's recursion limit lets a recursive walk reach (and the walk costs no call per level).
    """
    pending: list[Iterable[Any]] = [values]
    while pending:
        for value in pending.pop():
            kind = type(value)
            if kind is str:
                continue
            if kind is float:
                if abs(value) >= _WIDE:
                    return True
            elif kind is list:
                pending.append(value)
            elif kind is dict:
                pending.append(value.values())
    return False


def _may_hold_rounded_int(message: Message) -> bool:
    """Whether `message`, decoded from orjson's parse, may hold an integer beyond 64 bits that orjson made a float.

    Only free-form JSON can hold one (metadata, the payload of a part of a newer kind); every other
    field of a message is a string or a time (a float either way). Floats that large are rare in
    messages, so a message holding one is decoded again from the standard library's parse (`_decode`).
    """
    metadata = message.metadata
    if metadata and _holds_wide_float(metadata.values()):
        return True
    for part in message.parts:  # a text part or a call (most of a log) costs no call
        kind = type(part)
        if (kind is UnknownPart or kind is FunctionResult) and _parts_hold_wide_float((part,)):
            return True
    return False


def _parts_hold_wide_float(parts: Iterable[Part]) -> bool:
    for part in parts:
        if type(part) is UnknownPart:
            if _holds_wide_float(part.payload.values()):
                return True
        elif type(part) is FunctionResult and part.parts and _parts_hold_wide_float(part.parts):
            return True
    return False


def _decode(text: str | bytes, decode: Callable[[Any], Message]) -> Message:
    """Return ``decode(the JSON value of text)``, exactly as the standard library's parse would give it.

    orjson parses several times faster, but reads an integer outside ``[-2**63, 2**64)`` as the
    nearest float, silently (a float equal to it when the float holds it exactly, as 2**64): a
    message that may hold one (`_may_hold_rounded_int`) is decoded again from the standard
    library's parse, which keeps every integer an int. The check costs about 0.12 us a message, some
    5% of a plain decode (``bench/decode_bench.py``), and a walk of the metadata (some 0.3-0.8 us for
    a few keys) when there is any; a log's common shapes, built by the batch decoders, need none.
    """
    try:
        data = _fast_loads(text)
    except ValueError:  # NaN, infinities, numbers no float holds: the standard library reads them
        return decode(_parse_exactly(text))
    message = decode(data)
    return decode(_parse_exactly(text)) if _may_hold_rounded_int(message) else message


def _message_of(data: Any) -> Message:
    if type(data) is not dict:
        raise CodecError(f"encoded message must be a JSON object, got {type(data).__name__}")
    return message_from_dict(data)


def loads(text: str | bytes) -> Message:
    """Decode JSON text written by `dumps`; raises `CodecError` on anything else."""
    return _decode(text, _message_of)
