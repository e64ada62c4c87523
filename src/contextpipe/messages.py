"""Messages, their content parts, where they came from, and the JSON codec that stores them.

Messages and parts are small frozen dataclasses, cheap to build: a run may touch thousands. They are
never mutated; `Message.with_source` returns a copy. The codec (`message_to_dict` / `message_from_dict`,
`dumps` / `loads`) is the one place where they become JSON. It is versioned and lossless, and keeps
content parts of kinds it does not know (written by a newer contextpipe) as `UnknownPart`, so reading
and writing them back never drops data. `dumps_compact` writes the same message as a JSON array
without field names (a store's log decodes about twice as fast); every decoder reads both forms.

>>> m = Message.user("What should I wear in Suzhou today?")
>>> m.role, m.text
('user', 'What should I wear in Suzhou today?')
>>> loads(dumps(m)) == m
True
"""

from __future__ import annotations

import base64
import gc
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

from .errors import CodecError

try:
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is a dependency; the standard library still works
    _fast_loads = json.loads  # type: ignore[assignment]

__all__ = [
    "CODEC_VERSION",
    "DataPart",
    "FunctionCall",
    "FunctionResult",
    "Message",
    "Part",
    "ReasoningPart",
    "Role",
    "Source",
    "SourceKind",
    "TextPart",
    "UnknownPart",
    "UriPart",
    "dumps",
    "dumps_compact",
    "loads",
    "loads_arrays",
    "loads_many",
    "message_from_dict",
    "message_to_dict",
    "new_message_id",
]

CODEC_VERSION: Final = 1
"""Version written into every encoded message (key ``"v"``)."""

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
SourceKind: TypeAlias = Literal["input", "history", "context", "model", "tool"]

_ROLES: Final = frozenset(("system", "user", "assistant", "tool"))
_SOURCE_KINDS: Final = frozenset(("input", "history", "context", "model", "tool"))
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def new_message_id() -> str:
    """Return a fresh, globally unique message id (128 random bits, like a UUID4)."""
    return "msg_" + os.urandom(16).hex()


@dataclass(frozen=True, slots=True)
class Source:
    """Where a message in a run came from.

    `kind` is ``input`` (the caller's), ``history`` (loaded by a history provider), ``context`` (added
    by a context provider), ``model`` (a model's output) or ``tool`` (a tool's result); `source_id`
    names the provider, model or tool, when there is one.
    """

    kind: SourceKind
    """What contributed the message."""
    source_id: str | None = None
    """The contributing provider's `source_id`, model name or tool name."""


INPUT: Final = Source("input")
"""The source of messages passed to `Agent.run` by the caller."""


@dataclass(frozen=True, slots=True)
class TextPart:
    """Plain text."""

    text: str
    """The text."""
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """A model's request to call a tool."""

    call_id: str
    """Id the model gave this call; the result carries the same id."""
    name: str
    """Name of the tool to call."""
    arguments: str
    """Arguments as the JSON text the model produced (it may be malformed; tools validate it)."""
    kind: Literal["function_call"] = "function_call"


@dataclass(frozen=True, slots=True)
class DataPart:
    """Inline binary content (an image, audio, a file) with its media type."""

    data: bytes
    """The raw bytes; stored as base64."""
    media_type: str
    """IANA media type, for example ``image/png``."""
    kind: Literal["data"] = "data"


@dataclass(frozen=True, slots=True)
class UriPart:
    """Content referenced by URI (``https:`` or ``data:``) with its media type."""

    uri: str
    """Where the content is."""
    media_type: str
    """IANA media type, for example ``image/jpeg``."""
    kind: Literal["uri"] = "uri"


