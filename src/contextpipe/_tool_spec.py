"""`ToolSpec`, what a model is told about a tool, apart from `tools` itself.

Public as `contextpipe.tools.ToolSpec`. `models.base` names it in `ModelRequest`'s fields and `tokens`
counts it, so it must be importable at run time (``typing.get_type_hints(ModelRequest)`` resolves it)
without loading the rest of `tools` (the `@tool` machinery, `ToolContext`): an agent that has no tools
never imports `tools`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ToolSpec"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a model is told about a tool: its name, description and JSON schema of arguments."""

    name: str
    """Name the model calls the tool by."""
    description: str
    """What the tool does, for the model."""
    parameters: dict[str, Any]
    """JSON schema (an object schema) of the arguments."""
