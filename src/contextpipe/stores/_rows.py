"""The message rows of the durable backends: messages, checkpoints and pages of the log, with corruption errors.

Apart from `_common` because it needs the codec (and orjson, to decode fast): `MemoryStore` keeps the
`Message` objects themselves and encodes none, so an agent on the in-memory store never loads them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..codec import dumps
from ..errors import CodecError, CorruptRecord, UsageError, shorten
from ..messages import Message
from ..session import SessionKey
from ._common import dump_json, storable
from ._fastdecode import dumps_compact, loads_many, loads_stored
from .base import Checkpoint, MessagePage

__all__ = ["decode_checkpoint", "decode_message", "encode_batch", "encode_checkpoint", "encode_message", "make_page"]


def encode_message(message: Message, *, compact: bool = False) -> str:
    """Encode a message to store: in the full form, or in the compact one (`dumps_compact`).

    The compact form only goes to a backend whose schema version says so; every decoder reads both.
    A message whose metadata or parts nest past Python's recursion limit is a `UsageError`.
    """
    try:
        return storable(dumps_compact(message) if compact else dumps(message))
    except RecursionError:
        raise UsageError(f"message {shorten(message.id)} cannot be stored: its metadata or parts nest too deeply "
                         "to encode as JSON; keep them under 1,000 levels (nested data a model or a tool "
                         "produced belongs in a part's text, as JSON text)") from None


def decode_message(backend: str, key: SessionKey, seq: int, body: str | bytes,
                   message_id: str | None = None) -> Message:
    """Decode a stored message, raising `CorruptRecord` that names the session and sequence."""
    try:
        message = loads_stored(body)
    except (CodecError, UnicodeDecodeError) as exc:
        raise CorruptRecord.unreadable(backend, key, f"message {seq}", exc, seq) from exc
    if message_id is not None and message.id != message_id:
        raise CorruptRecord.unreadable(backend, key, f"message {seq}",
                                       f"it has id {shorten(message.id)} but is indexed as {shorten(message_id)}", seq)
    return message


def encode_checkpoint(checkpoint: Checkpoint) -> str:
    return dump_json({"seq": checkpoint.seq, "created_at": checkpoint.created_at,
                      "summary": json.loads(dumps(checkpoint.summary))})


def decode_checkpoint(backend: str, key: SessionKey, body: str | bytes) -> Checkpoint:
    try:
        data = json.loads(body)
        return Checkpoint(int(data["seq"]), loads_stored(json.dumps(data["summary"])), float(data["created_at"]))
    except (ValueError, KeyError, TypeError, CodecError, RecursionError) as exc:  # (nested too deeply: RecursionError)
        raise CorruptRecord.unreadable(backend, key, "a checkpoint", exc) from exc


def encode_batch(messages: Sequence[Message], *, compact: bool = False) -> list[tuple[str, str]]:
    """Encode a batch to append as ``(id, body)`` pairs (its ids were checked by `SessionStore.append`)."""
    return [(m.id, encode_message(m, compact=compact)) for m in messages]


def _indexed_ids(messages: list[Message], ids: Sequence[str | None]) -> bool:
    """Whether each message has the id its row is indexed under (None: the backend keeps no separate id)."""
    if [m.id for m in messages] == ids:
        return True
    return all(mid is None or m.id == mid for m, mid in zip(messages, ids, strict=True))


def make_page(backend: str, key: SessionKey, end: int,
              rows: Sequence[tuple[int, str, str | bytes]]) -> MessagePage:
    """Build a page from ``(seq, message_id, body)`` rows in sequence order.

    `end` is the last sequence of the requested range; when no row matched, the page starts one
    past it. Sequences are contiguous from 1, so older messages exist exactly when the page does
    not start at 1.
    """
    try:
        decoded = loads_many([body for _, _, body in rows])
    except CodecError:
        decoded = None
    if decoded is None or not _indexed_ids(decoded, [mid for _, mid, _ in rows]):
        # Name the first record that cannot be read (the fast path above does not say which).
        decoded = [decode_message(backend, key, int(seq), body, mid) for seq, mid, body in rows]
    messages = decoded
    first = int(rows[0][0]) if rows else end + 1
    return MessagePage(messages, first, first > 1)
