"""Claude's answers into a `ModelResponse`: content blocks from a whole message or from stream events.

`AnthropicChatModel` (`models.anthropic`) builds the request; this module assembles what comes back:
`StreamAssembly` turns the Messages API's stream events into content blocks (and text and thinking
deltas), `Merged` joins the answers of the calls that continue a paused turn, and `parts` turns
blocks into contextpipe parts (thinking as `ReasoningPart`s of format ``anthropic.thinking`` with
their signature, other blocks kept verbatim as ``anthropic.*`` `UnknownPart`s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ModelResponseError
from ..messages import FunctionCall, Message, Part, ReasoningPart, TextPart, UnknownPart
from .base import ModelResponse, ModelStreamEvent, ReasoningDelta, TextDelta, Usage

__all__ = ["REDACTED", "THINKING", "Merged", "StreamAssembly", "content_parts", "message_usage"]

THINKING: Literal["anthropic.thinking"] = "anthropic.thinking"
REDACTED: Literal["anthropic.redacted_thinking"] = "anthropic.redacted_thinking"
_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                 "model_context_window_exceeded": "length", "refusal": "content_filter", "pause_turn": "pause_turn"}


def message_usage(usage: Any) -> Usage:
    """Return the `Usage` of a message's usage (cache reads and writes counted in the input)."""
    if usage is None:
        return Usage()
    read = getattr(usage, "cache_read_input_tokens", None) or 0
    write = getattr(usage, "cache_creation_input_tokens", None) or 0
    details = getattr(usage, "output_tokens_details", None)
    reasoning = getattr(details, "thinking_tokens", 0) if details is not None else 0
    return Usage((getattr(usage, "input_tokens", None) or 0) + read + write, getattr(usage, "output_tokens", 0) or 0,
                 read, write, reasoning or 0)


def content_parts(blocks: list[dict[str, Any]]) -> list[Part]:
    """Return the contextpipe parts of an answer's content blocks."""
    out: list[Part] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            if block.get("text"):
                out.append(TextPart(block["text"]))
        elif kind == "thinking":
            out.append(ReasoningPart(block.get("thinking", ""), block.get("signature", ""), THINKING))
        elif kind == "redacted_thinking":
            out.append(ReasoningPart("", block.get("data", ""), REDACTED))
        elif kind == "tool_use":
            out.append(FunctionCall(block["id"], block["name"], json.dumps(block.get("input") or {})))
        else:
            out.append(UnknownPart(f"anthropic.{kind}", dict(block)))
    return out


@dataclass
class Merged:
    """The content of one answer, over the calls that continue a paused turn."""

    blocks: list[dict[str, Any]]
    stop_reason: str | None
    usage: Usage
    model: str | None
    id: str | None

    @classmethod
    def add(cls, merged: Merged | None, blocks: list[dict[str, Any]], stop_reason: str | None, usage: Usage,
            model: str | None, message_id: str | None) -> Merged:
        """Add one call's answer; the id is the last call's (the message that finished the turn)."""
        if merged is None:
            return cls(list(blocks), stop_reason, usage, model, message_id)
        return cls([*merged.blocks, *blocks], stop_reason, merged.usage + usage, model or merged.model,
                   message_id or merged.id)

    def response(self, model: str, notes: list[str], raw: Any = None) -> ModelResponse:
        reason = self.stop_reason
        return ModelResponse([Message("assistant", tuple(content_parts(self.blocks)))], usage=self.usage,
                             finish_reason=_STOP_REASONS.get(reason or "", reason), model=self.model or model,
                             raw=raw, notes=tuple(notes), id=self.id)


@dataclass
class _Block:
    data: dict[str, Any]
    pieces: list[str] = field(default_factory=list)


class StreamAssembly:
    """Assembles Messages API stream events into content blocks."""

    def __init__(self) -> None:
        self.events = 0
        self.stopped = False
        self.stop_reason: str | None = None
        self.model: str | None = None
        self.message_id: str | None = None
        self._blocks: dict[int, _Block] = {}
        self._start_usage: Any = None
        self._delta_usage: Any = None

    def feed(self, event: Any) -> list[ModelStreamEvent]:
        kind = event.type
        if kind == "message_start":
            self.model = event.message.model
            self.message_id = getattr(event.message, "id", None)
            self._start_usage = event.message.usage
        elif kind == "content_block_start":
            self._blocks[event.index] = _Block(event.content_block.model_dump(exclude_none=True))
        elif kind == "content_block_delta":
            block = self._blocks.get(event.index)
            if block is None:
                raise ValueError(f"delta for content block {event.index} that was never started")
            delta = event.delta
            if delta.type == "text_delta":
                block.pieces.append(delta.text)
                return [TextDelta(delta.text)]
            if delta.type == "thinking_delta":
                block.pieces.append(delta.thinking)
                return [ReasoningDelta(delta.thinking)]
            if delta.type == "input_json_delta":
                block.pieces.append(delta.partial_json)
            elif delta.type == "signature_delta":
                block.data["signature"] = delta.signature
            elif delta.type == "citations_delta":
                block.data.setdefault("citations", []).append(delta.citation.model_dump(exclude_none=True))
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason
            self._delta_usage = event.usage
        elif kind == "message_stop":
            self.stopped = True
        return []

    def blocks(self, provider: str) -> list[dict[str, Any]]:
        out = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            data = dict(block.data)
            kind = data.get("type")
            if kind == "text":
                data["text"] = data.get("text", "") + "".join(block.pieces)
            elif kind == "thinking":
                data["thinking"] = data.get("thinking", "") + "".join(block.pieces)
            elif kind in ("tool_use", "server_tool_use"):
                text = "".join(block.pieces)
                try:
                    data["input"] = json.loads(text) if text.strip() else data.get("input") or {}
                except ValueError as exc:
                    raise ModelResponseError(f"the {provider} stream sent tool input that is not JSON: {text[:200]!r}",
                                             provider=provider) from exc
            out.append(data)
        return out

    def usage(self) -> Usage:
        start, delta = self._start_usage, self._delta_usage
        if start is None and delta is None:
            return Usage()

        def pick(name: str) -> int:
            value = getattr(delta, name, None) if delta is not None else None
            if value is None and start is not None:
                value = getattr(start, name, None)
            return int(value or 0)

        read, write = pick("cache_read_input_tokens"), pick("cache_creation_input_tokens")
        details = getattr(delta, "output_tokens_details", None) if delta is not None else None
        return Usage(pick("input_tokens") + read + write, pick("output_tokens"), read, write,
                     int(getattr(details, "thinking_tokens", 0) or 0) if details is not None else 0)
