"""`OpenAIResponsesModel`: OpenAI's Responses API through the official `openai` SDK.

Stateless by default: every call sends the whole input with ``store=False``, so the session log
stays the source of truth, and asks for ``reasoning.encrypted_content``. Reasoning items come back as
`ReasoningPart`s (format ``openai.reasoning``, the item id in `ReasoningPart.id`, the encrypted
content in `ReasoningPart.encrypted`, the summary as text); they are stored with the session and
sent back on later calls, each before the item that followed it. Reasoning of other vendors (Claude
thinking) is left out, with a note in the call's trace.

With ``previous_response=True`` the service keeps the conversation instead (``store=True``): the id
of each response is kept in its message's metadata (``openai_response_id``), so the session itself
remembers it, and a call sends ``previous_response_id`` plus only the messages after that response.
When no stored response is in view (a new session, compaction replaced it) the whole input is sent.

A tool result's images (PNG, JPEG, GIF and WebP inline, any type by URL) and PDF files go into its
``function_call_output`` as an ``output`` list
(``input_text``, then ``input_image`` / ``input_file`` items); other media (audio) are left out,
named in a note at the end of the result's text and in the call's trace.

The Responses wire format lives only in this module.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from .._media import Media, only_readable, with_left_out
from ..errors import (
    ModelBadRequest,
    ModelError,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    UsageError,
    clause,
)
from ..messages import DataPart, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, UnknownPart, UriPart
from ._client import IMAGE_TYPES, dropped_notes, stream_cut, stream_unfinished
from ._openai import OpenAIModel, OpenAIOptions
from .base import ModelRequest, ModelResponse, ModelStreamEvent, ReasoningDelta, ResponseComplete, TextDelta, Usage

if TYPE_CHECKING:
    from ..messages import Part
    from .base import ModelSettings

__all__ = ["OpenAIResponsesModel"]

REASONING = "openai.reasoning"
RESPONSE_ID = "openai_response_id"
"""Metadata key of an assistant message: the id of the response that produced it."""


class OpenAIResponsesModel(OpenAIModel):
    """A model served over the OpenAI Responses API (see the module docstring).

    >>> model = OpenAIResponsesModel("gpt-5-mini", api_key="sk-example")
    >>> model.name, model.provider, model.previous_response
    ('gpt-5-mini', 'openai', False)

    Takes the connection's arguments, as `OpenAIChatModel` does (and `OpenAIResponsesModel.azure`),
    plus `previous_response` (use the service's stored conversation) and `encrypted_reasoning` (ask
    for encrypted reasoning in stateless mode; turn off for servers or models that refuse it).
    """

    def __init__(self, model: str | None = None, *, previous_response: bool = False,
                 encrypted_reasoning: bool = True, **options: Unpack[OpenAIOptions]) -> None:
        super().__init__(model, **options)
        self.previous_response = previous_response
        """Whether calls continue the service's stored conversation (``previous_response_id``)."""
        self.encrypted_reasoning = encrypted_reasoning
        """Whether stateless calls ask for encrypted reasoning to send back."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the whole response."""
        kwargs, notes = self._build(request)
        try:
            response = await self.client.responses.create(**kwargs)
        except Exception as exc:
            raise self._translate(exc) from exc
        return self._parse(response, notes)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Stream `request`: text and reasoning-summary deltas, then the assembled response."""
        kwargs, notes = self._build(request)
        events = 0
        final: Any = None
        try:
            stream = await self.client.responses.create(**kwargs, stream=True)
            async with stream:  # closes the connection even when the caller stops early
                async for event in stream:
                    events += 1
                    kind = getattr(event, "type", None)
                    if kind == "response.output_text.delta":
                        yield TextDelta(event.delta)
                    elif kind == "response.reasoning_summary_text.delta":
                        yield ReasoningDelta(event.delta)
                    elif kind in ("response.completed", "response.incomplete", "response.failed"):
                        final = event.response
                    elif kind == "error":
                        raise self._stream_error(getattr(event, "code", None), getattr(event, "message", ""),
                                                 events)
        except ModelError:
            raise
        except Exception as exc:
            if events:
                raise stream_cut(self.provider, self._model, events, "event", exc) from exc
            raise self._translate(exc) from exc
        if final is None:
            raise stream_unfinished(self.provider, self._model, f"after {events} event(s) without response.completed")
        yield ResponseComplete(self._parse(final, notes))

    # --- request ------------------------------------------------------------------------------------

    def _build(self, request: ModelRequest) -> tuple[dict[str, Any], list[str]]:
        settings = self._settings(request)
        notes: list[str] = []
        kwargs: dict[str, Any] = {"model": self._model}
        messages = only_readable(self._continuation(request.messages, kwargs), self.media_types, self._model, notes)
        dropped: dict[str, int] = {}
        items: list[dict[str, Any]] = []
        for message in messages:
            _append_items(items, message, dropped, notes)
        notes.extend(dropped_notes(dropped, "the Responses API"))
        kwargs["input"] = items
        if request.instructions:
            kwargs["instructions"] = request.instructions
        if request.tools:
            kwargs.update(_tools(request, settings))
        _options(kwargs, settings, notes)
        return kwargs, notes

    def _continuation(self, messages: Sequence[Message], kwargs: dict[str, Any]) -> Sequence[Message]:
        """Set ``store`` (and ``previous_response_id``); return the messages the request must carry."""
        if not self.previous_response:
            kwargs["store"] = False
            if self.encrypted_reasoning:
                kwargs["include"] = ["reasoning.encrypted_content"]
            return messages
        kwargs["store"] = True
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            response_id = message.metadata.get(RESPONSE_ID) if message.role == "assistant" else None
            if isinstance(response_id, str):
                kwargs["previous_response_id"] = response_id
                return messages[index + 1:]
        return messages

    # --- response -----------------------------------------------------------------------------------

    def _parse(self, response: Any, notes: list[str]) -> ModelResponse:
        status = getattr(response, "status", None)
        if status == "failed":
            error = getattr(response, "error", None)
            raise self._stream_error(getattr(error, "code", None), getattr(error, "message", "the response failed"),
                                     0)
        output = getattr(response, "output", None)
        if output is None:
            raise ModelResponseError(f"{self.provider} returned a response without output for model "
                                     f"{self._model!r}: {str(response)[:300]}", provider=self.provider, body=response)
        parts: list[Part] = []
        refused = False
        for item in output:
            refused = _output_parts(item, parts) or refused
        finish = "content_filter" if refused else (
            "tool_calls" if any(isinstance(p, FunctionCall) for p in parts) else "stop")
        if status == "incomplete":
            reason = getattr(getattr(response, "incomplete_details", None), "reason", None) or "length"
            finish = {"max_output_tokens": "length"}.get(reason, reason)
        response_id = getattr(response, "id", None)
        metadata = {RESPONSE_ID: response_id} if isinstance(response_id, str) else {}
        return ModelResponse([Message("assistant", tuple(parts), metadata=metadata)],
                             usage=_usage(getattr(response, "usage", None)), finish_reason=finish,
                             model=getattr(response, "model", None) or self._model, raw=response, notes=tuple(notes),
                             id=response_id if isinstance(response_id, str) else None)

    def _stream_error(self, code: str | None, message: str, events: int) -> ModelError:
        where = self._connection.where
        detail = f"{clause(message)} (code {code}, after {events} event(s))" if code else clause(message)
        if code in ("rate_limit_exceeded", "insufficient_quota"):
            return ModelRateLimited(f"{where} is rate limiting: {detail}; retry later", provider=self.provider)
        if code in ("invalid_prompt", "invalid_request_error", "invalid_value"):
            return ModelBadRequest(f"{where} rejected the request: {detail}", provider=self.provider)
        return ModelServerError(f"{where} failed while answering: {detail}; retry later", provider=self.provider)


def _usage(usage: Any) -> Usage | None:
    """`Usage` from a response's usage, with cached input and reasoning tokens when reported."""
    if usage is None:
        return None
    inputs = getattr(usage, "input_tokens_details", None)
    reasoning = getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", None)
    return Usage(usage.input_tokens or 0, usage.output_tokens or 0, getattr(inputs, "cached_tokens", None) or 0,
                 getattr(inputs, "cache_write_tokens", None) or 0, reasoning or 0)