@dataclass(frozen=True, slots=True)
class FunctionResult:
    """The result of a tool call, sent back to the model: text, plus any images, audio or files.

    >>> png = DataPart(b"(the bytes of a PNG file)", "image/png")
    >>> r = FunctionResult("call_1", "A chart of the week's sales.", parts=(png,))
    >>> loads(dumps(Message("tool", (r,)))).parts[0] == r
    True

    Each model client sends `parts` in the form its API accepts (see the clients' docstrings); a part
    an API cannot take is left out with a note in the text the model sees and in the call's trace.
    """

    call_id: str
    """Id of the call this answers."""
    result: str
    """What the model is shown: the tool's return value as text, or an error message."""
    is_error: bool = False
    """True when the tool failed or was never run; `result` then says why."""
    parts: tuple[DataPart | UriPart | UnknownPart, ...] = ()
    """Images, audio or files the tool returned besides its text (an MCP tool's image, for example);
    `UnknownPart` only for a kind written by a newer contextpipe, kept so that nothing is lost."""
    kind: Literal["function_result"] = "function_result"


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """A model's reasoning text (or an opaque, provider-encrypted form of it)."""

    text: str
    """Readable reasoning, possibly empty when the provider only returns an encrypted form."""
    encrypted: str | None = None
    """Provider-specific opaque reasoning to send back on later calls (a signature, encrypted content)."""
    format: str | None = None
    """Which provider's block this is, so it is only sent back where it is accepted:
    ``anthropic.thinking``, ``anthropic.redacted_thinking``, ``openai.reasoning``; None for plain text."""
    id: str | None = None
    """The provider's id of the reasoning item, when it has one."""
    kind: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True, slots=True)
class UnknownPart:
    """A content part of a kind this version does not know, kept verbatim so nothing is lost."""

    kind: str
    """The part's kind as written by the newer version."""
    payload: Mapping[str, Any]
    """Every other field of the part, as decoded from JSON."""


