"""How stores encode messages compactly and decode logs of them fast: the accelerators behind the codec.

Everything here exists for speed and must equal a plain reference (`tests/test_fastdecode.py`
checks both on generated messages):

- the compact form (`dumps_compact`): the fields of `contextpipe.codec`'s full form in a JSON array,
  without field names, which a store's log decodes faster from. `decode_compact` is its plain
  decoder, with every check `message_from_dict` makes; `loads_stored` reads one stored text in either
  form;
- the batch decoders (`loads_many`, `loads_arrays`): a log's common shapes (one text part, one
  function call or one function result, with nothing optional but a source) are built by filling
  look-alike "shells" and then setting their class, without the frozen dataclasses' ``__init__``;
  anything else goes through the plain decoders. They equal ``[loads_stored(t) for t in texts]``;
- every decoder parses with orjson, and reads a text again with the standard library when orjson may
  have made an integer beyond 64 bits a float (`contextpipe.codec._decode`): a batch holding such a
  message is parsed again by the standard library, and built from that;
- the garbage collector is paused while a batch is built (the messages hold no cycles).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from types import MappingProxyType
from typing import Any, Final

from ..codec import (
    _ENCODER,
    _ROLES,
    CODEC_VERSION,
    _decode,
    _fast_loads,
    _may_hold_rounded_int,
    _parse_exactly,
    _parse_or_raise,
    _part_from_dict,
    _part_to_dict,
    dumps,
    message_from_dict,
    too_deep,
)
from ..errors import CodecError
from ..messages import (
    EMPTY_METADATA,
    FunctionCall,
    FunctionResult,
    Message,
    Part,
    Source,
    TextPart,
    _new_message,
    _new_text,
)

__all__ = ["decode_compact", "dumps_compact", "loads_arrays", "loads_many", "loads_stored"]


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
    """Encode `message` as compact JSON text (an array without field names), read back by `loads_stored`.

    It holds everything `dumps` does and decodes about twice as fast; stores that write it say so
    in their schema version, since a contextpipe older than this form cannot read it.

    >>> m = Message.user("hi", id="msg_1", created_at=1.5)
    >>> dumps_compact(m)
    '[1,"msg_1",1.5,null,"hi"]'
    >>> loads_stored(dumps_compact(m)) == m
    True

    A message whose fields have unexpected types (which `loads_stored` may refuse) is written by `dumps`.
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


def decode_compact(d: list[Any]) -> Message:
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
    except RecursionError as exc:  # function result parts nested past Python's recursion limit
        raise too_deep(exc) from None
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
    metadata: Mapping[str, Any] = EMPTY_METADATA
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
        metadata = MappingProxyType(raw) if raw else EMPTY_METADATA
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


def loads_stored(text: str | bytes) -> Message:
    """Decode one stored text, written by `dumps` or `dumps_compact`; raises `CodecError` on anything else."""
    return _decode(text, _from_data)