def _output_parts(item: Any, parts: list[Part]) -> bool:
    """Add the parts of one output item to `parts`; return True when it is a refusal."""
    kind = getattr(item, "type", None)
    if kind == "reasoning":
        summary = "\n\n".join(s.text for s in (item.summary or ()) if getattr(s, "text", None))
        parts.append(ReasoningPart(summary, getattr(item, "encrypted_content", None), REASONING, item.id))
    elif kind == "message":
        refused = False
        for content in item.content or ():
            if content.type == "output_text" and content.text:
                parts.append(TextPart(content.text))
            elif content.type == "refusal":
                refused = True
                parts.append(TextPart(content.refusal))
        return refused
    elif kind == "function_call":
        parts.append(FunctionCall(item.call_id, item.name, item.arguments or "{}"))
    else:
        parts.append(UnknownPart(f"openai.{kind}", item.model_dump(exclude_none=True)))
    return False


def _tools(request: ModelRequest, settings: ModelSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"tools": [{"type": "function", "name": t.name, "description": t.description,
                                      "parameters": t.parameters, "strict": False} for t in request.tools]}
    if "parallel_tool_calls" in settings:
        out["parallel_tool_calls"] = settings["parallel_tool_calls"]
    choice = settings.get("tool_choice")
    if choice is not None:
        out["tool_choice"] = choice if choice in ("auto", "none", "required") else {"type": "function", "name": choice}
    return out


