"""`AnthropicChatModel`: Claude through the Messages API and the official `anthropic` SDK.

The Anthropic wire format lives only in this module; everything else speaks contextpipe `Message`s.

- Thinking blocks are kept as `ReasoningPart`s (format ``anthropic.thinking``, the signature in
  `ReasoningPart.encrypted`) and redacted thinking as ``anthropic.redacted_thinking``; both are stored
  with the session and sent back unchanged and in order, as the API requires in tool loops.
  Reasoning of other vendors is left out of the request, with a note in the call's trace.
- Prompt caching is on by default: cache breakpoints go on the tools, the instructions, the end of
  the previous call's prompt (to read it) and the end of this one (to write it). ``cache=None`` turns
  it off, ``cache="1h"`` picks the one-hour TTL. `Usage` reports cache reads and writes.
- A tool result's images (JPEG, PNG, GIF, WebP, inline or by URL) and documents (PDF, plain text)
  go inside its ``tool_result`` block, after the text; other media (audio, other image types) are
  left out, named in a note at the end of the result's text and in the call's trace.
- Stop reasons map to contextpipe's: ``end_turn`` -> ``stop``, ``tool_use`` -> ``tool_calls``,
  ``max_tokens`` -> ``length``, ``refusal`` -> ``content_filter``; a ``pause_turn`` is continued
  automatically.

Configuration comes from arguments or ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL`` and
``ANTHROPIC_MODEL``.
"""

from __future__ import annotations

import base64
import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self, TypedDict, Unpack

from .._media import Media, only_readable, with_left_out
from ..errors import UsageError
from ..messages import DataPart, FunctionCall, FunctionResult, Message, ReasoningPart, TextPart, UnknownPart, UriPart
from ._anthropic_answers import REDACTED, THINKING, Merged, StreamAssembly, message_usage
from ._client import IMAGE_TYPES, ClientModel, Connection, Vendor, dropped_notes, model_name, stream_unfinished
from .base import ModelRequest, ModelResponse, ModelSettings, ModelStreamEvent, ResponseComplete

if TYPE_CHECKING:
    import anthropic

    from ..messages import Part

__all__ = ["AnthropicChatModel"]

_NO_CACHE_BLOCKS = ("thinking", "redacted_thinking")
_MAX_PAUSES = 5

ANTHROPIC = Vendor(
    label="Anthropic", package="anthropic", error_base="AnthropicError", key_env="ANTHROPIC_API_KEY",
    url_env="ANTHROPIC_BASE_URL", answer="message",
    window_hint="History(store, max_messages=...), Compaction", overloaded=529, too_large=True,
    stream_statuses={"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500,
                     "invalid_request_error": 400, "authentication_error": 401, "permission_error": 403},
)
"""The Messages API as error messages and configuration name it (and the status of each stream error type)."""


class AnthropicOptions(TypedDict, total=False):
    """The constructor's options that `AnthropicChatModel.bedrock` and `AnthropicChatModel.vertex` pass on."""

    max_tokens: int
    """``max_tokens`` sent when the settings give no ``max_output_tokens`` (default 4096)."""
    cache: Literal["5m", "1h"] | None
    """Prompt-cache TTL for the automatic breakpoints, or None for no caching (default ``5m``)."""
    settings: ModelSettings | None
    """Default settings for every call."""
    media_types: Sequence[str] | None
    """Patterns of the media types the model reads in tool results (default: whatever the API takes)."""


