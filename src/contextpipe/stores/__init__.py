"""Session stores: the durable log of sessions behind one `SessionStore` contract.

`SQLiteStore` (embedded default), `PostgresStore` (many workers, many machines), `RedisStore`
(low latency, TTL-heavy) and `MemoryStore` (in process). ``import contextpipe.stores`` loads no
database driver: each backend is imported, with its driver, when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .base import (
    Checkpoint,
    Erased,
    Lease,
    MessagePage,
    OutboxEntry,
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
    "Erased",
    "Lease",
    "MemoryStore",
    "MessagePage",
    "OutboxEntry",
    "PostgresStore",
    "RedisStore",
    "SQLiteStore",
    "SessionDeletedHook",
    "SessionInfo",
    "SessionKey",
    "SessionListing",
    "SessionStore",
]

__getattr__ = lazy_exports(__name__, {"SQLiteStore": ".sqlite", "PostgresStore": ".postgres", "RedisStore": ".redis"})