Part: TypeAlias = TextPart | FunctionCall | FunctionResult | DataPart | UriPart | ReasoningPart | UnknownPart


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation.

    Build with the role helpers (`Message.user`, `Message.assistant`, ...) or directly. The id is
    assigned at creation; stores use it to make appends idempotent.
    """

    role: Role
    """``system``, ``user``, ``assistant`` or ``tool``."""
    parts: tuple[Part, ...]
    """Content parts in order."""
    id: str = field(default_factory=new_message_id)
    """Unique id, assigned when the message is created."""
    author_name: str | None = None
    """Optional name of the author (a user's name, an agent's name)."""
    created_at: float = field(default_factory=time.time)
    """Creation time, seconds since the epoch."""
    metadata: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    """Free-form JSON-serialisable data that travels with the message."""
    source: Source | None = None
    """Where the message came from in the run that produced it (see `Source`)."""
    _tool_flag: int = field(default=-1, init=False, repr=False, compare=False)
    # Lazily computed by `tool_flag`: 0 no function parts, 1 calls, 2 results, 3 both.

    @classmethod
    def user(cls, text: str, **kwargs: Any) -> Message:
        """Return a user message with one text part."""
        return cls("user", (TextPart(text),), **kwargs)

    @classmethod
    def assistant(cls, text: str, **kwargs: Any) -> Message:
        """Return an assistant message with one text part."""
        return cls("assistant", (TextPart(text),), **kwargs)

    @classmethod
    def system(cls, text: str, **kwargs: Any) -> Message:
        """Return a system message with one text part."""
        return cls("system", (TextPart(text),), **kwargs)

    @property
    def text(self) -> str:
        """The concatenated text parts (empty when there are none)."""
        parts = self.parts
        if len(parts) == 1:
            only = parts[0]
            return only.text if isinstance(only, TextPart) else ""
        return "".join(p.text for p in parts if isinstance(p, TextPart))

    @property
    def function_calls(self) -> list[FunctionCall]:
        """The function calls in this message, in order."""
        return [p for p in self.parts if isinstance(p, FunctionCall)]

    @property
    def function_results(self) -> list[FunctionResult]:
        """The function results in this message, in order."""
        return [p for p in self.parts if isinstance(p, FunctionResult)]

    @property
    def tool_flag(self) -> int:
        """0 without function parts, 1 with calls, 2 with results, 3 with both (computed once)."""
        flag = self._tool_flag
        if flag < 0:
            flag = 0
            for part in self.parts:
                kind = type(part)
                if kind is FunctionCall:
                    flag |= 1
                elif kind is FunctionResult:
                    flag |= 2
            object.__setattr__(self, "_tool_flag", flag)
        return flag

    def with_source(self, source: Source) -> Message:
        """Return a copy tagged with `source`; this message is left as it is."""
        current = self.source
        if current is source or current == source:
            return self
        return Message(self.role, self.parts, self.id, self.author_name, self.created_at, self.metadata, source)


# Decoding builds messages without the dataclass __init__ (which sets each frozen slot through
# object.__setattr__): the slots are filled through their descriptors, about twice as fast. The
# field lists are checked here so that a new field cannot be left unset.
_MESSAGE_FIELDS: Final = ("role", "parts", "id", "author_name", "created_at", "metadata", "source", "_tool_flag")
if tuple(f.name for f in fields(Message)) != _MESSAGE_FIELDS or tuple(f.name for f in fields(TextPart)) != (
        "text", "kind"):  # pragma: no cover - guards future edits of the classes above
    raise RuntimeError("contextpipe.messages: update _new_message / _new_text for the changed fields")
_new: Final = object.__new__
(_set_role, _set_parts, _set_id, _set_author, _set_created, _set_metadata, _set_source,
 _set_flag) = (Message.__dict__[name].__set__ for name in _MESSAGE_FIELDS)
_set_text, _set_kind = TextPart.__dict__["text"].__set__, TextPart.__dict__["kind"].__set__


def _new_message(role: Role, parts: tuple[Part, ...], message_id: str, author_name: str | None, created_at: float,
                 metadata: Mapping[str, Any], source: Source | None) -> Message:
    """Return ``Message(role, parts, message_id, author_name, created_at, metadata, source)``, faster."""
    m: Message = _new(Message)
    _set_role(m, role)
    _set_parts(m, parts)
    _set_id(m, message_id)
    _set_author(m, author_name)
    _set_created(m, created_at)
    _set_metadata(m, metadata)
    _set_source(m, source)
    _set_flag(m, -1)
    return m


def _new_text(text: str) -> TextPart:
    """Return ``TextPart(text)``, faster."""
    part: TextPart = _new(TextPart)
    _set_text(part, text)
    _set_kind(part, "text")
    return part


def tag(messages: Iterable[Message], source: Source) -> list[Message]:
    """Return `messages` tagged with `source` (copies; the originals are untouched)."""
    return [m.with_source(source) for m in messages]


# --- codec -------------------------------------------------------------------------------------------


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
                            MappingProxyType(dict(metadata)) if metadata else _EMPTY, source)
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise CodecError(f"not a valid encoded message: {type(exc).__name__}: {exc}") from exc


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


# The compact form: ``[head, id, created_at, source_id, (author_name), (metadata), part, ...]``. `head`
# holds the role (bits 0-1: its place in `_ROLE_ORDER`), the source's kind (bits 2-4: 0 without a
# source, else 1 + its place in `_SOURCE_ORDER`) and whether author_name (32) and metadata (64)
# follow source_id (null without a source). A part is a string (a text part), ``[call_id, name,
# arguments]`` (a function call), ``[call_id, result]`` (a function result without error or parts)
# or, for every other part, its full form (an object). A head of 128 or more is a form this version
# does not know. An encoded message starts with ``[`` in this form and with ``{`` in the full one.
_ROLE_ORDER: Final = ("system", "user", "assistant", "tool")
_SOURCE_ORDER: Final = ("input", "history", "context", "model", "tool")
_ROLE_CODE: Final = {role: i for i, role in enumerate(_ROLE_ORDER)}
_SOURCE_CODE: Final = {kind: 4 * (i + 1) for i, kind in enumerate(_SOURCE_ORDER)}
_AUTHOR: Final = 32
_METADATA: Final = 64
_HEADS: Final = 128
_PLAIN_HEADS: Final = 4 * (len(_SOURCE_ORDER) + 1)
"""Heads below this have no author_name or metadata (and a known source kind)."""


def dumps_compact(message: Message) -> str:
    """Encode `message` as compact JSON text (an array without field names), read back by `loads`.

    It holds everything `dumps` does and decodes about twice as fast; stores that write it say so
    in their schema version, since a contextpipe older than this form cannot read it.

    >>> m = Message.user("hi", id="msg_1", created_at=1.5)
    >>> dumps_compact(m)
    '[1,"msg_1",1.5,null,"hi"]'
    >>> loads(dumps_compact(m)) == m
    True

    A message whose fields have unexpected types (which `loads` may refuse) is written by `dumps`.
    """
    out = _compact_fields(message)
    if out is None:
        return dumps(message)
    out += [_compact_part_of(part) for part in message.parts]
    return _ENCODER.encode(out)


def _compact_fields(message: Message) -> list[Any] | None:
    """Return the fields before the parts of `message` in the compact form (None: it cannot hold them exactly)."""
    role, message_id, created_at, source = message.role, message.id, message.created_at, message.source
    head = _ROLE_CODE.get(role) if type(role) is str else None
    if head is None or type(message_id) is not str or (type(created_at) is not float and (
            type(created_at) is not int or abs(created_at) > 2**53)):  # an int that a float holds exactly
        return None
    source_code, source_id = _compact_source(source)
    if source_code < 0:
        return None
    out: list[Any] = [head | source_code, message_id, float(created_at), source_id]
    author = message.author_name
    if author is not None:
        if type(author) is not str:
            return None
        out[0] |= _AUTHOR
        out.append(author)
    if message.metadata:
        out[0] |= _METADATA
        out.append(dict(message.metadata))
    return out


def _compact_source(source: Source | None) -> tuple[int, str | None]:
    """Return the head bits and the source id of `source` in the compact form (bits -1: it cannot hold it)."""
    if source is None:
        return 0, None
    if type(source) is not Source or type(source.kind) is not str or source.kind not in _SOURCE_CODE:
        return -1, None
    source_id = source.source_id
    if source_id is not None and type(source_id) is not str:
        return -1, None
    return _SOURCE_CODE[source.kind], source_id


def _compact_part_of(part: Part) -> Any:
    """Return `part` in the compact form: a string, a list of strings, or its full form (a dict)."""
    if type(part) is TextPart and type(part.text) is str:
        return part.text
    if type(part) is FunctionCall and type(part.call_id) is str and type(part.name) is str \
            and type(part.arguments) is str:
        return [part.call_id, part.name, part.arguments]
    if type(part) is FunctionResult and not part.is_error and not part.parts and type(part.call_id) is str \
            and type(part.result) is str:
        return [part.call_id, part.result]
    return _part_to_dict(part)


def _from_compact(d: list[Any]) -> Message:
    """Decode a message in the compact form (see `dumps_compact`), with the checks `message_from_dict` makes."""
    if len(d) < 4:
        raise CodecError(f"a compact encoded message has at least 4 fields, got {len(d)}")
    head, message_id, created_at, source_id = d[0], d[1], d[2], d[3]
    _check_compact(head, message_id, created_at, source_id)
    try:
        author, metadata, at = _compact_options(d, head)
        parts = tuple([_compact_part(p) for p in d[at:]])
        at_time = float(created_at)
    except CodecError:
        raise
    except (IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise CodecError(f"not a valid encoded message: {type(exc).__name__}: {exc}") from exc
    source_code = head >> 2 & 7
    source = Source(_SOURCE_ORDER[source_code - 1], source_id) if source_code else None
    return _new_message(_ROLE_ORDER[head & 3], parts, message_id, author, at_time, metadata, source)


def _check_compact(head: Any, message_id: Any, created_at: Any, source_id: Any) -> None:
    """Raise `CodecError` unless the first four fields of a compact message are valid."""
    if type(head) is not int or not 0 <= head < _HEADS or (head >> 2 & 7) > len(_SOURCE_ORDER):
        raise CodecError(f"unsupported compact message header {head!r}: written by a newer contextpipe?")
    if type(message_id) is not str:
        raise CodecError(f"field 'id' must be a string, got {type(message_id).__name__}")
    if type(created_at) is not float and type(created_at) is not int:
        raise CodecError(f"created_at must be a number, got {created_at!r}")
    if source_id is not None and (not head >> 2 & 7 or type(source_id) is not str):
        raise CodecError(f"source id must be a string with a source, got {source_id!r}")


def _compact_options(d: list[Any], head: int) -> tuple[str | None, Mapping[str, Any], int]:
    """Return a compact message's author name and metadata (when its head says so) and where its parts start."""
    at = 4
    author = None
    metadata: Mapping[str, Any] = _EMPTY
    if head & _AUTHOR:
        author = d[at]
        at += 1
        if type(author) is not str:
            raise CodecError(f"author_name must be a string, got {type(author).__name__}")
    if head & _METADATA:
        raw = d[at]
        at += 1
        if type(raw) is not dict:
            raise CodecError(f"metadata must be a JSON object, got {type(raw).__name__}")
        metadata = MappingProxyType(raw) if raw else _EMPTY
    return author, metadata, at