class AnthropicChatModel(ClientModel["anthropic.AsyncAnthropic"]):
    """Claude over the Anthropic Messages API (see the module docstring).

    >>> model = AnthropicChatModel("claude-sonnet-5", api_key="sk-ant-example")
    >>> model.name, model.provider
    ('claude-sonnet-5', 'anthropic')

    `max_tokens` is sent when a call's settings carry no ``max_output_tokens`` (the API requires one).
    `max_retries` is the SDK's own retry count (connection errors, 408/409/429, 5xx and 529
    overloaded); `timeout` is seconds per request. Pass `client` to reuse a configured
    ``anthropic.AsyncAnthropic`` (or a Bedrock / Vertex client).
    `media_types` says which media in tool results the model reads, as patterns (``("image/*",)``);
    the rest are left out, named in the result's text and the trace. None (the default) sends all
    the API takes; ``()`` suits a text-only model.
    """

    def __init__(self, model: str | None = None, *, api_key: str | None = None, base_url: str | None = None,
                 timeout: float = 600.0, max_retries: int = 2, max_tokens: int = 4096,
                 cache: Literal["5m", "1h"] | None = "5m", settings: ModelSettings | None = None,
                 client: anthropic.AsyncAnthropic | None = None, media_types: Sequence[str] | None = None) -> None:
        name = model_name(model, "ANTHROPIC_MODEL", "AnthropicChatModel('claude-sonnet-5')")
        if cache not in ("5m", "1h", None):
            raise UsageError(f"cache must be '5m', '1h' or None (off), got {cache!r}")
        if max_tokens < 1:
            raise UsageError(f"max_tokens must be at least 1, got {max_tokens}")
        owned = client is None
        if client is None:
            api_key, base_url = ANTHROPIC.credentials(api_key, base_url)
            client = ANTHROPIC.sdk().AsyncAnthropic(api_key=api_key, base_url=base_url, timeout=timeout,
                                                    max_retries=max_retries)
        super().__init__(name, Connection(client, ANTHROPIC, "anthropic", owned), settings,
                         media_types)
        self.cache = cache
        """Prompt-cache TTL for the automatic breakpoints, or None for no caching."""
        self.max_tokens = max_tokens
        """``max_tokens`` sent when the settings give no ``max_output_tokens``."""

    @classmethod
    def bedrock(cls, model: str, *, aws_region: str | None = None, aws_access_key: str | None = None,
                aws_secret_key: str | None = None, aws_session_token: str | None = None,
                aws_profile: str | None = None, api_key: str | None = None, base_url: str | None = None,
                timeout: float = 600.0, max_retries: int = 2, **options: Unpack[AnthropicOptions]) -> Self:
        """Return Claude on Amazon Bedrock, through the SDK's ``AsyncAnthropicBedrock``.

        Credentials follow the SDK (arguments, ``AWS_*`` variables, a profile, or a Bedrock API key
        in `api_key` / ``AWS_BEARER_TOKEN_BEDROCK``). `model` is a Bedrock model id such as
        ``anthropic.claude-sonnet-5-v1:0``. Other options go to the constructor.
        """
        client = _cloud_client("AsyncAnthropicBedrock", "Bedrock", aws_region=aws_region,
                               aws_access_key=aws_access_key, aws_secret_key=aws_secret_key,
                               aws_session_token=aws_session_token, aws_profile=aws_profile, api_key=api_key,
                               base_url=base_url, timeout=timeout, max_retries=max_retries)
        return cls(model, client=client, **options)._adopt(client, "aws.bedrock")

    @classmethod
    def vertex(cls, model: str, *, region: str | None = None, project_id: str | None = None,
               access_token: str | None = None, base_url: str | None = None, timeout: float = 600.0,
               max_retries: int = 2, **options: Unpack[AnthropicOptions]) -> Self:
        """Return Claude on Google Cloud Vertex AI, through the SDK's ``AsyncAnthropicVertex``.

        `region` / ``CLOUD_ML_REGION`` and `project_id` / ``ANTHROPIC_VERTEX_PROJECT_ID`` are needed;
        without `access_token` the SDK uses Google application-default credentials (``google-auth``).
        """
        region = region or os.environ.get("CLOUD_ML_REGION")
        if not region:
            raise UsageError("Vertex AI needs a region: pass region=... or set CLOUD_ML_REGION")
        project = {"project_id": project_id} if project_id else {}
        client = _cloud_client("AsyncAnthropicVertex", "Vertex AI", region=region, access_token=access_token,
                               base_url=base_url, timeout=timeout, max_retries=max_retries, **project)
        return cls(model, client=client, **options)._adopt(client, "gcp.vertex_ai")

    # --- calls --------------------------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Send `request` and return the whole response (a ``pause_turn`` is continued)."""
        kwargs, notes = self._build(request)
        merged: Merged | None = None
        for _ in range(_MAX_PAUSES + 1):
            try:
                message = await self.client.messages.create(**kwargs)
            except Exception as exc:
                raise self._translate(exc) from exc
            blocks = [b.model_dump(exclude_none=True) for b in message.content]
            merged = Merged.add(merged, blocks, message.stop_reason, message_usage(message.usage), message.model,
                                 getattr(message, "id", None))
            if message.stop_reason != "pause_turn":
                break
            kwargs = _continue(kwargs, merged.blocks)
        assert merged is not None
        return merged.response(self._model, notes, raw=message)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Stream `request`: text and thinking deltas, then the assembled response."""
        kwargs, notes = self._build(request)
        merged: Merged | None = None
        for _ in range(_MAX_PAUSES + 1):
            assembly = StreamAssembly()
            try:
                stream = await self.client.messages.create(**kwargs, stream=True)
                async with stream:  # closes the connection even when the caller stops early
                    async for event in stream:
                        assembly.events += 1
                        for out in assembly.feed(event):
                            yield out
            except Exception as exc:
                raise self._translate(exc, streamed=assembly.events) from exc
            if not assembly.stopped:
                raise stream_unfinished(self.provider, self._model,
                                        f"after {assembly.events} event(s) without message_stop")
            merged = Merged.add(merged, assembly.blocks(self.provider), assembly.stop_reason, assembly.usage(),
                                 assembly.model, assembly.message_id)
            if assembly.stop_reason != "pause_turn":
                break
            kwargs = _continue(kwargs, merged.blocks)
        assert merged is not None
        yield ResponseComplete(merged.response(self._model, notes))

    async def count_tokens(self, request: ModelRequest) -> int:
        """Return the exact input tokens of `request`, from the API's token-counting endpoint.

        This is one HTTP call (free, rate limited separately); the offline estimate that traces and
        compaction use needs none and is calibrated from the usage each call reports.
        """
        kwargs, _ = self._build(request)
        for key in ("max_tokens", "stream", "temperature", "extra_body", "stop_sequences"):
            kwargs.pop(key, None)
        try:
            counted = await self.client.messages.count_tokens(**kwargs)
        except Exception as exc:
            raise self._translate(exc) from exc
        return int(counted.input_tokens)

    # --- request ------------------------------------------------------------------------------------

    def _build(self, request: ModelRequest) -> tuple[dict[str, Any], list[str]]:
        settings = self._settings(request)
        notes: list[str] = []
        messages = only_readable(request.messages, self.media_types, self._model, notes)
        wire, system_texts = _conversation(request, messages, notes)
        kwargs: dict[str, Any] = {"model": self._model, "messages": wire,
                                  "max_tokens": settings.get("max_output_tokens", self.max_tokens)}
        control: dict[str, Any] | None = None
        if self.cache is not None:
            control = {"type": "ephemeral"} if self.cache == "5m" else {"type": "ephemeral", "ttl": self.cache}
        if system_texts:
            text = "\n\n".join(system_texts)
            kwargs["system"] = text if control is None else [{"type": "text", "text": text, "cache_control": control}]
        if request.tools:
            kwargs.update(_tools(request, settings, control))
        if control is not None:
            _place_breakpoints(wire, control)
        self._thinking(kwargs, settings, notes)
        _output_options(kwargs, settings, notes)
        return kwargs, notes

    def _thinking(self, kwargs: dict[str, Any], settings: ModelSettings, notes: list[str]) -> None:
        thinking = settings.get("anthropic_thinking")
        if not thinking:
            return
        if thinking.get("type") in ("enabled", "adaptive") and not _thinking_can_continue(kwargs["messages"]):
            notes.append("thinking turned off for this call: the last tool call was made without a thinking "
                         "block (by another model), and the API rejects such a continuation with thinking on")
            return
        kwargs["thinking"] = thinking
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and "max_output_tokens" not in settings and budget >= kwargs["max_tokens"]:
            # The API needs max_tokens above the thinking budget; leave the usual room for the answer.
            kwargs["max_tokens"] = budget + self.max_tokens


def _cloud_client(kind: str, cloud: str, **arguments: Any) -> Any:
    """Build the SDK's client for Claude on a cloud (``AsyncAnthropicBedrock``, ``AsyncAnthropicVertex``)."""
    sdk = ANTHROPIC.sdk()
    try:
        return getattr(sdk, kind)(**arguments)
    except (ValueError, sdk.AnthropicError) as exc:
        raise UsageError(f"cannot set up the {cloud} client: {exc}") from exc


