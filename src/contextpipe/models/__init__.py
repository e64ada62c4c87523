"""Model clients: the `ChatModel` protocol, `ScriptedModel` and the OpenAI and Anthropic clients.

The clients are `OpenAIChatModel`, `OpenAIResponsesModel` and `AnthropicChatModel`.

The vendor clients are imported lazily: ``import contextpipe.models`` imports neither the `openai`
nor the `anthropic` package until a class is first used.
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
    from .anthropic import AnthropicChatModel
    from .openai import OpenAIChatModel
    from .openai_responses import OpenAIResponsesModel

__all__ = [
    "AnthropicChatModel",
    "CallModel",
    "ChatModel",
    "ModelMiddleware",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "ModelStreamEvent",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
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
    if name == "OpenAIResponsesModel":
        from .openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel
    if name == "AnthropicChatModel":
        from .anthropic import AnthropicChatModel

        return AnthropicChatModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
