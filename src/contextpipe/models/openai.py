"""`OpenAIChatModel`: any OpenAI-compatible chat completions endpoint, through the official `openai` SDK.

Works with OpenAI, Azure OpenAI (`OpenAIChatModel.azure`), and OpenAI-compatible servers such as
Ollama, vLLM and llama.cpp's server (pass `base_url`). The OpenAI wire format lives only in this
module; everything else speaks contextpipe `Message`s.

A ``tool`` message of this API takes only text. A tool result's images (PNG, JPEG, GIF and WebP
inline, any type by URL), WAV / MP3 audio and PDF files are therefore sent right after the
assistant turn's tool messages, in one ``user`` message that says which tool and call they came
from ("Image returned by tool 'chart' (call id call_1):"), and the tool message's text says the
attachments follow (the form agent frameworks commonly use with this API; it works with any vision
model behind it). Media the API cannot take (other audio formats, other files, audio or files by
URL) are left out, named in a note at the end of the result's text and in the call's trace.

Configuration comes from arguments or the usual environment variables: ``OPENAI_API_KEY``,
``OPENAI_BASE_URL``, ``OPENAI_MODEL`` (and for Azure ``AZURE_OPENAI_ENDPOINT``,
``AZURE_OPENAI_API_KEY``, ``OPENAI_API_VERSION``).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Unpack

from .._media import AUDIO_FORMATS, Media, only_readable, with_left_out
from ..errors import ModelResponseError, UsageError
from ..exchanges import carries_results
from ..messages import DataPart, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, UnknownPart, UriPart
from ._client import IMAGE_TYPES, dropped_notes, stream_cut, stream_unfinished
from ._openai import OpenAIModel, OpenAIOptions
from .base import ModelRequest, ModelResponse, ModelStreamEvent, ReasoningDelta, ResponseComplete, TextDelta, Usage

if TYPE_CHECKING:
    from ..messages import Part

__all__ = ["OpenAIChatModel"]


class OpenAIChatModel(OpenAIModel):
    """A chat model served over the OpenAI chat completions API.

    >>> model = OpenAIChatModel("llama3.2", base_url="http://127.0.0.1:11434/v1")  # Ollama
    >>> model.name
    'llama3.2'

    Takes the connection's arguments (`api_key`, `base_url`, `organization`, `timeout`,
    `max_retries`, `settings`, `client`, `media_types`: see `OpenAIChatModel.azure` for Azure) and
    `max_tokens_field`, the request field that carries ``max_output_tokens`` (older servers want
    ``max_tokens``). `max_retries` is the SDK's own retry count for connection errors, 408/409/429
    and 5xx answers; `timeout` is seconds per request. Pass `client` to reuse a configured
    ``openai.AsyncOpenAI``. `media_types` says which media in tool results the model reads, as
    patterns (``("image/*",)``); the rest are left out, named in the result's text and the trace.
    None (the default) sends all the API takes; ``()`` suits a text-only model.
    """

    def __init__(self, model: str | None = None, *, max_tokens_field: str = "max_completion_tokens",
                 **options: Unpack[OpenAIOptions]) -> None:
        super().__init__(model, **options)
        self._max_tokens_field = max_tokens_field

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the whole response."""
        kwargs, notes = self._build(request)
        try:
            completion = await self.client.chat.completions.create(**kwargs)
        except Exception as exc:
            raise self._translate(exc) from exc
        return _noted(self._parse(completion), request, notes)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Stream `request`: text and reasoning deltas, then the assembled response."""
        kwargs, notes = self._build(request)
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
        assembly = _StreamAssembly()
        try:
            stream = await self.client.chat.completions.create(**kwargs)
            async for chunk in stream:
                assembly.chunks += 1
                for event in assembly.feed(chunk):
                    yield event
        except Exception as exc:
            if assembly.chunks:
                raise stream_cut(self.provider, self._model, assembly.chunks, "chunk", exc) from exc
            raise self._translate(exc) from exc
        yield ResponseComplete(_noted(assembly.finish(self.provider, self._model), request, notes))

    # --- request ------------------------------------------------------------------------------------

    def _build(self, request: ModelRequest) -> tuple[dict[str, Any], list[str]]:
        settings = self._settings(request)
        wire: list[dict[str, Any]] = []
        if request.instructions:
            wire.append({"role": "system", "content": request.instructions})
        notes: list[str] = []
        media = _ToolMedia()
        for message in only_readable(request.messages, self.media_types, self._model, notes):
            if not carries_results(message):
                media.flush(wire)
            _append_wire(wire, message, media, notes)
        media.flush(wire)
        kwargs: dict[str, Any] = {"model": self._model, "messages": wire}
        if request.tools:
            kwargs["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
            if "parallel_tool_calls" in settings:
                kwargs["parallel_tool_calls"] = settings["parallel_tool_calls"]
            choice = settings.get("tool_choice")
            if choice is not None:
                kwargs["tool_choice"] = (
                    choice if choice in ("auto", "none", "required")
                    else {"type": "function", "function": {"name": choice}}
                )
        if "temperature" in settings:
            kwargs["temperature"] = settings["temperature"]
        if "max_output_tokens" in settings:
            kwargs[self._max_tokens_field] = settings["max_output_tokens"]
        if "response_format" in settings:
            kwargs["response_format"] = settings["response_format"]
        if "seed" in settings:
            kwargs["seed"] = settings["seed"]
        if "openai_extra_body" in settings:
            kwargs["extra_body"] = settings["openai_extra_body"]
        return kwargs, notes

    # --- response -----------------------------------------------------------------------------------

    def _parse(self, completion: Any) -> ModelResponse:
        choices = getattr(completion, "choices", None)
        if not choices:
            raise ModelResponseError(
                f"{self.provider} returned a response without choices for model {self._model!r}: "
                f"{str(completion)[:300]}",
                provider=self.provider, body=completion,
            )
        choice = choices[0]
        msg = choice.message
        parts: list[Part] = []
        extra = getattr(msg, "model_extra", None) or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            parts.append(ReasoningPart(reasoning))
        if msg.content:
            parts.append(TextPart(msg.content))
        for call in msg.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                continue
            parts.append(FunctionCall(call.id, function.name, function.arguments or "{}"))
        usage = _chat_usage(completion.usage)
        return ModelResponse(
            [Message("assistant", tuple(parts))], usage=usage, finish_reason=choice.finish_reason,
            model=getattr(completion, "model", None) or self._model, raw=completion,
            id=getattr(completion, "id", None) or None,
        )


def _noted(response: ModelResponse, request: ModelRequest, built: list[str]) -> ModelResponse:
    """Add what building the request noted, and the other vendors' reasoning left out of it.

    Plain reasoning is never sent back on this API, so it needs no note.
    """
    counts: dict[str, int] = {}
    for message in request.messages:
        for part in message.parts:
            if isinstance(part, ReasoningPart) and part.format is not None:
                counts[part.format] = counts.get(part.format, 0) + 1
    if not counts and not built:
        return response
    return dataclasses.replace(response, notes=(*response.notes, *built, *dropped_notes(counts, "chat completions")))


def _chat_usage(usage: Any) -> Usage | None:
    """`Usage` from a chat completion's usage, with cached prompt and reasoning tokens when reported."""
    if usage is None:
        return None
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    reasoning = getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None)
    return Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0, cache_read_tokens=cached or 0,
                 reasoning_tokens=reasoning or 0)


