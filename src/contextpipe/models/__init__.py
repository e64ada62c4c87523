"""Model clients: the `ChatModel` protocol and the OpenAI and Anthropic clients.

Test doubles are in `contextpipe.testing`.

The clients are `OpenAIChatModel`, `OpenAIResponsesModel` and `AnthropicChatModel`.

The vendor clients are imported lazily: ``import contextpipe.models`` imports neither the `openai`
nor the `anthropic` package until a class is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
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
    "TextDelta",
    "Usage",
]


__getattr__ = lazy_exports(__name__, {"OpenAIChatModel": ".openai", "OpenAIResponsesModel": ".openai_responses",
                                      "AnthropicChatModel": ".anthropic"})
