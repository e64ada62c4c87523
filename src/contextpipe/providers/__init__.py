"""Context providers: the base classes and the built-ins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .base import ContextProvider, HistoryProvider, LoadedHistory, MessageFilter, external_input
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
    "LoadedHistory",
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
    "external_input",
]


__getattr__ = lazy_exports(__name__, dict.fromkeys(("McpTools", "StdioServer", "HttpServer"), ".mcp"))
