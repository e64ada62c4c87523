"""The `ChatModel` protocol and the request, response and stream types every model client shares."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, TypedDict, runtime_checkable

from .._tool_spec import ToolSpec
from ..messages import Message

__all__ = [
    "CallModel",
    "ChatModel",
    "DescribedModel",
    "ModelInfo",
    "ModelMiddleware",
    "ModelRequest",
    "ModelResponse",
    "ModelSettings",
    "ModelStreamEvent",
    "ReasoningDelta",
    "ResponseComplete",
    "TextDelta",
    "Usage",
]


class ModelSettings(TypedDict, total=False):
    """Options for one model call; dicts merge with ``|`` (later wins).

    Provider-specific options carry the provider's prefix (``openai_...``) so one dict serves all.
    """

    temperature: float
    """Sampling temperature."""
    max_output_tokens: int
    """Upper bound on generated tokens."""
    tool_choice: Literal["auto", "none", "required"] | str
    """``auto``, ``none``, ``required``, or the name of one tool the model must call."""
    parallel_tool_calls: bool
    """Whether the model may request several tool calls in one response."""
    response_format: dict[str, Any]
    """Structured-output format, for example ``{"type": "json_object"}`` or a JSON-schema format."""
    seed: int
    """Sampling seed, where the provider supports it."""
    openai_extra_body: dict[str, Any]
    """Extra JSON fields sent as-is to an OpenAI-compatible server."""
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | str
    """How hard a reasoning model thinks (OpenAI Responses ``reasoning.effort``)."""
    anthropic_thinking: dict[str, Any]
    """Anthropic ``thinking`` configuration, for example ``{"type": "enabled", "budget_tokens": 2048}``."""
    anthropic_extra_body: dict[str, Any]
    """Extra JSON fields sent as-is to the Anthropic Messages API."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a model call consumed, as the provider reported them."""

    input_tokens: int = 0
    """Tokens in the request (prompt), cached ones included."""
    output_tokens: int = 0
    """Tokens generated (reasoning included)."""
    cache_read_tokens: int = 0
    """Of `input_tokens`, how many were read from the provider's prompt cache (OpenAI ``cached_tokens``)."""
    cache_write_tokens: int = 0
    """Of `input_tokens`, how many were written to the provider's prompt cache (Anthropic cache creation)."""
    reasoning_tokens: int = 0
    """Of `output_tokens`, how many the model spent reasoning, when the provider says."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
                     self.cache_read_tokens + other.cache_read_tokens,
                     self.cache_write_tokens + other.cache_write_tokens,
                     self.reasoning_tokens + other.reasoning_tokens)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything one model call is given."""

    messages: Sequence[Message]
    """The conversation, oldest first (instructions travel separately)."""
    instructions: str | None = None
    """System instructions, sent before the messages."""
    tools: Sequence[ToolSpec] = ()
    """Tools the model may call."""
    settings: ModelSettings = field(default_factory=lambda: ModelSettings())
    """Options for this call."""


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What one model call returned."""

    messages: list[Message]
    """New messages (usually one assistant message with text and/or function calls)."""
    usage: Usage | None = None
    """Tokens used, when the provider reported them."""
    finish_reason: str | None = None
    """Why the model stopped: ``stop``, ``tool_calls``, ``length``, ``content_filter``, ..."""
    model: str | None = None
    """The model that answered, as the provider named it."""
    raw: Any = None
    """The provider's own response object, for debugging."""
    request: ModelRequest | None = field(default=None, repr=False, compare=False)
    """The request as it reached the model, after every middleware (set by the run's innermost call)."""
    notes: tuple[str, ...] = ()
    """What the client changed in the request to make it valid for its provider (for example reasoning
    of another vendor left out); shown in the call's `PromptTrace`."""
    id: str | None = None
    """The provider's id of this response (``chatcmpl-...``, ``resp_...``, ``msg_...``), streamed or not;
    OpenTelemetry's ``gen_ai.response.id``."""

    @property
    def text(self) -> str:
        """Text of the response messages joined together."""
        return "".join(m.text for m in self.messages)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of streamed text."""

    text: str
    kind: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A piece of streamed reasoning text."""

    text: str
    kind: Literal["reasoning_delta"] = "reasoning_delta"


@dataclass(frozen=True, slots=True)
class ResponseComplete:
    """The last event of a model stream: the whole response, assembled."""

    response: ModelResponse
    kind: Literal["response_complete"] = "response_complete"


ModelStreamEvent: TypeAlias = TextDelta | ReasoningDelta | ResponseComplete


@runtime_checkable
class ChatModel(Protocol):
    """A chat model: one-shot `complete`, or `stream` ending with `ResponseComplete`.

    Implementations raise `contextpipe.errors.ModelError` subclasses for every failure. One that
    also has an ``info`` property (`DescribedModel`) tells telemetry who serves it.
    """

    @property
    def name(self) -> str:
        """Model name, for traces and errors."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the whole response."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Send `request` and yield deltas as they arrive, then one `ResponseComplete`."""
        ...


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Who serves a chat model, as telemetry reports it (OpenTelemetry's ``gen_ai.provider.name``, ``server.*``)."""

    provider: str
    """The provider, as ``gen_ai.provider.name`` spells it: ``openai``, ``anthropic``, ``aws.bedrock``, ..."""
    base_url: str | None = None
    """The URL of the endpoint the model calls (``server.address`` / ``server.port``), or None."""


@runtime_checkable
class DescribedModel(Protocol):
    """A chat model that says who serves it; telemetry names any other model by its class.

    The OpenAI and Anthropic clients are described models. A model of your own may add the property.
    """

    @property
    def info(self) -> ModelInfo:
        """The provider and endpoint this model calls."""
        ...


CallModel: TypeAlias = Callable[[ModelRequest], Awaitable[ModelResponse]]
"""The next step of a middleware chain: call it to go on to the model."""

ModelMiddleware: TypeAlias = Callable[[ModelRequest, CallModel], Awaitable[ModelResponse]]
"""Wraps one model call: ``async def mw(request, call_next) -> ModelResponse``.

It may change the request, return its own response, or post-process the model's.
"""
