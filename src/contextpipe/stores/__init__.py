"""Session stores: the durable log of sessions behind one `SessionStore` contract.

``import contextpipe.stores`` loads no database driver; each backend loads its own on first use.
"""

from __future__ import annotations

from .base import Lease, MessagePage, SessionInfo, SessionListing, SessionStore
from .memory import MemoryStore

__all__ = ["Lease", "MemoryStore", "MessagePage", "SessionInfo", "SessionListing", "SessionStore"]
