"""The OpenTelemetry GenAI semantic conventions, as pure functions from contextpipe objects to span data.

Telemetry calls these to name providers (``gen_ai.provider.name``: ``openai``, ``anthropic``,
``azure.ai.openai``, ...), find the server a model talks to (``server.address`` / ``server.port``),
and write captured content in the conventions' message schema: ``gen_ai.input.messages`` and
``gen_ai.output.messages`` are JSON arrays of ``{"role", "parts": [...]}`` with parts of ``type``
``text`` / ``tool_call`` / ``tool_call_response`` / ``blob`` / ``uri`` / ``reasoning``, and
``gen_ai.system_instructions`` a JSON array of parts. Nothing here imports OpenTelemetry.

>>> from contextpipe.messages import Message
>>> input_messages([Message.user("Hi")])
'[{"role": "user", "parts": [{"type": "text", "content": "Hi"}]}]'
>>> finish_reason("tool_calls")
'tool_call'
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from .messages import DataPart, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, UnknownPart, UriPart
from .models.base import DescribedModel, ModelInfo

__all__ = [
    "agent_attributes",
    "chat_request_attributes",
    "chat_response_attributes",
    "error_type",
    "finish_reason",
    "input_messages",
    "output_messages",
    "provider_name",
    "server_attributes",
    "system_instructions",
]

_PROVIDERS: Final = {
    "openai": "openai", "azure-openai": "azure.ai.openai", "azure_openai": "azure.ai.openai",
    "azure.ai.openai": "azure.ai.openai", "anthropic": "anthropic", "gemini": "gcp.gemini",
    "vertex": "gcp.vertex_ai", "bedrock": "aws.bedrock", "mistral": "mistral_ai", "groq": "groq",
    "deepseek": "deepseek", "cohere": "cohere", "xai": "x_ai", "perplexity": "perplexity",
}
_CLASS_PROVIDERS: Final = (("anthropic", "anthropic"), ("azure", "azure.ai.openai"), ("openai", "openai"),
                           ("scripted", "contextpipe.scripted"))
_FINISH: Final = {"tool_calls": "tool_call", "tool_use": "tool_call", "function_call": "tool_call",
                  "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "max_output_tokens": "length",
                  "refusal": "content_filter"}
_DEFAULT_PORTS: Final = {"https": 443, "http": 80}


def _innermost(model: object) -> object:
    inner = getattr(model, "model", None)
    if inner is not None and not isinstance(inner, str) and hasattr(inner, "complete"):
        return _innermost(inner)
    return model


def _info(model: object) -> ModelInfo | None:
    """Return the `ModelInfo` a described model declares; None for any other (an unrelated ``info`` too)."""
    info = model.info if isinstance(model, DescribedModel) else None
    return info if isinstance(info, ModelInfo) else None


def provider_name(model: object) -> str:
    """Return the ``gen_ai.provider.name`` of a chat model: a well-known value (``openai``, ``anthropic``, ...) or ours.

    Reads the provider of a `DescribedModel`'s `ModelInfo`, else the model's class name; wrappers
    with a ``model`` attribute are looked through.
    """
    model = _innermost(model)
    info = _info(model)
    declared = info.provider if info is not None else None
    if declared:
        return _PROVIDERS.get(declared.lower(), declared.lower())
    cls = type(model).__name__.lower()
    for fragment, name in _CLASS_PROVIDERS:
        if fragment in cls:
            return name
    return cls.removesuffix("chatmodel").removesuffix("model") or cls


def server_attributes(model: object) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of the endpoint a model calls ({} when it calls none)."""
    model = _innermost(model)
    info = _info(model)
    base = info.base_url if info is not None else None
    if base is None:
        return {}
    from urllib.parse import urlsplit  # here, not at the top: importing the agent need not load it

    parts = urlsplit(base)
    if not parts.hostname:
        return {}
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    return {"server.address": parts.hostname, **({"server.port": port} if port else {})}


def finish_reason(reason: str | None) -> str:
    """Return a provider's stop reason in the conventions' terms (``stop``, ``length``, ``tool_call``, ...)."""
    if not reason:
        return "stop"
    return _FINISH.get(reason, reason)


def error_type(error: BaseException) -> str:
    """``error.type``: the exception's class name (low-cardinality, as the conventions ask)."""
    return type(error).__qualname__


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return text  # the model's malformed arguments, kept as they were


def _modality(media_type: str) -> str:
    major = media_type.split("/", 1)[0]
    return major if major in ("image", "audio", "video") else major or "file"


