"""Pieces every store backend shares.

The lease check and the row codec with corruption errors (the contract's checks and the translation of
driver errors are done once, by `SessionStore`'s public methods).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Final

from ..codec import dumps
from ..errors import CodecError, CorruptRecord, LeaseLost, SessionBusy, UsageError, shorten
from ..messages import Message
from ..session import Session, SessionKey
from ._fastdecode import dumps_compact, loads_many, loads_stored
from .base import Checkpoint, Lease, MessagePage

SCHEMA_VERSION: Final = 2
"""Version of the durable layout (tables, keys) written by this release (SQLite has its own, see `SQLiteStore`)."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def check_lease(backend: str, key: SessionKey, lease: Lease | None, owner: str | None, token: int,
                expires: float, now: float) -> None:
    """Make the write check of every backend (Redis makes it in Lua).

    `lease` must be the current one; with none, no unexpired lease may be held (`expires` is the
    held lease's expiry, already bounded by `bounded_expiry` where the clock is the workers').
    """
    if lease is not None:
        if lease.token != token or lease.owner != owner:
            raise lease_lost(backend, key, lease, token, now)
    elif owner is not None and expires > now:
        raise SessionBusy.held(backend, key)


def lease_lost(backend: str, key: SessionKey, lease: Lease, current: int | None, now: float) -> LeaseLost:
    """Return the error for a write or renewal under `lease` that the store refused, saying what happened.

    `current` is the session's fencing token now (None when the session is gone). A larger one means
    another run took the session over. Otherwise the session was deleted, or expired and started
    afresh (its token starts again from 0, or stays as it was with nobody holding it): whether the
    lease had lapsed by `now` says which is possible, since a session never expires under a live lease.
    """
    if current is not None and current > lease.token:
        return LeaseLost.taken_over(backend, key, lease.token, current)
    return LeaseLost.session_gone(backend, key, lease.token, lapsed=lease.expires_at <= now)


def bounded_expiry(expires: float, ttl: float, now: float) -> float:
    """Return a lease's expiry bounded by what its `ttl` allows from `now`, however the clock moved.

    A lease lasts at most `ttl` past its last renewal. If the clock stepped back since, `expires`
    lies more than `ttl` ahead of `now`: the lease then counts as renewed now, so a dead holder
    blocks its session for at most one `ttl` more instead of for the size of the step. (A forward
    step needs no bound: it only makes leases expire early.) A `ttl` of 0 means unknown: unbounded.
    """
    return min(expires, now + ttl) if ttl > 0 else expires


def lease_is_free(owner: str | None, expires: float, now: float, me: str) -> bool:
    """Whether `me` may take a lease held by `owner` until `expires` (free, expired, or already mine)."""
    return owner is None or expires <= now or owner == me


def storable(text: str) -> str:
    r"""Return JSON text that every backend can store: lone surrogates (which UTF-8 cannot encode) become ``\\uXXXX``.

    JSON text holds a surrogate only inside a string, where the escape decodes back to the same code point.
    """
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def dump_json(value: Any) -> str:
    return storable(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def encode_message(message: Message, *, compact: bool = False) -> str:
    """Encode a message to store: in the full form, or in the compact one (`dumps_compact`).

    The compact form only goes to a backend whose schema version says so; every decoder reads both.
    """
    return storable(dumps_compact(message) if compact else dumps(message))


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
    except (ValueError, KeyError, TypeError, CodecError) as exc:
        raise CorruptRecord.unreadable(backend, key, "a checkpoint", exc) from exc


def decode_object(backend: str, key: SessionKey, body: str | bytes, what: str) -> dict[str, Any]:
    """Decode a stored JSON object (`what`: "the state", "a trace"), or raise `CorruptRecord`."""
    try:
        value = json.loads(body)
    except ValueError as exc:
        value = exc
    if not isinstance(value, dict):
        raise CorruptRecord.unreadable(backend, key, what, value)
    return value


def encode_state(session: Session) -> str:
    return dump_json(session.state_to_json())


def decode_state(backend: str, key: SessionKey, body: str | bytes) -> dict[str, Any]:
    return decode_object(backend, key, body, "the state")


def encode_trace(trace: dict[str, Any]) -> str:
    return dump_json(trace)


def decode_trace(backend: str, key: SessionKey, body: str | bytes) -> dict[str, Any]:
    return decode_object(backend, key, body, "a trace")


def checkpoint_past_end(backend: str, key: SessionKey, seq: int, last: int) -> UsageError:
    return UsageError(f"{backend} store: a checkpoint of {key} cannot cover sequence {seq}: the log ends at {last}")


def encode_batch(messages: Sequence[Message], *, compact: bool = False) -> list[tuple[str, str]]:
    """Encode a batch to append as ``(id, body)`` pairs (its ids were checked by `SessionStore.append`)."""
    return [(m.id, encode_message(m, compact=compact)) for m in messages]


def _indexed_ids(messages: list[Message], ids: Sequence[str | None]) -> bool:
    """Whether each message has the id its row is indexed under (None: the backend keeps no separate id)."""
    if [m.id for m in messages] == ids:
        return True
    return all(mid is None or m.id == mid for m, mid in zip(messages, ids, strict=True))


def make_page(backend: str, key: SessionKey, end: int, after: int | None,
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
    first = int(rows[0][0]) if rows else max(end, after or 0) + 1
    return MessagePage(messages, first, first > 1)
