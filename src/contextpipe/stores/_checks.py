"""The `SessionStore` contract's checks, and the one translation of driver errors.

`SessionStore`'s public methods validate their arguments here (keys, limits, batches, cursors)
before calling a backend, and turn what a driver raises into a `StoreError` (`to_store_error`).
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Sequence
from typing import Any

from ..errors import ContextPipeError, StoreError, UsageError, shorten
from ..session import SessionKey

__all__ = ["check_limit", "decode_cursor", "duplicate_in_batch", "encode_cursor", "kept_ranges", "key_and_limit",
           "key_of", "not_empty", "to_store_error"]

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
        raise _bad_limit(limit)


def key_and_limit(tenant: str, session_id: str, limit: int | None) -> SessionKey:
    """Return the validated key (`key_of`), after which `limit` is checked (`check_limit`)."""
    key = key_of(tenant, session_id)
    if limit is not None and limit < 1:
        raise _bad_limit(limit)
    return key


def check_bounds(before: int | None, after: int | None) -> None:
    """Refuse a `before` or `after` bound of `SessionStore.load` that is no sequence (one below 0, a bool, a float)."""
    for name, bound in (("before", before), ("after", after)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
            raise UsageError(f"{name} must be a sequence number (an int of at least 0) or None, got {bound!r}")


def _bad_limit(limit: int) -> UsageError:
    return UsageError(f"limit must be at least 1 (or None for no limit), got {limit}")


def duplicate_in_batch(key: SessionKey) -> UsageError:
    return UsageError(f"{key}: the batch to append repeats a message id")


def kept_ranges(upto: int, skip: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Return the inclusive ranges of 1 to `upto` outside the `skip` ranges, in order (`SessionStore.copy_view`)."""
    if type(upto) is not int or upto < 0:
        raise UsageError(f"upto must be a log sequence of 0 or more, got {upto!r}")
    kept: list[tuple[int, int]] = []
    start = 1
    for lo, hi in sorted(skip):
        if type(lo) is not int or type(hi) is not int or lo > hi:
            raise UsageError(f"each range to skip must be (first, last) sequences with first <= last, got {(lo, hi)!r}")
        if lo > start:
            kept.append((start, min(lo - 1, upto)))
        start = max(start, hi + 1)
    kept.append((start, upto))
    return [(lo, hi) for lo, hi in kept if lo <= hi]


def not_empty(target: SessionKey, last: int) -> UsageError:
    """Return the error of a copy (`SessionStore.copy_view`) into a log that has `last` messages already."""
    return UsageError(f"cannot copy into {target.tenant}/{target.id}: its log has {last} messages already; "
                      "copy into a new session")


def encode_cursor(updated_at: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, session_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        value: Any = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return float(value[0]), str(value[1])
    except (ValueError, TypeError, IndexError) as exc:
        raise UsageError(f"invalid cursor {shorten(cursor)}: pass the next_cursor of the previous page") from exc


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
