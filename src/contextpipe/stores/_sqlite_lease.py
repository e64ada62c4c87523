"""How `SQLiteStore` keeps a session's lease in its ``cp_sessions`` row: take, renew, give back.

Each function runs inside the store's write transaction (the caller opens it) at the store's
clock reading `now`. A lease that looks live is bounded by its ttl from `now` (`held_expiry`), so
a clock stepped back blocks a session for at most one ttl; a session's expiry moves with its
lease, so a session never expires while a run holds it.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from ..session import SessionKey
from . import _common as common
from .base import Lease

__all__ = ["acquire", "held_expiry", "is_live", "release", "renew"]

_EXPIRY: Final = "CASE WHEN ttl IS NULL THEN NULL ELSE max(? + ttl, ?) END"
"""A session's expiry at ``?`` (now) while a lease is held until the second ``?``: its TTL from now, never before."""


def is_live(row: sqlite3.Row, now: float) -> bool:
    """Whether the session `row` is held by a lease that has not expired at `now`."""
    return row["lease_owner"] is not None and row["lease_expires"] > now


def held_expiry(conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row, now: float) -> float:
    """Return the expiry of the lease `row` holds, bounded by its ttl from `now` (and stored so).

    Only a lease that looks live is read further: a clock stepped back made it look so for longer
    than its ttl allows (`_common.bounded_expiry`).
    """
    expires = float(row["lease_expires"])
    if not is_live(row, now):
        return expires
    k = (key.tenant, key.id)
    ttl = conn.execute("SELECT lease_ttl FROM cp_sessions WHERE tenant = ? AND session_id = ?", k).fetchone()[0]
    bounded = common.bounded_expiry(expires, ttl, now)
    if bounded < expires:
        conn.execute("UPDATE cp_sessions SET lease_expires = ? WHERE tenant = ? AND session_id = ?", (bounded, *k))
    return bounded


def acquire(conn: sqlite3.Connection, key: SessionKey, row: sqlite3.Row | None, owner: str, ttl: float,
            now: float) -> Lease | None:
    """Take the lease of the session `row` (None: a session not stored yet) for `owner`; None if another holds it."""
    if row is None:
        conn.execute("INSERT INTO cp_sessions (tenant, session_id, created_at, updated_at) VALUES (?, ?, ?, ?)",
                     (key.tenant, key.id, now, now))
        token = 0
    elif not common.lease_is_free(row["lease_owner"], held_expiry(conn, key, row, now), now, owner):
        return None
    else:
        token = int(row["lease_token"])
    conn.execute("UPDATE cp_sessions SET lease_owner = ?, lease_token = ?, lease_expires = ?, lease_ttl = ?, "
                 f"expires_at = {_EXPIRY} WHERE tenant = ? AND session_id = ?",
                 (owner, token + 1, now + ttl, ttl, now, now + ttl, key.tenant, key.id))
    return Lease(key.tenant, key.id, owner, token + 1, now + ttl, ttl)


def renew(conn: sqlite3.Connection, backend: str, lease: Lease, now: float) -> Lease:
    """Extend `lease` by its ttl from `now`; raises `LeaseLost` if it was taken over or its session is gone."""
    expires = now + lease.ttl
    k = (lease.tenant, lease.session_id)
    # The session's expiry moves with its lease, so a session never expires while a run holds it.
    updated = conn.execute(
        f"UPDATE cp_sessions SET lease_expires = ?, lease_ttl = ?, expires_at = {_EXPIRY} WHERE tenant = ? "
        "AND session_id = ? AND lease_token = ? AND lease_owner = ? AND (expires_at IS NULL OR expires_at > ?)",
        (expires, lease.ttl, now, expires, *k, lease.token, lease.owner, now)).rowcount
    if not updated:
        current = conn.execute("SELECT lease_token FROM cp_sessions WHERE tenant = ? AND session_id = ? "
                               "AND (expires_at IS NULL OR expires_at > ?)", (*k, now)).fetchone()
        raise common.lease_lost(backend, lease.key, lease, None if current is None else current[0], now)
    return lease.renewed(expires)


def release(conn: sqlite3.Connection, lease: Lease) -> None:
    """Give `lease` back (nothing happens if it was taken over meanwhile)."""
    conn.execute("UPDATE cp_sessions SET lease_owner = NULL, lease_expires = 0 WHERE tenant = ? "
                 "AND session_id = ? AND lease_token = ? AND lease_owner = ?",
                 (lease.tenant, lease.session_id, lease.token, lease.owner))
