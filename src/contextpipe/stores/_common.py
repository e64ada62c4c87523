"""Pieces every store backend shares.

The lease check and the JSON of states and traces with corruption errors (the contract's checks and the
translation of driver errors are done once, by `SessionStore`'s public methods). The message rows of
the durable backends are in `_rows`: this module loads no codec.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from ..errors import CorruptRecord, LeaseLost, SessionBusy, UsageError
from ..session import Session, SessionKey
from .base import Lease

SCHEMA_VERSION: Final = 5
"""Version of the durable layout (tables, keys) written by this release (SQLite has its own, see `SQLiteStore`).

3 adds the outbox table (`contextpipe.stores._outbox`), 5 the artifact table (`contextpipe.stores._artifacts`)."""

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


def decode_object(backend: str, key: SessionKey, body: str | bytes, what: str) -> dict[str, Any]:
    """Decode a stored JSON object (`what`: "the state", "a trace"), or raise `CorruptRecord`."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # (nested too deeply: RecursionError)
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