def _part(part: Any) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "content": part.text}
    if isinstance(part, FunctionCall):
        return {"type": "tool_call", "id": part.call_id, "name": part.name, "arguments": _arguments(part.arguments)}
    if isinstance(part, FunctionResult):
        return {"type": "tool_call_response", "id": part.call_id, "response": part.result}
    if isinstance(part, DataPart):
        return {"type": "blob", "modality": _modality(part.media_type), "mime_type": part.media_type,
                "content": base64.b64encode(part.data).decode()}
    if isinstance(part, UriPart):
        return {"type": "uri", "modality": _modality(part.media_type), "mime_type": part.media_type, "uri": part.uri}
    if isinstance(part, ReasoningPart):
        return {"type": "reasoning", "content": part.text}
    if isinstance(part, UnknownPart):
        return {"type": part.kind, **{k: v for k, v in part.payload.items() if k != "type"}}
    return None


def _message(message: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        converted = _part(part)
        if converted is not None:
            parts.append(converted)
        if isinstance(part, FunctionResult):  # a result's images and files follow its response, as blobs / uris
            parts.extend(p for media in part.parts if (p := _part(media)) is not None)
    entry: dict[str, Any] = {"role": message.role, "parts": parts}
    if message.author_name:
        entry["name"] = message.author_name
    return entry


def input_messages(messages: Iterable[object]) -> str:
    """``gen_ai.input.messages``: the request's messages as the conventions' JSON."""
    return json.dumps([_message(m) for m in messages if isinstance(m, Message)], ensure_ascii=False)


def output_messages(messages: Iterable[object], reason: str | None) -> str:
    """``gen_ai.output.messages``: the response's messages, each with its ``finish_reason``."""
    out = [{**_message(m), "finish_reason": finish_reason(reason)} for m in messages if isinstance(m, Message)]
    return json.dumps(out, ensure_ascii=False)


def system_instructions(text: str) -> str:
    """``gen_ai.system_instructions``: the instructions as a JSON array of text parts."""
    return json.dumps([{"type": "text", "content": text}], ensure_ascii=False)


def agent_attributes(model: object) -> dict[str, Any]:
    """Return what an ``invoke_agent`` span says about the model it runs on (provider and server)."""
    return {"gen_ai.provider.name": provider_name(model), **server_attributes(model)}


def chat_request_attributes(model: object, model_name: str, settings: Any, messages: Sequence[object],
                            instructions: str | None, capture: bool) -> dict[str, Any]:
    """Attributes of a ``chat`` span when the request is sent."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model_name,
                                  **agent_attributes(model)}
    for key, attr in (("temperature", "gen_ai.request.temperature"), ("max_output_tokens", "gen_ai.request.max_tokens"),
                      ("seed", "gen_ai.request.seed"), ("top_p", "gen_ai.request.top_p"),
                      ("stop", "gen_ai.request.stop_sequences")):
        if key in settings:
            attributes[attr] = settings[key]
    if capture:
        attributes["gen_ai.input.messages"] = input_messages(messages)
        if instructions:
            attributes["gen_ai.system_instructions"] = system_instructions(instructions)
    return attributes


def chat_response_attributes(response: Any, capture: bool) -> dict[str, Any]:
    """Attributes of a ``chat`` span when the response is complete (None values are meant to be left out)."""
    usage = response.usage
    raw_id = getattr(response, "id", None)  # ModelResponse.id: every client sets it, streamed or not
    attributes: dict[str, Any] = {
        "gen_ai.response.id": raw_id if isinstance(raw_id, str) else None,
        "gen_ai.response.model": response.model,
        "gen_ai.response.finish_reasons": [finish_reason(response.finish_reason)] if response.finish_reason else None,
        "gen_ai.usage.input_tokens": usage.input_tokens if usage else None,
        "gen_ai.usage.output_tokens": usage.output_tokens if usage else None,
    }
    for field, attr in (("cache_read_tokens", "gen_ai.usage.cache_read.input_tokens"),
                        ("cache_write_tokens", "gen_ai.usage.cache_creation.input_tokens"),
                        ("reasoning_tokens", "gen_ai.usage.reasoning.output_tokens")):
        if getattr(usage, field, 0):  # reported only when the provider says (clients that know them set them)
            attributes[attr] = getattr(usage, field)
    if capture:
        attributes["gen_ai.output.messages"] = output_messages(response.messages, response.finish_reason)
    return attributes