def _options(kwargs: dict[str, Any], settings: ModelSettings, notes: list[str]) -> None:
    for key in ("temperature", "max_output_tokens"):
        if key in settings:
            kwargs[key] = settings[key]
    if "reasoning_effort" in settings:
        kwargs["reasoning"] = {"effort": settings["reasoning_effort"], "summary": "auto"}
    response_format = settings.get("response_format")
    if response_format:
        if response_format.get("type") == "json_schema":
            kwargs["text"] = {"format": {"type": "json_schema", **dict(response_format.get("json_schema") or {})}}
        else:
            kwargs["text"] = {"format": dict(response_format)}
    if "seed" in settings:
        notes.append("seed is not supported by the Responses API; sent without it")
    if "openai_extra_body" in settings:
        kwargs["extra_body"] = settings["openai_extra_body"]


def _append_items(items: list[dict[str, Any]], message: Message, dropped: dict[str, int], notes: list[str]) -> None:
    if message.role == "assistant":
        parts = message.parts
        for index, part in enumerate(parts):
            item = _assistant_item(part, parts[index + 1:], dropped, notes)
            if item is not None:
                items.append(item)
        return
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, FunctionResult):
            output = _tool_output(part, notes) if part.parts else part.result
            items.append({"type": "function_call_output", "call_id": part.call_id, "output": output})
        elif isinstance(part, TextPart):
            if part.text:
                content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, DataPart | UriPart):
            content.append(_media(part, message.role))
        elif not isinstance(part, ReasoningPart | FunctionCall) and (kept := _unknown_item(part, dropped)):
            items.append(kept)
    if content:
        items.append({"role": "developer" if message.role == "system" else "user", "content": content})


def _tool_output(part: FunctionResult, notes: list[str]) -> list[dict[str, Any]]:
    """Return a result with media as the output list the API takes: its text, then images and PDF files."""
    media: list[dict[str, Any]] = []
    left_out: list[Media] = []
    for item in part.parts:
        if isinstance(item, UnknownPart):
            left_out.append(item)
            continue
        image = item.media_type in IMAGE_TYPES or (isinstance(item, UriPart) and item.media_type.startswith("image/"))
        if image or item.media_type == "application/pdf":
            media.append(_media(item, "tool"))
        else:
            left_out.append(item)
    text = with_left_out(part, part.result, left_out, "the OpenAI Responses API",
                         "the Responses API cannot take this content in a function call output", notes)
    return ([{"type": "input_text", "text": text}] if text else []) + media


def _unknown_item(part: Part, dropped: dict[str, int]) -> dict[str, Any] | None:
    """Return an item kept from an earlier OpenAI answer verbatim; leave out other parts it cannot send."""
    if isinstance(part, UnknownPart) and part.kind.startswith("openai."):
        return dict(part.payload)
    key = "part:" + part.kind
    dropped[key] = dropped.get(key, 0) + 1
    return None


def _assistant_item(part: Part, after: Sequence[Part], dropped: dict[str, int],
                    notes: list[str]) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"role": "assistant", "content": part.text} if part.text else None
    if isinstance(part, FunctionCall):
        return {"type": "function_call", "call_id": part.call_id, "name": part.name, "arguments": part.arguments}
    if not isinstance(part, ReasoningPart):
        return _unknown_item(part, dropped)
    if part.format != REASONING or not part.id:
        fmt = part.format or "plain"
        dropped[fmt] = dropped.get(fmt, 0) + 1
        return None
    if all(isinstance(p, ReasoningPart) for p in after):
        notes.append(f"left out reasoning item {part.id}: nothing it led to was kept, and the API rejects a "
                     "reasoning item without its following item")
        return None
    item: dict[str, Any] = {"type": "reasoning", "id": part.id,
                            "summary": [{"type": "summary_text", "text": part.text}] if part.text else []}
    if part.encrypted is not None:
        item["encrypted_content"] = part.encrypted
    return item


def _media(part: DataPart | UriPart, role: str) -> dict[str, Any]:
    if isinstance(part, UriPart):
        url = part.uri
    else:
        url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"
    if part.media_type.startswith("image/"):
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    if part.media_type == "application/pdf":
        if isinstance(part, UriPart):
            return {"type": "input_file", "file_url": url}
        return {"type": "input_file", "filename": "document.pdf", "file_data": url}
    raise UsageError(
        f"the OpenAI Responses API cannot take {part.media_type!r} content in a {role} message; send images "
        "(image/*) or PDF files, or convert the content to text"
    )