def _compact_part(p: Any) -> Part:
    if type(p) is str:
        return _new_text(p)
    if type(p) is list and all(type(x) is str for x in p):
        if len(p) == 3:
            return FunctionCall(p[0], p[1], p[2])
        if len(p) == 2:
            return FunctionResult(p[0], p[1])
    if type(p) is dict:
        return _part_from_dict(p)
    raise CodecError(f"not a compact content part: {str(p)[:80]}")


def _parse(text: str | bytes) -> Any:
    """Parse JSON text: with orjson (several times faster) when it can, else with the standard library.

    The standard library reads what orjson refuses but `dumps` may write (NaN and infinities,
    integers beyond 64 bits), so every encoded message still decodes.
    """
    try:
        return _fast_loads(text)
    except ValueError:
        return _DECODER.decode(text if isinstance(text, str) else text.decode())


def loads(text: str | bytes) -> Message:
    """Decode JSON text written by `dumps` or `dumps_compact`; raises `CodecError` on anything else."""
    try:
        data = _parse(text)
    except ValueError as exc:
        raise CodecError(f"message is not valid JSON: {exc}") from exc
    if type(data) is list:
        return _from_compact(data)
    if type(data) is not dict:
        raise CodecError(f"encoded message must be a JSON object or array, got {type(data).__name__}")
    return message_from_dict(data)