class _ToolMedia:
    """The images, audio and files of tool results, sent in one user message after the tool messages.

    A ``tool`` message takes only text, and an assistant turn's tool messages must follow it without
    another message in between: so the media of a run of tool messages wait here, labelled with the
    tool and call they came from, until the next message that is not a tool result.
    """

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.content: list[dict[str, Any]] = []

    def add(self, result: FunctionResult, notes: list[str]) -> str:
        """Keep `result`'s media for the next user message; return the text its tool message carries."""
        label = f"tool {self.names.get(result.call_id, 'call')!r} (call id {result.call_id})"
        sent: list[dict[str, Any]] = []
        kinds: set[str] = set()
        left_out: list[Media] = []
        for part in result.parts:
            if isinstance(part, UnknownPart) or (content := _media_part(part)) is None:
                left_out.append(part)
                continue
            sent.append(content)
            major = part.media_type.split("/", 1)[0]
            kinds.add(major if major in ("image", "audio") else "file")
        text = result.result
        if sent:
            what = " and ".join(sorted(kinds)).capitalize()
            self.content.append({"type": "text", "text": f"{what} returned by {label}:"})
            self.content.extend(sent)
            text = f"{text}\n[{len(sent)} attachment(s) of this result follow in the next user message]"
        return with_left_out(result, text, left_out, "OpenAI chat completions",
                             "chat completions cannot take this content", notes)

    def flush(self, wire: list[dict[str, Any]]) -> None:
        """Send the waiting media, if any, as one user message."""
        if self.content:
            wire.append({"role": "user", "content": self.content})
            self.content = []


