"""Model clients: the `ChatModel` protocol, `ScriptedModel` and `OpenAIChatModel`.

`OpenAIChatModel` is imported lazily: ``import contextpipe.models`` does not import the `openai`
package until the class is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    CallModel,
    ChatModel,
    ModelMiddleware,
    ModelRequest,
    ModelResponse,
    ModelSettings,
    ModelStreamEvent,
    ReasoningDelta,
    ResponseComplete,
    TextDelta,
    Usage,
)
from .scripted import ScriptedModel, Turn, tool_call

if TYPE_CHECKING:
    from .openai import OpenAIChatModel

__all__ = [
    "CallModel",
    "ChatModel",
    "ModelMiddleware",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "ModelStreamEvent",
    "OpenAIChatModel",
    "ReasoningDelta",
    "ResponseComplete",
    "ScriptedModel",
    "TextDelta",
    "Turn",
    "Usage",
    "tool_call",
]


def __getattr__(name: str) -> Any:
    if name == "OpenAIChatModel":
        from .openai import OpenAIChatModel

        return OpenAIChatModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
