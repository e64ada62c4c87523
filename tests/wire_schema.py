"""Check request bodies against the vendors' documented schemas, as the official SDKs type them."""

from __future__ import annotations

from functools import cache
from typing import Any

import pydantic


def _force(value: Any) -> Any:
    """Consume pydantic's lazy validators (``Iterable[...]`` fields) so every nested item is checked."""
    if isinstance(value, dict):
        return {k: _force(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_force(v) for v in value]
    if type(value).__name__ == "ValidatorIterator":
        return [_force(v) for v in value]
    return value


@cache
def _anthropic() -> pydantic.TypeAdapter[Any]:
    from anthropic.types import message_create_params

    return pydantic.TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)


@cache
def _responses() -> pydantic.TypeAdapter[Any]:
    from openai.types.responses import response_create_params

    return pydantic.TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)


def check_anthropic(body: dict[str, Any]) -> None:
    """Raise when `body` is not a valid Messages API request."""
    _force(_anthropic().validate_python({k: v for k, v in body.items() if k != "stream"}))


def check_responses(body: dict[str, Any]) -> None:
    """Raise when `body` is not a valid Responses API request."""
    _force(_responses().validate_python({k: v for k, v in body.items() if k != "stream"}))


@cache
def _chat() -> pydantic.TypeAdapter[Any]:
    from openai.types.chat import completion_create_params

    return pydantic.TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)


def check_chat(body: dict[str, Any]) -> None:
    """Raise when `body` is not a valid chat completions request."""
    _force(_chat().validate_python({k: v for k, v in body.items() if k not in ("stream", "stream_options")}))
