"""Messages, their content parts, and where they came from.

Messages and parts are small frozen dataclasses, cheap to build: a run may touch thousands. They are
never mutated; `Message.with_source` returns a copy. They become JSON only in `contextpipe.codec`
(versioned and lossless); a store's compact form and its fast batch decoders are private to
`contextpipe.stores`.

>>> m = Message.user("What should I wear in Suzhou today?")
>>> m.role, m.text
('user', 'What should I wear in Suzhou today?')
>>> m.with_source(Source("history")).source
Source(kind='history', source_id=None)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

__all__ = [
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
    "new_message_id",
]

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
SourceKind: TypeAlias = Literal["input", "history", "context", "model", "tool"]

EMPTY_METADATA: Final[Mapping[str, Any]] = MappingProxyType({})
"""The metadata of every message that has none: one shared read-only mapping."""


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
    >>> Message("tool", (r,)).function_results[0].parts == (png,)
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
    metadata: Mapping[str, Any] = field(default_factory=lambda: EMPTY_METADATA)
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


# Decoders build messages without the dataclass __init__ (which sets each frozen slot through
# object.__setattr__): `_new_message` and `_new_text` fill the slots through their descriptors, about
# twice as fast. A field they leave unset fails the codec's round-trip tests (tests/test_codec.py).
_new: Final = object.__new__
_set_role, _set_parts, _set_id, _set_author, _set_created, _set_metadata, _set_source, _set_flag = (
    Message.__dict__[name].__set__
    for name in ("role", "parts", "id", "author_name", "created_at", "metadata", "source", "_tool_flag"))
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


def as_messages(value: str | Message | Sequence[Message]) -> list[Message]:
    """Normalise a run's input (text, one message or a list) into a list of messages."""
    if isinstance(value, str):
        return [Message.user(value)]
    if isinstance(value, Message):
        return [value]
    return list(value)