# --- wire format -------------------------------------------------------------------------------------


def _conversation(request: ModelRequest, messages: Sequence[Message],
                  notes: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Return the wire messages and the system texts (instructions, then system messages) of `request`."""
    system_texts = [request.instructions] if request.instructions else []
    wire: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    for message in messages:
        if message.role == "system":
            if message.text:
                system_texts.append(message.text)
            continue
        _append(wire, message, dropped, notes)
    notes.extend(dropped_notes(dropped, "Claude"))
    if not wire or wire[0]["role"] != "user":
        wire.insert(0, {"role": "user", "content": [{"type": "text", "text": "(conversation continues)"}]})
        notes.append("added a placeholder user turn: the Messages API needs the conversation to start with one")
    return wire, system_texts


def _tools(request: ModelRequest, settings: ModelSettings, control: dict[str, Any] | None) -> dict[str, Any]:
    tools = [{"name": t.name, "description": t.description, "input_schema": _schema(t.parameters)}
             for t in request.tools]
    if control is not None:
        tools[-1]["cache_control"] = control
    out: dict[str, Any] = {"tools": tools}
    choice = settings.get("tool_choice")
    tool_choice: dict[str, Any] | None = None
    if choice is not None:
        tool_choice = {"auto": {"type": "auto"}, "none": {"type": "none"},
                       "required": {"type": "any"}}.get(choice, {"type": "tool", "name": choice})
    if settings.get("parallel_tool_calls") is False:
        tool_choice = tool_choice or {"type": "auto"}
        if tool_choice["type"] != "none":
            tool_choice["disable_parallel_tool_use"] = True
    if tool_choice is not None:
        out["tool_choice"] = tool_choice
    return out


def _output_options(kwargs: dict[str, Any], settings: ModelSettings, notes: list[str]) -> None:
    extra: dict[str, Any] = {}
    if "temperature" in settings:
        # Not a typed argument of every SDK version's create(); sent as a body field.
        extra["temperature"] = settings["temperature"]
    response_format = settings.get("response_format")
    if response_format:
        schema = (response_format.get("json_schema") or {}).get("schema")
        if response_format.get("type") == "json_schema" and isinstance(schema, dict):
            kwargs["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        else:
            notes.append(f"response_format {response_format.get('type')!r} is not supported by the Messages "
                         "API (only json_schema); sent without it")
    if "seed" in settings:
        notes.append("seed is not supported by the Messages API; sent without it")
    extra.update(settings.get("anthropic_extra_body") or {})
    if extra:
        kwargs["extra_body"] = extra


def _schema(parameters: dict[str, Any]) -> dict[str, Any]:
    schema = dict(parameters) if parameters else {}
    schema.setdefault("type", "object")
    return schema


def _append(wire: list[dict[str, Any]], message: Message, dropped: dict[str, int], notes: list[str]) -> None:
    """Add `message` to `wire`, merging into the previous turn when the role repeats."""
    role = "assistant" if message.role == "assistant" else "user"
    if role == "assistant":
        blocks = [b for p in message.parts if (b := _assistant_block(p, dropped, notes)) is not None]
    else:
        blocks = [b for p in message.parts if (b := _user_block(p, message.role, dropped, notes)) is not None]
    if not blocks:
        return
    if wire and wire[-1]["role"] == role:
        wire[-1]["content"].extend(blocks)
    else:
        wire.append({"role": role, "content": blocks})
    if role == "user":
        # Tool results must open the user turn that answers the calls.
        wire[-1]["content"].sort(key=lambda b: b.get("type") != "tool_result")


def _user_block(part: Part, role: str, dropped: dict[str, int], notes: list[str]) -> dict[str, Any] | None:
    if isinstance(part, FunctionResult):
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": part.call_id}
        content = _tool_result_content(part, notes) if part.parts else part.result
        if content:
            result["content"] = content
        if part.is_error:
            result["is_error"] = True
        return result
    if isinstance(part, ReasoningPart | FunctionCall):
        return None
    if isinstance(part, UnknownPart):
        return _unknown_block(part, dropped)
    return _content_block(part, role)


def _tool_result_content(part: FunctionResult, notes: list[str]) -> list[dict[str, Any]]:
    """Return the blocks of a result with media: its text, then the images and documents Claude accepts."""
    media: list[dict[str, Any]] = []
    left_out: list[Media] = []
    for item in part.parts:
        block = _content_block(item, "user") if _accepted_in_result(item) else None
        if block is None:
            left_out.append(item)
        else:
            media.append(block)
    text = with_left_out(part, part.result, left_out, "Claude", "Claude cannot take this content in a tool result",
                         notes)
    return ([{"type": "text", "text": text}] if text else []) + media


def _accepted_in_result(part: Media) -> bool:
    """Whether a ``tool_result`` block may carry `part`: an image of a type Claude reads, a PDF, plain text."""
    if isinstance(part, UnknownPart):
        return False
    media_type = part.media_type
    if isinstance(part, UriPart):
        return media_type in IMAGE_TYPES or media_type == "application/pdf"
    return media_type in IMAGE_TYPES or media_type in ("application/pdf", "text/plain")


def _unknown_block(part: UnknownPart, dropped: dict[str, int]) -> dict[str, Any] | None:
    """Return a block kept from an earlier Claude answer verbatim; leave out other unknown kinds."""
    if part.kind.startswith("anthropic."):
        return dict(part.payload)
    dropped["part:" + part.kind] = dropped.get("part:" + part.kind, 0) + 1
    return None


def _assistant_block(part: Part, dropped: dict[str, int], notes: list[str]) -> dict[str, Any] | None:
    if isinstance(part, FunctionCall):
        return _tool_use(part, notes)
    if isinstance(part, ReasoningPart):
        if part.format == THINKING and part.encrypted is not None:
            return {"type": "thinking", "thinking": part.text, "signature": part.encrypted}
        if part.format == REDACTED and part.encrypted is not None:
            return {"type": "redacted_thinking", "data": part.encrypted}
        fmt = part.format or "plain"
        dropped[fmt] = dropped.get(fmt, 0) + 1
        return None
    if isinstance(part, UnknownPart):
        return _unknown_block(part, dropped)
    return _content_block(part, "assistant")


def _tool_use(part: FunctionCall, notes: list[str]) -> dict[str, Any]:
    try:
        arguments = json.loads(part.arguments) if part.arguments.strip() else {}
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        notes.append(f"tool call {part.call_id} had arguments that are not a JSON object; sent as "
                     "{'arguments': <text>}")
        arguments = {"arguments": part.arguments}
    return {"type": "tool_use", "id": part.call_id, "name": part.name, "input": arguments}


def _content_block(part: Part, role: str) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text} if part.text else None
    if isinstance(part, DataPart):
        data = base64.b64encode(part.data).decode()
        if part.media_type.startswith("image/"):
            return {"type": "image", "source": {"type": "base64", "media_type": part.media_type, "data": data}}
        if part.media_type == "application/pdf":
            return {"type": "document", "source": {"type": "base64", "media_type": part.media_type, "data": data}}
        if part.media_type == "text/plain":
            return {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                   "data": part.data.decode("utf-8", "replace")}}
    elif isinstance(part, UriPart):
        inline = _data_uri(part.uri)
        if inline is not None:  # Claude fetches http(s) URLs only: a data: URI goes inline
            return _content_block(DataPart(inline, part.media_type), role)
        if part.media_type.startswith("image/"):
            return {"type": "image", "source": {"type": "url", "url": part.uri}}
        if part.media_type == "application/pdf":
            return {"type": "document", "source": {"type": "url", "url": part.uri}}
    else:
        return None
    raise UsageError(
        f"the Anthropic Messages API cannot take {part.media_type!r} content in a {role} message; send images "
        "(image/*), PDF or plain-text documents, or convert the content to text"
    )


def _data_uri(uri: str) -> bytes | None:
    """Return the bytes of a base64 ``data:`` URI, or None for any other URI."""
    if not uri.startswith("data:"):
        return None
    header, _, data = uri.partition(",")
    if not header.endswith(";base64"):
        return urllib.parse.unquote_to_bytes(data)
    try:
        return base64.b64decode(data, validate=True)
    except ValueError:
        return None


def _place_breakpoints(wire: list[dict[str, Any]], control: dict[str, Any]) -> None:
    """Mark the end of the previous call's prompt (to read the cache) and of this one (to write it)."""
    targets = [len(wire) - 1]
    last_assistant = max((i for i, m in enumerate(wire) if m["role"] == "assistant"), default=-1)
    if last_assistant > 0:
        targets.insert(0, last_assistant - 1)
    for index in targets:
        for block in reversed(wire[index]["content"]):
            if block.get("type") not in _NO_CACHE_BLOCKS:
                block["cache_control"] = control
                break


def _thinking_can_continue(wire: list[dict[str, Any]]) -> bool:
    """Return False when the request ends in a tool exchange whose call turn has no thinking block first."""
    if len(wire) < 2 or wire[-1]["role"] != "user":
        return True
    last = wire[-2]
    if last["role"] != "assistant" or not any(b.get("type") == "tool_use" for b in last["content"]):
        return True
    return last["content"][0].get("type") in _NO_CACHE_BLOCKS


def _continue(kwargs: dict[str, Any], blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the request that continues a paused turn: the same one, with the partial answer appended."""
    return dict(kwargs, messages=[*kwargs["messages"], {"role": "assistant", "content": blocks}])