def loads_many(texts: Iterable[str | bytes]) -> list[Message]:
    """Decode many texts written by `dumps` (a stored log), as `loads` would each, several times faster.

    The common shapes (one text part, one function call or one function result, with no metadata,
    source or author) are recognised and built at once; anything else goes through
    `message_from_dict`, with the same checks. The garbage collector is paused while the messages
    are built (they hold no cycles to find), which saves it from tracing the growing list over and
    over. Raises `CodecError` on the first text that is not a message.
    """
    texts = texts if isinstance(texts, list) else list(texts)
    out: list[Message] = []
    with _gc_paused(len(texts) > 100):
        for start in range(0, len(texts), _BATCH):  # parsed a batch at a time: bounded memory for long logs
            data: list[Any] = []
            add = data.append
            for text in texts[start:start + _BATCH]:
                try:
                    add(_fast_loads(text))
                except ValueError:
                    add(_parse_or_raise(text))
            _build(data, out)
    return out


def loads_arrays(texts: Sequence[str | bytes]) -> list[list[Message]]:
    """Decode JSON arrays of encoded messages, one list per array, as `loads_many` decodes their elements.

    A store reads a long log as a few such arrays (each ``"[" + ",".join(bodies) + "]"``) instead
    of one row per message: one string and one parse per array. ``loads_arrays([a])[0]`` equals
    ``loads_many(elements of a)``. Raises `CodecError` when a text is not a JSON array of messages.

    >>> log = [Message.user("hi"), Message.assistant("hello")]
    >>> loads_arrays(["[" + ",".join(dumps(m) for m in log) + "]"]) == [log]
    True
    """
    out: list[list[Message]] = []
    with _gc_paused(True):
        for text in texts:
            data = _parse_or_raise(text)
            if type(data) is not list:
                raise CodecError(f"encoded messages must be a JSON array, got {type(data).__name__}")
            messages: list[Message] = []
            _build(data, messages)
            out.append(messages)
    return out


