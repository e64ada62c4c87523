"""Model clients: the `ChatModel` protocol and the OpenAI and Anthropic clients.

Test doubles are in `contextpipe.testing`.

The clients are `OpenAIChatModel`, `OpenAIResponsesModel` and `AnthropicChatModel`; each keeps its
vendor's wire format, on the chassis they share (`models._client`: the connection, and one ladder
from HTTP statuses to `ModelError`s).

The vendor clients are imported lazily: ``import contextpipe.models`` imports neither the `openai`
nor the `anthropic` package until a class is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import base
from .base import *  # noqa: F403  (the protocol and the request, response and stream types: `base.__all__`)

if TYPE_CHECKING:
    from .anthropic import AnthropicChatModel
    from .openai import OpenAIChatModel
    from .openai_responses import OpenAIResponsesModel

__all__ = [*base.__all__, "AnthropicChatModel", "OpenAIChatModel", "OpenAIResponsesModel"]


__getattr__ = lazy_exports(__name__, {"OpenAIChatModel": ".openai", "OpenAIResponsesModel": ".openai_responses",
                                      "AnthropicChatModel": ".anthropic"})