def _append_wire(wire: list[dict[str, Any]], message: Message, media: _ToolMedia, notes: list[str]) -> None:
    role = message.role
    if carries_results(message):
        for part in message.parts:
            if isinstance(part, FunctionResult):
                text = media.add(part, notes) if part.parts else part.result
                wire.append({"role": "tool", "tool_call_id": part.call_id, "content": text})
        return
    if role == "assistant":
        media.names.update((p.call_id, p.name) for p in message.parts if isinstance(p, FunctionCall))
        wire.append(_assistant_entry(message))
        return
    parts = message.parts
    entry: dict[str, Any] = {"role": role}
    if all(isinstance(p, TextPart) for p in parts):
        entry["content"] = message.text
    else:
        entry["content"] = [c for p in parts if (c := _content_part(p, role)) is not None]
    if message.author_name:
        entry["name"] = message.author_name
    wire.append(entry)


def _assistant_entry(message: Message) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": "assistant", "content": message.text or None}
    calls = [
        {"id": p.call_id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
        for p in message.parts if isinstance(p, FunctionCall)
    ]
    if calls:
        entry["tool_calls"] = calls
    if message.author_name:
        entry["name"] = message.author_name
    return entry


def _media_part(part: DataPart | UriPart) -> dict[str, Any] | None:
    """Return the user-message content part for a tool's image, audio or PDF, or None if the API takes none."""
    if isinstance(part, UriPart):
        return {"type": "image_url", "image_url": {"url": part.uri}} if part.media_type.startswith("image/") else None
    if part.media_type in IMAGE_TYPES:
        url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"
        return {"type": "image_url", "image_url": {"url": url}}
    if part.media_type not in AUDIO_FORMATS and part.media_type != "application/pdf":
        return None  # not encoded: a part no model reads may be big
    encoded = base64.b64encode(part.data).decode()
    if part.media_type in AUDIO_FORMATS:
        return {"type": "input_audio", "input_audio": {"data": encoded, "format": AUDIO_FORMATS[part.media_type]}}
    return {"type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{encoded}"}}


def _content_part(part: Part, role: str) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, UriPart | DataPart):
        if isinstance(part, UriPart):
            url = part.uri
        else:
            url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"
        if part.media_type.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}}
        if isinstance(part, DataPart) and part.media_type in ("audio/wav", "audio/mpeg", "audio/mp3"):
            fmt = "wav" if part.media_type == "audio/wav" else "mp3"
            return {"type": "input_audio", "input_audio": {"data": base64.b64encode(part.data).decode(),
                                                           "format": fmt}}
        raise UsageError(
            f"OpenAI chat completions cannot take {part.media_type!r} content in a {role} message; "
            "send images (image/*) or audio (audio/wav, audio/mpeg), or convert the content to text"
        )
    # Reasoning and unknown parts stay in the session but are not sent back on this API.
    return None


@dataclass
class _ToolCallDraft:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _StreamAssembly:
    """Assembles chat completion chunks into one response (text, reasoning and tool-call deltas)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _ToolCallDraft] = {}
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.id: str | None = None
        self.chunks = 0

    def feed(self, chunk: Any) -> list[ModelStreamEvent]:
        """Take one chunk; return the deltas it carries."""
        if getattr(chunk, "model", None):
            self.model = chunk.model
        if self.id is None and getattr(chunk, "id", None):
            self.id = chunk.id
        if chunk.usage is not None:
            self.usage = _chat_usage(chunk.usage)
        events: list[ModelStreamEvent] = []
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            if choice.delta is not None:
                self._delta(choice.delta, events)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return events

    def _delta(self, delta: Any, events: list[ModelStreamEvent]) -> None:
        extra = getattr(delta, "model_extra", None) or {}
        reasoning = extra.get("reasoning_content") or extra.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            events.append(ReasoningDelta(reasoning))
        if delta.content:
            self.text.append(delta.content)
            events.append(TextDelta(delta.content))
        for tc in delta.tool_calls or ():
            draft = self.calls.setdefault(tc.index, _ToolCallDraft())
            if tc.id:
                draft.call_id = tc.id
            if tc.function is not None:
                if tc.function.name:
                    draft.name += tc.function.name
                if tc.function.arguments:
                    draft.arguments.append(tc.function.arguments)

    def finish(self, provider: str, model: str) -> ModelResponse:
        if self.finish_reason is None:
            raise stream_unfinished(provider, model, "before the model finished (no finish reason)")
        parts: list[Part] = []
        if self.reasoning:
            parts.append(ReasoningPart("".join(self.reasoning)))
        if self.text:
            parts.append(TextPart("".join(self.text)))
        for index in sorted(self.calls):
            draft = self.calls[index]
            if not draft.call_id or not draft.name:
                raise ModelResponseError(
                    f"the {provider} stream sent tool call #{index} without an id or name", provider=provider
                )
            arguments = "".join(draft.arguments) or "{}"
            parts.append(FunctionCall(draft.call_id, draft.name, arguments))
        return ModelResponse(
            [Message("assistant", tuple(parts))], usage=self.usage, finish_reason=self.finish_reason,
            model=self.model or model, id=self.id,
        )