_BATCH: Final = 4096


@contextmanager
def _gc_paused(pause: bool) -> Iterator[None]:
    """Pause the garbage collector (when `pause` and it is on) while messages are built.

    Messages hold no cycles, so the collector has nothing to find among them while they are built;
    pausing it saves tracing the growing list over and over. Nothing is moved between generations
    by hand: objects promoted outside the collector's own accounting (``gc.freeze`` then
    ``gc.unfreeze``) never count towards a full collection, so the application's cyclic garbage
    promoted with them would never be collected.
    """
    collecting = pause and gc.isenabled()
    if collecting:
        gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _parse_or_raise(text: str | bytes) -> Any:
    try:
        return _parse(text)
    except ValueError as exc:
        raise CodecError(f"message is not valid JSON: {exc}") from exc


_TEXT_FIELDS: Final = ("text", "kind")
_CALL_FIELDS: Final = ("call_id", "name", "arguments", "kind")
_RESULT_FIELDS: Final = ("call_id", "result", "is_error", "parts", "kind")
_SHELLED: Final = tuple(tuple(f.name for f in fields(c)) for c in (TextPart, FunctionCall, FunctionResult))
if _SHELLED != (_TEXT_FIELDS, _CALL_FIELDS, _RESULT_FIELDS):  # pragma: no cover - guards future edits of the classes
    raise RuntimeError("contextpipe.messages: update the shells for the changed fields")


class _Shell:
    """Same slots in the same order as `Message`, so CPython lets an instance change into one.

    The common shapes are built by filling a shell's slots, then setting its class: a frozen
    dataclass's ``__init__`` sets each slot through ``object.__setattr__``, several times slower.
    """

    __slots__ = _MESSAGE_FIELDS


class _TextShell:
    __slots__ = _TEXT_FIELDS


class _CallShell:
    __slots__ = _CALL_FIELDS


class _ResultShell:
    __slots__ = _RESULT_FIELDS


def _build(data: list[Any], out: list[Message]) -> None:
    """Append the message each decoded value in `data` encodes to `out` (`CodecError` on the first that is not).

    The common shapes (one text part, one function call or one function result, with nothing
    optional but a source in the compact form) are built directly, with every check the general
    decoders make on them; the rest go through those. The compact ones are built in this loop
    itself: a function call per message would cost a tenth more instructions here.
    """
    append = out.append
    sources: dict[tuple[int, str | None], Any] = {}  # the few sources of a log, each built once
    message_class, shell, roles, empty, invalid = Message, _Shell, _ROLE_ORDER, _EMPTY, _INVALID
    text_class, text_shell, call_class, call_shell = TextPart, _TextShell, FunctionCall, _CallShell
    result_class, result_shell = FunctionResult, _ResultShell
    for d in data:
        if type(d) is list:
            # The compact form with one part and nothing optional: built here, with every check
            # `_from_compact` makes on it (anything else goes through it).
            if len(d) == 5:
                head, message_id, created_at, source_id, only = d
                if type(head) is int and 0 <= head < _PLAIN_HEADS and type(message_id) is str \
                        and type(created_at) is float:
                    source: Any = None
                    if head >= 4:
                        if source_id is None or type(source_id) is str:
                            source = sources.get((head, source_id))
                            if source is None:
                                source = sources[head, source_id] = Source(_SOURCE_ORDER[(head >> 2) - 1], source_id)
                        else:
                            source = invalid
                    elif source_id is not None:
                        source = invalid
                    part: Any = None
                    kind = type(only)
                    if kind is str:
                        part = text_shell()
                        part.text = only
                        part.kind = "text"
                        part.__class__ = text_class
                        flag = 0
                    elif kind is list:
                        n = len(only)
                        if n == 3:
                            call_id, name, arguments = only
                            if type(call_id) is str and type(name) is str and type(arguments) is str:
                                part = call_shell()
                                part.call_id = call_id
                                part.name = name
                                part.arguments = arguments
                                part.kind = "function_call"
                                part.__class__ = call_class
                                flag = 1
                        elif n == 2:
                            call_id, result = only
                            if type(call_id) is str and type(result) is str:
                                part = result_shell()
                                part.call_id = call_id
                                part.result = result
                                part.is_error = False
                                part.parts = ()
                                part.kind = "function_result"
                                part.__class__ = result_class
                                flag = 2
                    if part is not None and source is not invalid:
                        m: Any = shell()
                        m.role = roles[head & 3]
                        m.parts = (part,)
                        m.id = message_id
                        m.author_name = None
                        m.created_at = created_at
                        m.metadata = empty
                        m.source = source
                        m._tool_flag = flag
                        m.__class__ = message_class
                        append(m)
                        continue
            append(_from_compact(d))
            continue
        m = _plain_full(d)
        append(_from_data(d) if m is None else m)


