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
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._media import Media, only_readable, with_left_out
from ..errors import (
    ContextWindowExceeded,
    ModelAuthError,
    ModelBadRequest,
    ModelConnectionError,
    ModelError,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
    UsageError,
)
from ..exchanges import carries_results
from ..messages import (
    DataPart,
    FunctionCall,
    FunctionResult,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    UnknownPart,
    UriPart,
)
from .base import (
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
    import openai

__all__ = ["OpenAIChatModel"]

_INSTALL_HINT = 'the OpenAI client needs the openai package: pip install "contextpipe[openai]"'


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise UsageError(_INSTALL_HINT) from exc
    return openai


class OpenAIChatModel:
    """A chat model served over the OpenAI chat completions API.

    >>> model = OpenAIChatModel("llama3.2", base_url="http://127.0.0.1:11434/v1")  # Ollama
    >>> model.name
    'llama3.2'

    `max_retries` is the SDK's own retry count for connection errors, 408/409/429 and 5xx answers;
    `timeout` is seconds per request. Pass `client` to reuse a configured ``openai.AsyncOpenAI``.
    `media_types` says which media in tool results the model reads, as patterns (``("image/*",)``);
    the rest are left out, named in the result's text and the trace. None (the default) sends all
    the API takes; ``()`` suits a text-only model.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        organization: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        settings: ModelSettings | None = None,
        client: openai.AsyncOpenAI | None = None,
        max_tokens_field: str = "max_completion_tokens",
        media_types: Sequence[str] | None = None,
    ) -> None:
        self._model = model or os.environ.get("OPENAI_MODEL") or ""
        if not self._model:
            raise UsageError(
                "no model name: pass OpenAIChatModel('gpt-4o-mini') (or your server's model name) "
                "or set OPENAI_MODEL"
            )
        self.settings: ModelSettings = settings or ModelSettings()
        """Default settings for every call; a request's settings override them."""
        self._max_tokens_field = max_tokens_field
        self.media_types = None if media_types is None else tuple(media_types)
        """Patterns of the media types this model reads in tool results (None: whatever the API takes)."""
        if client is not None:
            self._client = client
        else:
            sdk = _import_openai()
            base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
            api_key = api_key or os.environ.get("OPENAI_API_KEY")
            if not api_key:
                if base_url is None:
                    raise UsageError(
                        "no API key: set OPENAI_API_KEY or pass api_key=...; for a local "
                        "OpenAI-compatible server (Ollama, vLLM, llama.cpp) pass base_url=... instead"
                    )
                api_key = "unused"  # local servers accept any key
            self._client = sdk.AsyncOpenAI(
                api_key=api_key, base_url=base_url, organization=organization, timeout=timeout,
                max_retries=max_retries,
            )
        self._owns_client = client is None
        self._provider = "azure.ai.openai" if type(self._client).__name__ == "AsyncAzureOpenAI" else "openai"

    @property
    def provider(self) -> str:
        """The provider as OpenTelemetry's ``gen_ai.provider.name`` names it (``openai``, ``azure.ai.openai``)."""
        return self._provider

    @classmethod
    def azure(
        cls,
        deployment: str,
        *,
        endpoint: str | None = None,
        api_key: str | None = None,
        api_version: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        settings: ModelSettings | None = None,
    ) -> OpenAIChatModel:
        """Return a model for an Azure OpenAI deployment.

        Reads ``AZURE_OPENAI_ENDPOINT``, ``AZURE_OPENAI_API_KEY`` and ``OPENAI_API_VERSION`` when the
        arguments are not given.
        """
        sdk = _import_openai()
        endpoint = endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        api_key = api_key or os.environ.get("AZURE_OPENAI_API_KEY")
        api_version = api_version or os.environ.get("OPENAI_API_VERSION")
        missing = [n for n, v in (("endpoint / AZURE_OPENAI_ENDPOINT", endpoint),
                                  ("api_key / AZURE_OPENAI_API_KEY", api_key),
                                  ("api_version / OPENAI_API_VERSION", api_version)) if not v]
        if missing:
            raise UsageError("Azure OpenAI needs " + ", ".join(missing))
        client = sdk.AsyncAzureOpenAI(
            azure_endpoint=endpoint, api_key=api_key, api_version=api_version, timeout=timeout,
            max_retries=max_retries,
        )
        model = cls(deployment, client=client, settings=settings)
        model._owns_client = True
        return model

    async def close(self) -> None:
        """Close the HTTP client, unless it was passed in (then its owner closes it)."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def name(self) -> str:
        """The model (or Azure deployment) name."""
        return self._model

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The underlying SDK client."""
        return self._client

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the whole response."""
        kwargs, notes = self._build(request)
        try:
            completion = await self._client.chat.completions.create(**kwargs)
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
            stream = await self._client.chat.completions.create(**kwargs)
            async for chunk in stream:
                assembly.chunks += 1
                for event in assembly.feed(chunk):
                    yield event
        except Exception as exc:
            if assembly.chunks:
                raise ModelResponseError(
                    f"the {self._provider} stream for model {self._model!r} was cut after {assembly.chunks} "
                    f"chunk(s) ({type(exc).__name__}: {exc}); retry the call",
                    provider=self._provider,
                ) from exc
            raise self._translate(exc) from exc
        yield ResponseComplete(_noted(assembly.finish(self._provider, self._model), request, notes))

    # --- request ------------------------------------------------------------------------------------

    def _build(self, request: ModelRequest) -> tuple[dict[str, Any], list[str]]:
        settings: ModelSettings = self.settings | request.settings if self.settings else request.settings
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
                f"{self._provider} returned a response without choices for model {self._model!r}: "
                f"{str(completion)[:300]}",
                provider=self._provider, body=completion,
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

    # --- errors -------------------------------------------------------------------------------------

    def _translate(self, exc: Exception) -> ModelError:
        """Map an SDK (or transport) exception to the most specific contextpipe `ModelError`."""
        sdk = _import_openai()
        provider, model = self._provider, self._model
        where = f"{provider} ({self._client.base_url})"
        if isinstance(exc, sdk.APITimeoutError):
            return ModelTimeout(
                f"{where} did not answer in time for model {model!r}; raise timeout=... or retry later",
                provider=provider,
            )
        if isinstance(exc, sdk.APIConnectionError):
            return ModelConnectionError(
                f"could not reach {where}: {exc}; check base_url / OPENAI_BASE_URL and that the server runs",
                provider=provider,
            )
        if isinstance(exc, sdk.APIResponseValidationError):
            return ModelResponseError(
                f"{where} sent a response that is not a valid chat completion: {exc}", provider=provider,
                status_code=exc.status_code, body=exc.body,
            )
        if isinstance(exc, sdk.APIStatusError):
            status, body = exc.status_code, exc.body
            detail = _error_detail(exc)
            if isinstance(exc, sdk.AuthenticationError | sdk.PermissionDeniedError):
                return ModelAuthError(
                    f"{where} refused the credentials (HTTP {status}): {detail}; check OPENAI_API_KEY / api_key "
                    "and that the key may use this model",
                    provider=provider, status_code=status, body=body,
                )
            if isinstance(exc, sdk.RateLimitError):
                retry_after = _retry_after(exc.response.headers)
                hint = f"retry after {retry_after:g} s" if retry_after is not None else "retry later"
                return ModelRateLimited(
                    f"{where} is rate limiting (HTTP 429): {detail}; {hint}",
                    retry_after=retry_after, provider=provider, status_code=status, body=body,
                )
            if status >= 500:
                return ModelServerError(
                    f"{where} failed with HTTP {status}: {detail}; retry later", provider=provider,
                    status_code=status, body=body,
                )
            if _is_context_overflow(exc, detail):
                return ContextWindowExceeded(
                    f"the request is larger than model {model!r}'s context window: {detail}; bound "
                    "what is sent (History(store, max_messages=...)) or use a model with a larger window",
                    provider=provider, status_code=status, body=body,
                )
            if status == 404:
                return ModelBadRequest(
                    f"{where} answered 404 for model {model!r}: {detail}; check the model (or deployment) "
                    "name and the base URL",
                    provider=provider, status_code=status, body=body,
                )
            return ModelBadRequest(
                f"{where} rejected the request (HTTP {status}): {detail}", provider=provider,
                status_code=status, body=body,
            )
        if isinstance(exc, ValueError | TypeError | KeyError):
            return ModelResponseError(f"{where} sent a response that could not be read: {exc}", provider=provider)
        if isinstance(exc, sdk.OpenAIError):
            return ModelError(f"{where}: {exc}", provider=provider)
        # Transport errors the SDK did not wrap (a stream cut mid-way surfaces here).
        return ModelConnectionError(
            f"the connection to {where} failed while reading the response: {type(exc).__name__}: {exc}",
            provider=provider,
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
    notes = tuple(f"left out {n} reasoning part(s) of format {fmt!r}: chat completions cannot accept them"
                  for fmt, n in sorted(counts.items()))
    return dataclasses.replace(response, notes=response.notes + tuple(built) + notes)


def _chat_usage(usage: Any) -> Usage | None:
    """`Usage` from a chat completion's usage, with cached prompt and reasoning tokens when reported."""
    if usage is None:
        return None
    prompt_details = getattr(usage, "prompt_tokens_details", None)
    completion_details = getattr(usage, "completion_tokens_details", None)
    return Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0,
                 cache_read_tokens=(getattr(prompt_details, "cached_tokens", None) or 0) if prompt_details else 0,
                 reasoning_tokens=(getattr(completion_details, "reasoning_tokens", None) or 0)
                 if completion_details else 0)


