"""Model clients: the `ChatModel` protocol and `OpenAIChatModel` (test doubles are in `contextpipe.testing`).

`OpenAIChatModel` is imported lazily: ``import contextpipe.models`` does not import the `openai`
package until the class is first used.
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
    "TextDelta",
    "Usage",
]


__getattr__ = lazy_exports(__name__, {"OpenAIChatModel": ".openai"})
