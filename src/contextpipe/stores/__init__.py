"""Session stores: the durable log of sessions behind one `SessionStore` contract.

`SQLiteStore` (embedded default), `PostgresStore` (many workers, many machines), `RedisStore`
(low latency, TTL-heavy) and `MemoryStore` (in process). ``import contextpipe.stores`` loads no
database driver: each backend is imported, with its driver, when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import (
    Checkpoint,
    Lease,
    MessagePage,
    SessionDeletedHook,
    SessionInfo,
    SessionKey,
    SessionListing,
    SessionStore,
)
from .memory import MemoryStore

if TYPE_CHECKING:
    from .postgres import PostgresStore
    from .redis import RedisStore
    from .sqlite import SQLiteStore

__all__ = [
    "Checkpoint",
    "Lease",
    "MemoryStore",
    "MessagePage",
    "PostgresStore",
    "RedisStore",
    "SQLiteStore",
    "SessionDeletedHook",
    "SessionInfo",
    "SessionKey",
    "SessionListing",
    "SessionStore",
]

_LAZY = {"SQLiteStore": ".sqlite", "PostgresStore": ".postgres", "RedisStore": ".redis"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
