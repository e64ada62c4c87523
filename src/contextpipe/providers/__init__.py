"""Context providers: the base classes and the built-ins."""

from __future__ import annotations

from .base import ContextProvider, HistoryProvider, MessageFilter
from .compaction import Compaction
from .history import History

__all__ = ["Compaction", "ContextProvider", "History", "HistoryProvider", "MessageFilter"]
