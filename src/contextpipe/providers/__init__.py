"""Context providers: the base classes and the built-ins.

The built-ins are imported when first named, so an agent that uses none of them (or only `History`)
does not load the others (the skills' file handling, the memories' vector types, MCP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .base import ContextProvider, HistoryProvider, LoadedHistory, MessageFilter, external_input

if TYPE_CHECKING:
    from ..budget import ContextBudget
    from .artifacts import Artifacts
    from .compaction import Compaction
    from .facts import Fact, FactMemory
    from .history import History
    from .mcp import HttpServer, McpTools, StdioServer
    from .memory import SemanticMemory
    from .message import MessageContext, MessageProvider
    from .search import SearchResult, TextSearch
    from .skills import ScriptRequest, Skill, SkillProblem, Skills
    from .tool_search import ToolSearch

__all__ = [
    "Artifacts",
    "Compaction",
    "ContextBudget",
    "ContextProvider",
    "Fact",
    "FactMemory",
    "History",
    "HistoryProvider",
    "HttpServer",
    "LoadedHistory",
    "McpTools",
    "MessageContext",
    "MessageFilter",
    "MessageProvider",
    "ScriptRequest",
    "SearchResult",
    "SemanticMemory",
    "Skill",
    "SkillProblem",
    "Skills",
    "StdioServer",
    "TextSearch",
    "ToolSearch",
    "external_input",
]


__getattr__ = lazy_exports(__name__, {
    "Artifacts": ".artifacts",
    "Compaction": ".compaction",
    "ContextBudget": "contextpipe.budget",  # (its own module: one budget over every provider)
    "Fact": ".facts", "FactMemory": ".facts",
    "History": ".history",
    **dict.fromkeys(("McpTools", "StdioServer", "HttpServer"), ".mcp"),
    "MessageContext": ".message", "MessageProvider": ".message",
    "SemanticMemory": ".memory",
    "SearchResult": ".search", "TextSearch": ".search",
    **dict.fromkeys(("ScriptRequest", "Skill", "SkillProblem", "Skills"), ".skills"),
    "ToolSearch": ".tool_search",
})
