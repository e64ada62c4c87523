"""`ScriptedModel`: a deterministic chat model for tests, docs and offline demos.

It answers with scripted turns, in order, and records every request it was sent.

>>> import asyncio
>>> from contextpipe.models import ModelRequest
>>> model = ScriptedModel([tool_call("lookup_location_code", city="Suzhou"), "Sunny, 25 °C."])
>>> first = asyncio.run(model.complete(ModelRequest([Message.user("Weather in Suzhou?")])))
>>> first.messages[0].function_calls[0].arguments
'{"city": "Suzhou"}'
>>> asyncio.run(model.complete(ModelRequest([Message.user("...")]))).text
'Sunny, 25 °C.'
>>> len(model.requests)
2
"""

from __future__ import annotations

import inspect
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..errors import ScriptExhausted
from ..messages import FunctionCall, Message, Part, ReasoningPart, TextPart
from ..models.base import ModelRequest, ModelResponse, ModelStreamEvent, ResponseComplete, TextDelta, Usage

__all__ = ["ScriptStep", "ScriptedModel", "Turn", "tool_call"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted model response: text and/or tool calls."""

    text: str = ""
    """The reply text (may be empty when the turn only calls tools)."""
    calls: tuple[FunctionCall, ...] = ()
    """Tool calls the model makes in this turn (several make a parallel call)."""
    chunks: tuple[str, ...] | None = None
    """How `stream` splits `text`; by default at word boundaries."""
    usage: Usage | None = None
    """Usage to report for this turn."""
    reasoning: str | None = None
    """Reasoning text to include before the answer."""

    def __add__(self, other: Turn) -> Turn:
        """Combine two turns into one (texts joined, calls concatenated)."""
        return Turn(self.text + other.text, self.calls + other.calls, None, self.usage or other.usage,
                    self.reasoning or other.reasoning)


def tool_call(name: str, arguments: dict[str, Any] | str | None = None, /, *, call_id: str | None = None,
              **kwargs: Any) -> Turn:
    """Return a turn in which the model calls tool `name`.

    Arguments come as a dict, as raw JSON text (to test malformed arguments), or as keywords.
    Add turns (``tool_call(...) + tool_call(...)``) for parallel calls.
    """
    text = arguments if isinstance(arguments, str) else json.dumps({**(arguments or {}), **kwargs}, ensure_ascii=False)
    return Turn(calls=(FunctionCall(call_id or "", name, text),))


ScriptStep: TypeAlias = "str | Turn | Message | ModelResponse | BaseException | Callable[[ModelRequest], Any]"
"""A scripted answer: text, a `Turn`, a message, a whole response, an exception to raise, or a
function (sync or async) of the request returning any of these."""

_WORD_RE = re.compile(r"\S+\s*|\s+")


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


class ScriptedModel:
    """A chat model that replays a script.

    Each call takes the next step of the script. Function calls without an id get deterministic ids
    (``call_1``, ``call_2``, ...). When the script runs out the call raises `ScriptExhausted`;
    `assert_done` fails when steps are left over. `requests` holds every request received, in order.
    """

    def __init__(self, script: Iterable[ScriptStep] = (), *, name: str = "scripted") -> None:
        self._script: deque[Any] = deque(script)
        self._name = name
        self._call_counter = 0
        self.requests: list[ModelRequest] = []
        """Every request this model received, oldest first."""

    @property
    def name(self) -> str:
        """The model's name (``scripted`` unless given)."""
        return self._name

    def enqueue(self, *steps: ScriptStep) -> None:
        """Append steps to the script."""
        self._script.extend(steps)

    @property
    def remaining(self) -> int:
        """How many scripted steps have not been used yet."""
        return len(self._script)

    def assert_done(self) -> None:
        """Raise AssertionError naming the unused steps when the script was not used up.

        Call it at the end of a test: a step left over means the agent made fewer model calls than
        the script expected.
        """
        if self._script:
            unused = ", ".join(_shorten(repr(step)) for step in self._script)
            raise AssertionError(
                f"ScriptedModel {self._name!r} received {len(self.requests)} calls but {len(self._script)} "
                f"scripted steps were never used: {unused}"
            )

    async def _next_turn(self, request: ModelRequest) -> tuple[ModelResponse, Turn | None]:
        self.requests.append(request)
        if not self._script:
            raise ScriptExhausted(
                f"ScriptedModel {self._name!r} received call {len(self.requests)} but its script is empty; "
                "add replies with enqueue(...) or pass a longer script"
            )
        step = self._script.popleft()
        if callable(step) and not isinstance(step, BaseException):
            step = step(request)
            if inspect.isawaitable(step):
                step = await step
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ModelResponse):
            return step, None
        if isinstance(step, Message):
            return ModelResponse([step], finish_reason="stop", model=self._name), None
        turn = Turn(text=step) if isinstance(step, str) else step
        if not isinstance(turn, Turn):
            raise TypeError(f"unsupported script step {step!r}")
        return self._response(turn), turn

    def _response(self, turn: Turn) -> ModelResponse:
        """Build the assistant message a `Turn` stands for (calls without an id get ``call_N``)."""
        parts: list[Part] = []
        if turn.reasoning:
            parts.append(ReasoningPart(turn.reasoning))
        text = turn.text or "".join(turn.chunks or ())
        if text:
            parts.append(TextPart(text))
        for call in turn.calls:
            if not call.call_id:
                self._call_counter += 1
                call = FunctionCall(f"call_{self._call_counter}", call.name, call.arguments)
            parts.append(call)
        finish = "tool_calls" if turn.calls else "stop"
        return ModelResponse([Message("assistant", tuple(parts))], usage=turn.usage, finish_reason=finish,
                             model=self._name)

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Return the next scripted response."""
        return (await self._next_turn(request))[0]

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Stream the next scripted response: its text in chunks, then the whole response."""
        response, turn = await self._next_turn(request)
        if turn is not None and turn.chunks is not None:
            chunks: Iterable[str] = turn.chunks
        else:
            chunks = _WORD_RE.findall(response.text)
        for chunk in chunks:
            yield TextDelta(chunk)
        yield ResponseComplete(response)
