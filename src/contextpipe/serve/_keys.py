"""API keys: each maps to one tenant; only their SHA-256 hashes are kept.

A keys file has one key per line, ``TENANT sha256:HEX`` (blank lines and ``#`` comments are
ignored); the environment variable ``CONTEXTPIPE_API_KEYS`` holds the same entries separated by
commas. `new_key` makes a key and the line to store for it:

>>> key, line = new_key("acme")
>>> keys = ApiKeys.parse(line)
>>> keys.tenant_for(key)
'acme'
>>> keys.tenant_for("cp_wrong") is None
True
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from ..errors import UsageError
from ..session import validate_tenant

__all__ = ["ENV_KEYS", "ApiKeys", "hash_key", "new_key"]

ENV_KEYS: Final = "CONTEXTPIPE_API_KEYS"
"""Environment variable holding ``TENANT sha256:HEX`` entries separated by commas."""

_HASH_RE: Final = re.compile(r"^sha256:([0-9a-f]{64})$")


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
        self._tenants: dict[str, str] = {}
        for tenant, hashed in entries:
            validate_tenant(tenant)
            if not _HASH_RE.match(hashed):
                raise UsageError(f"key hash {hashed!r} for tenant {tenant!r} is not 'sha256:' and 64 hex digits; "
                                 "make keys with: contextpipe serve --new-key TENANT")
            self._tenants[hashed] = tenant

    def __len__(self) -> int:
        return len(self._tenants)

    def add(self, tenant: str, key: str) -> None:
        """Grant the plain `key` access to `tenant` (it is hashed at once)."""
        validate_tenant(tenant)
        self._tenants[hash_key(key)] = tenant

    def tenant_for(self, key: str) -> str | None:
        """Return the tenant `key` belongs to, or None for an unknown key."""
        return self._tenants.get(hash_key(key))

    @classmethod
    def parse(cls, text: str, *, origin: str = "keys") -> ApiKeys:
        """Read ``TENANT sha256:HEX`` entries, one per line or separated by commas."""
        entries = []
        for number, raw in enumerate(re.split(r"[\n,]", text), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            if len(fields) != 2:
                raise UsageError(f"{origin}, entry {number}: expected 'TENANT sha256:HEX', got {line!r}")
            entries.append((fields[0], fields[1]))
        try:
            return cls(entries)
        except UsageError as exc:
            raise UsageError(f"{origin}: {exc}") from None

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
            keys._tenants.update(cls.parse(text, origin=str(path))._tenants)
        if env.get(ENV_KEYS):
            keys._tenants.update(cls.parse(env[ENV_KEYS], origin=f"${ENV_KEYS}")._tenants)
        return keys