def loads_many(texts: Iterable[str | bytes]) -> list[Message]:
    """Decode many texts written by `dumps` or `dumps_compact` (a stored log), as `loads_stored` would each.

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
            batch = texts[start:start + _BATCH]
            data: list[Any] = []
            add = data.append
            for text in batch:
                try:
                    add(_fast_loads(text))
                except ValueError:
                    add(_parse_exactly(text))
            try:
                _build(data, out)
            except _RoundedInt:  # rare: the batch parsed again by the standard library, and built from that
                del out[start:]
                _build([_parse_exactly(text) for text in batch], out, _from_data)
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
            try:
                _build(data, messages)
            except _RoundedInt:  # rare: the array parsed again by the standard library, and built from that
                messages = []
                _build(_parse_exactly(text), messages, _from_data)
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


class _Shell:
    """Same slots in the same order as `Message`, so CPython lets an instance change into one.

    The common shapes are built by filling a shell's slots, then setting its class: a frozen
    dataclass's ``__init__`` sets each slot through ``object.__setattr__``, several times slower.
    """

    __slots__ = tuple(f.name for f in fields(Message))


class _TextShell:
    __slots__ = tuple(f.name for f in fields(TextPart))


class _CallShell:
    __slots__ = tuple(f.name for f in fields(FunctionCall))


class _ResultShell:
    __slots__ = tuple(f.name for f in fields(FunctionResult))


class _RoundedInt(Exception):
    """A message of a batch may hold an integer beyond 64 bits that orjson read as a float (see `codec._decode`)."""


def _from_parsed(d: Any) -> Message:
    """Decode `d` (as orjson parsed it) with the plain decoders, raising `_RoundedInt` when it cannot be trusted."""
    message = _from_data(d)
    if _may_hold_rounded_int(message):
        raise _RoundedInt
    return message


# Measured (bench/results/decode.json): a compact log decodes 2.4x faster here than through decode_compact.
def _build(data: list[Any], out: list[Message], plain: Callable[[Any], Message] = _from_parsed) -> None:
    """Append the message each decoded value in `data` encodes to `out` (`CodecError` on the first that is not).

    The common shapes (one text part, one function call or one function result, with nothing
    optional but a source in the compact form) are built directly, with every check the general
    decoders make on them; the rest go through `plain` (`_from_full` first for the full form). By
    default that is `_from_parsed`, which raises `_RoundedInt` when orjson's parse of a message cannot
    be trusted; `data` parsed by the standard library passes `_from_data`. The compact ones are built
    in this loop itself, without a function call per message.
    """
    append = out.append
    sources = _Sources()
    message_class, shell, roles, empty, invalid = Message, _Shell, _ROLE_ORDER, EMPTY_METADATA, _INVALID
    text_class, text_shell, call_class, call_shell = TextPart, _TextShell, FunctionCall, _CallShell
    result_class, result_shell = FunctionResult, _ResultShell
    for d in data:
        if type(d) is not list or len(d) != 5:  # the full form, or a compact one with more than one part
            append(_from_full(d, plain))
            continue
        head, message_id, created_at, source_id, only = d
        try:
            source = sources[type(head), head, source_id]
        except TypeError:  # an unhashable field, which no compact message has
            source = invalid
        part: Any = None
        if source is not invalid and type(message_id) is str and type(created_at) is float:
            kind = type(only)
            if kind is str:
                part = text_shell()
                part.text = only
                part.kind = "text"
                part.__class__ = text_class
                flag = 0
            elif kind is list:
                n = len(only)
                if n == 3 and type(only[0]) is type(only[1]) is type(only[2]) is str:
                    part = call_shell()
                    part.call_id, part.name, part.arguments = only
                    part.kind = "function_call"
                    part.__class__ = call_class
                    flag = 1
                elif n == 2 and type(only[0]) is type(only[1]) is str:
                    part = result_shell()
                    part.call_id, part.result = only
                    part.is_error = False
                    part.parts = ()
                    part.kind = "function_result"
                    part.__class__ = result_class
                    flag = 2
        if part is None:
            append(plain(d))
            continue
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


class _Sources(dict[tuple[type, Any, Any], Any]):
    """The source of the compact messages built directly, by the type and value of their head and their source id.

    None for a head without a source, `_INVALID` for a pair no such message has (a head that is not
    an int, out of range or with author_name or metadata; a source id that is not a string, or
    without a source kind). One a batch: it holds the few sources of a log, each built once.
    """

    __slots__ = ()

    def __missing__(self, key: tuple[type, Any, Any]) -> Any:
        kind, head, source_id = key
        source: Any = _INVALID
        if kind is int and 0 <= head < _PLAIN_HEADS and (source_id is None or (head >= 4 and type(source_id) is str)):
            source = Source(_SOURCE_ORDER[(head >> 2) - 1], source_id) if head >= 4 else None
        self[key] = source
        return source


def _from_full(d: Any, plain: Callable[[Any], Message]) -> Message:
    """Return the message `d` encodes: built directly in the full form with one common part and nothing optional.

    Any other message is decoded by `plain` (see `_build`).
    """
    if type(d) is not dict or len(d) != 5:
        return plain(d)
    try:  # five keys, each of them present, is exactly the required ones: nothing optional
        parts, role, message_id, created_at, version = d["parts"], d["role"], d["id"], d["created_at"], d["v"]
    except KeyError:
        return plain(d)
    if not (type(parts) is list and len(parts) == 1 and type(role) is str and type(message_id) is str
            and type(created_at) is float and version is CODEC_VERSION and role in _ROLES):
        return plain(d)
    part = _common_part(parts[0])
    if part is None:
        return plain(d)
    m: Any = _Shell()  # as in `_build`
    m.role, m.parts, m.id, m.author_name, m.created_at = role, (part,), message_id, None, created_at
    m.metadata, m.source, m._tool_flag = EMPTY_METADATA, None, _TOOL_FLAG[part.kind]
    m.__class__ = Message
    message: Message = m
    return message


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
        return decode_compact(data)
    if type(data) is not dict:
        raise CodecError(f"encoded message must be a JSON object or array, got {type(data).__name__}")
    return message_from_dict(data)
