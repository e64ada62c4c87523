"""API keys: each maps to one tenant, and may speak for users; only their SHA-256 hashes are kept.

A keys file has one key per line, ``TENANT sha256:HEX`` (blank lines and ``#`` comments are
ignored); the environment variable ``CONTEXTPIPE_API_KEYS`` holds the same entries separated by
commas. A third field says which users a key's requests are for (memories and facts are kept per
user): ``user=ID`` binds the key to one user (an app's key per user), ``users=any`` lets its
requests name their user (``"user_id"`` in the body: a trusted back end serving many users);
without it, requests are for no user. `new_key` makes a key and the line to store for it:

>>> key, line = new_key("acme")
>>> keys = ApiKeys.parse(line)
>>> keys.tenant_for(key)
'acme'
>>> keys.tenant_for("cp_wrong") is None
True
>>> ApiKeys.parse(line + " user=alice").grant_for(key)
Grant(tenant='acme', user='alice', names_users=False)
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..errors import UsageError
from ..session import validate_tenant

__all__ = ["ENV_KEYS", "USER_ID", "ApiKeys", "Grant", "hash_key", "new_key"]

ENV_KEYS: Final = "CONTEXTPIPE_API_KEYS"
"""Environment variable holding ``TENANT sha256:HEX`` entries separated by commas."""

_HASH_RE: Final = re.compile(r"^sha256:([0-9a-f]{64})$")
USER_ID: Final = r"^[A-Za-z0-9][A-Za-z0-9._:@/=+-]{0,199}$"
"""A user id a key or a request names: 1-200 letters, digits and . _ : @ / = + -, starting with a letter or digit."""


@dataclass(frozen=True, slots=True)
class Grant:
    """What one API key may do: the tenant it reaches, and the users its requests are for."""

    tenant: str
    user: str | None = None
    """The user every request of the key is for (``user=ID``); None: the key is bound to no user."""
    names_users: bool = False
    """True when the key's requests may name their user (``users=any``)."""

    def __post_init__(self) -> None:
        validate_tenant(self.tenant)
        if self.user is not None and not re.fullmatch(USER_ID, self.user):
            raise UsageError(f"user id {self.user!r} of a key for tenant {self.tenant!r}: use 1-200 letters, digits "
                             "and . _ : @ / = + -, starting with a letter or digit")
        if self.user is not None and self.names_users:
            raise UsageError(f"a key for tenant {self.tenant!r} is bound to user {self.user!r} and may not also name "
                             "users: give it user=ID or users=any, not both")


def _grant(tenant: str, users: str | None) -> Grant:
    """Return the grant of a keys file entry whose third field is `users` (``user=ID``, ``users=any``, or none)."""
    if users is None:
        return Grant(tenant)
    if users == "users=any":
        return Grant(tenant, names_users=True)
    if users.startswith("user="):
        return Grant(tenant, users[5:])
    raise UsageError(f"expected 'user=ID' or 'users=any' after the key's hash, got {users!r}")


def hash_key(key: str) -> str:
    """Return the stored form of `key`: ``sha256:`` and the hex digest."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key(tenant: str) -> tuple[str, str]:
    """Return a new random key for `tenant` and the ``TENANT sha256:HEX`` line that grants it."""
    validate_tenant(tenant)
    key = "cp_" + secrets.token_urlsafe(32)
    return key, f"{tenant} {hash_key(key)}"


class ApiKeys:
    """Hashed API keys, each mapped to a tenant."""

    def __init__(self, entries: Iterable[tuple[str, str]] = ()) -> None:
        self._grants: dict[str, Grant] = {}
        for tenant, hashed in entries:
            self.add_hashed(hashed, Grant(tenant))

    def add_hashed(self, hashed: str, grant: Grant) -> None:
        """Grant the key whose stored form (`hash_key`) is `hashed`."""
        if not _HASH_RE.match(hashed):
            raise UsageError(f"key hash {hashed!r} for tenant {grant.tenant!r} is not 'sha256:' and 64 hex digits; "
                             "make keys with: contextpipe serve --new-key TENANT")
        self._grants[hashed] = grant

    def __len__(self) -> int:
        return len(self._grants)

    def add(self, tenant: str, key: str, *, user: str | None = None, names_users: bool = False) -> None:
        """Grant the plain `key` access to `tenant`, for `user` or naming users (see `Grant`); it is hashed at once."""
        self._grants[hash_key(key)] = Grant(tenant, user, names_users)

    def grant_for(self, key: str) -> Grant | None:
        """Return what `key` may do, or None for an unknown key."""
        return self._grants.get(hash_key(key))

    def tenant_for(self, key: str) -> str | None:
        """Return the tenant `key` belongs to, or None for an unknown key."""
        grant = self.grant_for(key)
        return grant.tenant if grant is not None else None

    @classmethod
    def parse(cls, text: str, *, origin: str = "keys") -> ApiKeys:
        """Read ``TENANT sha256:HEX [user=ID | users=any]`` entries, one per line or separated by commas."""
        keys = cls()
        for number, raw in enumerate(re.split(r"[\n,]", text), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) not in (2, 3):
                raise UsageError(f"{origin}, entry {number}: expected 'TENANT sha256:HEX' (and 'user=ID' or "
                                 f"'users=any'), got {line!r}")
            try:
                keys.add_hashed(fields[1], _grant(fields[0], fields[2] if len(fields) == 3 else None))
            except UsageError as exc:
                raise UsageError(f"{origin}, entry {number}: {exc}") from None
        return keys

    @classmethod
    def load(cls, path: str | Path | None = None, *, environ: dict[str, str] | None = None) -> ApiKeys:
        """Read keys from the file `path` (if given) and from ``$CONTEXTPIPE_API_KEYS``."""
        env = os.environ if environ is None else environ
        keys = cls()
        if path is not None:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as exc:
                raise UsageError(f"cannot read the API keys file {path}: {exc.strerror}") from None
            keys._grants.update(cls.parse(text, origin=str(path))._grants)
        if env.get(ENV_KEYS):
            keys._grants.update(cls.parse(env[ENV_KEYS], origin=f"${ENV_KEYS}")._grants)
        return keys
