"""Pieces every store backend shares.

Keys, the lease check, the row codec with corruption errors, cursors and the one translation of driver
errors into `StoreError`.
"""

from __future__ import annotations

import base64
import functools
import json
import operator
import re
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

from ..codec import dumps
from ..errors import (
    CodecError,
    ContextPipeError,
    CorruptRecord,
    LeaseLost,
    SessionBusy,
    StoreError,
    UsageError,
)
from ..messages import Message
from ..session import Session, SessionKey
from ._fastdecode import dumps_compact, loads_arrays, loads_many, loads_stored
from .base import Checkpoint, Lease, MessagePage, SessionStore

SCHEMA_VERSION: Final = 2
"""Version of the durable layout (tables, keys) written by this release (SQLite has its own, see `SQLiteStore`)."""

_SURROGATE: Final = re.compile("[\ud800-\udfff]")


_known_key = functools.lru_cache(maxsize=4096)(SessionKey)


def key_of(tenant: str, session_id: str) -> SessionKey:
    """Return the validated key of a session (`UsageError` naming what is allowed otherwise).

    Keys are immutable and a run makes several store calls on one session: the latest few thousand
    are kept, so each is validated once rather than on every call.
    """
    if type(tenant) is str and type(session_id) is str:
        return _known_key(tenant, session_id)
    return SessionKey(tenant, session_id)


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UsageError(f"limit must be at least 1 (or None for no limit), got {limit}")


def check_lease(backend: str, key: SessionKey, lease: Lease | None, owner: str | None, token: int,
                expires: float, now: float) -> None:
    """Make the write check of every backend (Redis makes it in Lua).

    `lease` must be the current one; with none, no unexpired lease may be held.
    """
    if lease is not None:
        if lease.token != token or lease.owner != owner:
            raise LeaseLost.taken_over(backend, key, lease.token, token)
    elif owner is not None and expires > now:
        raise SessionBusy.held(backend, key)


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
                                       f"it has id {message.id!r} but is indexed as {message_id!r}", seq)
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


def encode_cursor(updated_at: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, session_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        value: Any = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(value[0]), str(value[1])
    except (ValueError, TypeError, IndexError) as exc:
        raise UsageError(f"invalid cursor {cursor!r}: pass the next_cursor of the previous page") from exc


def checkpoint_past_end(backend: str, key: SessionKey, seq: int, last: int) -> UsageError:
    return UsageError(f"{backend} store: a checkpoint of {key} cannot cover sequence {seq}: the log ends at {last}")


def duplicate_in_batch(key: SessionKey) -> UsageError:
    return UsageError(f"{key}: the batch to append repeats a message id")


def check_batch(key: SessionKey, messages: Sequence[Message], *, compact: bool = False) -> list[tuple[str, str]]:
    """Encode a batch to append as ``(id, body)`` pairs; a batch repeating an id is a `UsageError`."""
    encoded = [(m.id, encode_message(m, compact=compact)) for m in messages]
    if len({mid for mid, _ in encoded}) != len(encoded):
        raise duplicate_in_batch(key)
    return encoded


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


@dataclass(frozen=True, slots=True)
class JoinedRows:
    """Consecutive messages of a log read as one value instead of one row each (see `joined_part`)."""

    first_seq: int
    """Sequence of the first message."""
    count: int
    """How many messages (sequences ``first_seq`` to ``first_seq + count - 1``, checked by the reader)."""
    bodies: bytes
    """Their stored bodies as one JSON array in UTF-8: ``"[" + ",".join(bodies) + "]"``, in sequence order."""
    ids: str
    """The ids their rows are indexed under, joined by NUL characters."""


_message_id: Final = operator.attrgetter("id")


def joined_part(piece: JoinedRows) -> list[Message] | None:
    """Decode one piece of a log read as `JoinedRows`, or return None when the log must be read row by row.

    Each body is one JSON value, so a piece decodes to exactly `count` messages whose ids are the
    indexed ones. Anything else (a damaged body, a body that is not one JSON value, a mismatched id,
    an id holding a NUL) returns None: the caller reads the rows one by one, and `make_page` names the
    first that cannot be read, as it always has.
    """
    try:
        [part] = loads_arrays([piece.bodies])
    except CodecError:
        return None
    if len(part) != piece.count:
        return None
    ids = "\0".join(map(_message_id, part))
    # Equal texts with count - 1 separators: neither side has a NUL inside an id, so the ids are equal.
    if ids != piece.ids or ids.count("\0") != piece.count - 1:
        return None
    return part


# --- the one translation of driver and network errors --------------------------------------------------


def to_store_error(exc: BaseException, *, backend: str, server: str, driver: str,
                   timeout: float | None = None) -> StoreError | None:
    """Return the `StoreError` standing for `exc`, or None when `exc` is not a driver or network error.

    contextpipe's own errors, cancellation and programming errors pass through unchanged. Timeouts
    (the builtin one or the driver's) say which server did not answer; every other error of the
    driver package `driver`, of the network (`OSError`) or of text encoding becomes a `StoreError`.
    """
    if isinstance(exc, ContextPipeError) or not isinstance(exc, Exception):
        return None
    from_driver = type(exc).__module__.split(".")[0] == driver
    if isinstance(exc, TimeoutError) or (from_driver and type(exc).__name__ == "TimeoutError"):
        if timeout is not None:
            return StoreError.unreachable(backend, server, timeout, "waiting for an answer")
        return StoreError.from_driver(backend, server, exc)
    if from_driver or isinstance(exc, OSError | UnicodeError | EOFError):
        return StoreError.from_driver(backend, server, exc)
    return None


S = TypeVar("S", bound=SessionStore)
P = ParamSpec("P")
R = TypeVar("R")


def translated(fn: Callable[Concatenate[S, P], Coroutine[Any, Any, R]]
               ) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Wrap a store method so that driver and network errors surface as `StoreError` (`to_store_error`)."""

    @functools.wraps(fn)
    async def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(self, *args, **kwargs)
        except Exception as exc:
            error = to_store_error(exc, backend=self.backend, server=self.server, driver=self.driver,
                                   timeout=self.answer_timeout)
            if error is None:
                raise
            raise error from exc

    return wrapper