def _plain_full(d: Any) -> Any:
    """Return the message `d` encodes in the full form if it has one common part and nothing optional (else None)."""
    if type(d) is not dict or len(d) != 5:
        return None
    try:  # five keys, each of them present, is exactly the required ones: nothing optional
        parts, role, message_id, created_at, version = d["parts"], d["role"], d["id"], d["created_at"], d["v"]
    except KeyError:
        return None
    if not (type(parts) is list and len(parts) == 1 and type(role) is str and type(message_id) is str
            and type(created_at) is float and version is CODEC_VERSION and role in _ROLES):
        return None
    part = _common_part(parts[0])
    if part is None:
        return None
    m: Any = _Shell()
    m.role = role
    m.parts = (part,)
    m.id = message_id
    m.author_name = None
    m.created_at = created_at
    m.metadata = _EMPTY
    m.source = None
    m._tool_flag = _TOOL_FLAG[part.kind]
    m.__class__ = Message
    return m


_TOOL_FLAG: Final = {"text": 0, "function_call": 1, "function_result": 2}
_INVALID: Final = object()


def _common_part(only: Any) -> Any:
    """Return the part `only` encodes if it is a text, a function call or a function result with no optional key."""
    if type(only) is not dict:
        return None
    kind = only.get("kind")
    part: Any = None
    if kind == "text":
        text = only.get("text")
        if type(text) is str and len(only) == 2:
            part = _TextShell()
            part.text = text
            part.kind = "text"
            part.__class__ = TextPart
    elif kind == "function_call":
        call_id, name, arguments = only.get("call_id"), only.get("name"), only.get("arguments")
        if type(call_id) is str and type(name) is str and type(arguments) is str and len(only) == 4:
            part = _CallShell()
            part.call_id = call_id
            part.name = name
            part.arguments = arguments
            part.kind = "function_call"
            part.__class__ = FunctionCall
    elif kind == "function_result":
        call_id, result = only.get("call_id"), only.get("result")
        if type(call_id) is str and type(result) is str and len(only) == 3:
            part = _ResultShell()
            part.call_id = call_id
            part.result = result
            part.is_error = False
            part.parts = ()
            part.kind = "function_result"
            part.__class__ = FunctionResult
    return part


def _from_data(data: Any) -> Message:
    if type(data) is list:
        return _from_compact(data)
    if type(data) is not dict:
        raise CodecError(f"encoded message must be a JSON object or array, got {type(data).__name__}")
    return message_from_dict(data)


def as_messages(value: str | Message | Sequence[Message]) -> list[Message]:
    """Normalise a run's input (text, one message or a list) into a list of messages."""
    if isinstance(value, str):
        return [Message.user(value)]
    if isinstance(value, Message):
        return [value]
    return list(value)
