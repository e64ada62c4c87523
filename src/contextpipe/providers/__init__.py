"""Context providers: the base classes and the built-ins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import ContextProvider, HistoryProvider, MessageFilter
from .compaction import Compaction
from .facts import FactMemory
from .history import History
from .memory import SemanticMemory
from .search import SearchResult, TextSearch
from .skills import ScriptRequest, Skill, SkillProblem, Skills

if TYPE_CHECKING:
    from .mcp import HttpServer, McpTools, StdioServer

__all__ = [
    "Compaction",
    "ContextProvider",
    "FactMemory",
    "History",
    "HistoryProvider",
    "HttpServer",
    "McpTools",
    "MessageFilter",
    "ScriptRequest",
    "SearchResult",
    "SemanticMemory",
    "Skill",
    "SkillProblem",
    "Skills",
    "StdioServer",
    "TextSearch",
]


def __getattr__(name: str) -> object:
    if name in ("McpTools", "StdioServer", "HttpServer"):
        from . import mcp

        return getattr(mcp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
