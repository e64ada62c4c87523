"""Which user a request is for: the user its API key is bound to, or the one it names when its key may.

A key's `Grant` says which (``user=ID``, ``users=any`` or neither, in the keys file). A session
belongs to the user a session create or a run first names for it (`contextpipe.session.user_id`,
kept in its state), so `SemanticMemory` and `FactMemory` keep that user's memories across all of
the user's sessions. A key bound to a user reaches only that user's sessions (any other is "not
found", as a session of another tenant is); a run that names another user than the session's is
refused, never moved to the other user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..session import Session, set_user_id, user_id
from ._json import HTTPError
from ._keys import Grant

if TYPE_CHECKING:
    from ..stores import SessionStore

__all__ = ["claim", "reaches", "request_user", "reuse", "visible"]


def request_user(grant: Grant, named: str | None, field: str = "user_id") -> str | None:
    """Return the user a request of `grant` is for, given the user it `named` in `field` (None: none named).

    Raises a 403 `HTTPError` when the key may not name that user.
    """
    if named is None or named == grant.user:
        return grant.user
    if grant.user is not None:
        raise HTTPError(403, "Forbidden", f"this API key is for user {grant.user!r} and cannot act for "
                        f"{named!r}: leave {field} out, or use a key granted 'users=any' in the keys file")
    if not grant.names_users:
        raise HTTPError(403, "Forbidden", f"this API key may not name users: leave {field} out, or grant the key "
                        "'users=any' (a back end serving many users) or 'user=ID' in the keys file")
    return named


async def claim(store: SessionStore, session: Session, user: str | None, *, wait: float = 0.0) -> None:
    """Make `session` belong to `user` if it belongs to no one yet, saved in `store` before any run on it starts.

    Raises a 409 `HTTPError` when it belongs to another user. Saved at once, not with a run's
    state: a run starts from the state stored under its lease, and two requests naming different
    users for the same new session must not both win. The user is given under the session's
    lease (waiting up to `wait` seconds for a run that holds it), to the session as stored then:
    one deleted and made again under its id since `session` was read (another user's, perhaps,
    at the same version) is not this request's, and is answered 404. `session` then holds the
    stored state and version.
    """
    if user is None:
        return
    owner = user_id(session)
    if owner == user:
        return
    if owner is not None:
        raise _mismatch(session, owner, user)
    lease = await store.acquire_lease(session.tenant, session.id, "contextpipe-serve-claim", ttl=10, wait=wait)
    try:
        stored = await store.get_session(session.tenant, session.id)
        if stored is None or stored.created_at != session.created_at:
            raise HTTPError(404, "NotFound", f"no session {session.id!r}: it was deleted (or expired) meanwhile")
        owner = user_id(stored)
        if owner is None:
            set_user_id(stored, user)
            await store.save_session(stored, lease=lease)
        elif owner != user:
            raise _mismatch(stored, owner, user)
        session.state, session.version = stored.state, stored.version
    finally:
        await store.release_lease(lease)


def _mismatch(session: Session, owner: str, user: str) -> HTTPError:
    return HTTPError(409, "UserMismatch", f"session {session.id!r} belongs to user {owner!r}, not {user!r}: "
                     "a session keeps one user; create another session for this user")


async def reuse(store: SessionStore, grant: Grant, session: Session, user: str | None) -> Session:
    """Return the existing session a create names: the caller's, given to `user` if it belonged to no one."""
    if not visible(grant, session):
        raise HTTPError(409, "Conflict", f"session {session.id!r} exists and is not this key's user's: choose "
                        "another id")
    await claim(store, session, user)
    return session


async def reaches(store: SessionStore, grant: Grant, tenant: str, session_id: str) -> bool:
    """Tell whether a request of `grant` reaches session `session_id` (a key bound to a user: its user's only)."""
    if grant.user is None:
        return True
    session = await store.get_session(tenant, session_id)
    return session is not None and visible(grant, session)


def visible(grant: Grant, session: Session) -> bool:
    """Tell whether a request of `grant` may reach `session`: any session of its tenant, or its user's only."""
    return grant.user is None or user_id(session) == grant.user
