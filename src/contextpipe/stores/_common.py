"""Pieces every store backend shares: row codec with corruption errors, cursors, error wording."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, ParamSpec, TypeVar

from ..errors import (
    CodecError,
    ConcurrentUpdate,
    ContextPipeError,
    CorruptRecord,
    LeaseLost,
    SessionBusy,
    StoreError,
    UsageError,
)
from ..messages import Message, dumps, loads
from ..session import Session, validate_session_id, validate_tenant
from .base import Checkpoint, Lease, MessagePage

SCHEMA_VERSION: Final = 2
"""Version of the durable layout (tables, keys) written by this release."""


def check_key(tenant: str, session_id: str) -> None:
    """Validate a tenant and session id (length, characters) with a clear error."""
    validate_tenant(tenant)
    validate_session_id(session_id)


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UsageError(f"limit must be at least 1 (or None for no limit), got {limit}")


def decode_message(backend: str, tenant: str, session_id: str, seq: int, body: str | bytes,
                   message_id: str | None = None) -> Message:
    """Decode a stored message, raising `CorruptRecord` that names the session and sequence."""
    try:
        message = loads(body)
    except CodecError as exc:
        raise CorruptRecord(
            f"{backend} store: message {seq} of session {session_id!r} (tenant {tenant!r}) cannot be read: {exc}",
            backend=backend, tenant=tenant, session_id=session_id, sequence=seq,
        ) from exc
    if message_id is not None and message.id != message_id:
        raise CorruptRecord(
            f"{backend} store: message {seq} of session {session_id!r} (tenant {tenant!r}) has id "
            f"{message.id!r} but is indexed as {message_id!r}",
            backend=backend, tenant=tenant, session_id=session_id, sequence=seq,
        )
    return message


def encode_checkpoint(checkpoint: Checkpoint) -> str:
    return json.dumps({"seq": checkpoint.seq, "created_at": checkpoint.created_at,
                       "summary": json.loads(dumps(checkpoint.summary))}, separators=(",", ":"), ensure_ascii=False)


def decode_checkpoint(backend: str, tenant: str, session_id: str, body: str | bytes) -> Checkpoint:
    try:
        data = json.loads(body)
        return Checkpoint(int(data["seq"]), loads(json.dumps(data["summary"])), float(data["created_at"]))
    except (ValueError, KeyError, TypeError, CodecError) as exc:
        raise CorruptRecord(
            f"{backend} store: a checkpoint of session {session_id!r} (tenant {tenant!r}) cannot be read: {exc}",
            backend=backend, tenant=tenant, session_id=session_id,
        ) from exc


def decode_object(backend: str, tenant: str, session_id: str, body: str | bytes, what: str) -> dict[str, Any]:
    """Decode a stored JSON object (`what`: "the state", "a trace"), or raise `CorruptRecord`."""
    try:
        value = json.loads(body)
    except ValueError as exc:
        value = exc
    if not isinstance(value, dict):
        raise CorruptRecord(
            f"{backend} store: {what} of session {session_id!r} (tenant {tenant!r}) cannot be read: {value}",
            backend=backend, tenant=tenant, session_id=session_id,
        )
    return value


def decode_state(backend: str, tenant: str, session_id: str, body: str | bytes) -> dict[str, Any]:
    return decode_object(backend, tenant, session_id, body, "the state")


def encode_cursor(updated_at: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, session_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        value: Any = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(value[0]), str(value[1])
    except (ValueError, TypeError, IndexError) as exc:
        raise UsageError(f"invalid cursor {cursor!r}: pass the next_cursor of the previous page") from exc


def busy(backend: str, tenant: str, session_id: str) -> SessionBusy:
    return SessionBusy(
        f"session {session_id!r} (tenant {tenant!r}) is busy: a run holds its lease; wait for it to finish, "
        "or pass lease_wait=<seconds> to wait for it",
        backend=backend, tenant=tenant, session_id=session_id,
    )


def lease_lost(backend: str, lease: Lease, current: int | None) -> LeaseLost:
    now = f" (current token {current})" if current is not None else ""
    return LeaseLost(
        f"session {lease.session_id!r} (tenant {lease.tenant!r}): this run's lease (token {lease.token}) expired "
        f"and was taken over{now}; its writes are refused so runs never interleave",
        backend=backend, tenant=lease.tenant, session_id=lease.session_id,
    )


def concurrent_update(backend: str, tenant: str, session_id: str, stored: int, mine: int) -> ConcurrentUpdate:
    return ConcurrentUpdate(
        f"session {session_id!r} (tenant {tenant!r}) was changed elsewhere (stored version {stored}, this copy "
        f"has {mine}); reload it with agent.session(...) and apply the change again",
        backend=backend, tenant=tenant, session_id=session_id,
    )


def checkpoint_past_end(backend: str, tenant: str, session_id: str, seq: int, last: int) -> UsageError:
    return UsageError(
        f"{backend} store: a checkpoint of session {session_id!r} (tenant {tenant!r}) cannot cover sequence "
        f"{seq}: the log ends at {last}"
    )


def duplicate_in_batch(session_id: str) -> UsageError:
    return UsageError(f"session {session_id!r}: the batch to append repeats a message id")


def encode_state(session: Session) -> str:
    return json.dumps(session.state_to_json(), separators=(",", ":"), ensure_ascii=False)


def make_page(backend: str, tenant: str, session_id: str, end: int, after: int | None,
              rows: Sequence[tuple[int, str, str | bytes]]) -> MessagePage:
    """Build a page from ``(seq, message_id, body)`` rows in sequence order.

    `end` is the last sequence of the requested range; when no row matched, the page starts one
    past it. Sequences are contiguous from 1, so older messages exist exactly when the page does
    not start at 1.
    """
    try:
        decoded = [loads(body) for _, _, body in rows]
    except CodecError:
        decoded = None
    if decoded is None or any(mid is not None and m.id != mid for m, (_, mid, _) in zip(decoded, rows, strict=True)):
        # Name the first record that cannot be read (the fast path above does not say which).
        decoded = [decode_message(backend, tenant, session_id, int(seq), body, mid) for seq, mid, body in rows]
    messages = decoded
    first = int(rows[0][0]) if rows else max(end, after or 0) + 1
    return MessagePage(messages, first, first > 1)


P = ParamSpec("P")
R = TypeVar("R")


def translate_errors(
    backend: str, driver: str
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Wrap a store method so that driver and network errors surface as `StoreError`.

    Driver errors are exceptions defined in package `driver`; contextpipe's own errors pass through.
    """

    def decorate(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return await fn(*args, **kwargs)
            except ContextPipeError:
                raise
            except Exception as exc:
                if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] == driver:
                    raise StoreError(f"{backend} store: {type(exc).__name__}: {exc}", backend=backend) from exc
                raise

        return wrapper

    return decorate


def encode_trace(trace: dict[str, Any]) -> str:
    return json.dumps(trace, separators=(",", ":"), ensure_ascii=False, default=str)


def decode_trace(backend: str, tenant: str, session_id: str, body: str | bytes) -> dict[str, Any]:
    return decode_object(backend, tenant, session_id, body, "a trace")