def _error_detail(exc: Any) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body["error"] if isinstance(body.get("error"), dict) else body
        message = inner.get("message")
        if message:
            return str(message)
    return str(getattr(exc, "message", exc))


def _is_context_overflow(exc: Any, detail: str) -> bool:
    code = getattr(exc, "code", None)
    if code in ("context_length_exceeded", "string_above_max_length"):
        return True
    lowered = detail.lower()
    return any(s in lowered for s in ("maximum context length", "context window", "context_length_exceeded",
                                      "too many tokens", "prompt is too long"))


def _retry_after(headers: Any) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) * scale
        except ValueError:
            continue
    return None


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


_AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""Image types OpenAI's APIs read inline (an image by URL is fetched by the service, whatever its type)."""


def _media_part(part: DataPart | UriPart) -> dict[str, Any] | None:
    """Return the user-message content part for a tool's image, audio or PDF, or None if the API takes none."""
    if isinstance(part, UriPart):
        return {"type": "image_url", "image_url": {"url": part.uri}} if part.media_type.startswith("image/") else None
    if part.media_type in _IMAGE_TYPES:
        url = f"data:{part.media_type};base64,{base64.b64encode(part.data).decode()}"
        return {"type": "image_url", "image_url": {"url": url}}
    encoded = base64.b64encode(part.data).decode()
    if part.media_type in _AUDIO_FORMATS:
        return {"type": "input_audio", "input_audio": {"data": encoded, "format": _AUDIO_FORMATS[part.media_type]}}
    if part.media_type == "application/pdf":
        return {"type": "file", "file": {"filename": "document.pdf",
                                         "file_data": f"data:application/pdf;base64,{encoded}"}}
    return None


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
        events: list[ModelStreamEvent] = []
        if getattr(chunk, "model", None):
            self.model = chunk.model
        if self.id is None and getattr(chunk, "id", None):
            self.id = chunk.id
        if chunk.usage is not None:
            self.usage = _chat_usage(chunk.usage)
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
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
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        return events

    def finish(self, provider: str, model: str) -> ModelResponse:
        if self.finish_reason is None:
            raise ModelResponseError(
                f"the {provider} stream for model {model!r} ended before the model finished (no finish "
                "reason); the connection was probably cut: retry the call",
                provider=provider,
            )
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
