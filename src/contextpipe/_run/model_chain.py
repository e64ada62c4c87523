"""The model call's chain: the providers' model middleware around the innermost call, and reading a stream.

`chain` wraps the innermost call (`StepLoop._terminal`) in the run's model middleware, first
added outermost; `consume` reads a model stream to its response, handing each delta on;
`with_request` attaches to a response the request that produced it, so the trace shows what the
model was sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import fields

from ..errors import ModelResponseError
from ..models.base import (
    CallModel,
    ModelMiddleware,
    ModelRequest,
    ModelResponse,
    ModelStreamEvent,
    ReasoningDelta,
    ResponseComplete,
    TextDelta,
)

__all__ = ["chain", "consume", "no_deltas", "with_request"]


def chain(middleware: Sequence[ModelMiddleware], terminal: CallModel) -> CallModel:
    """Return a call that goes through `middleware` (first outermost) and then `terminal`."""
    call = terminal
    for mw in reversed(middleware):
        call = _bind(mw, call)
    return call


def _bind(mw: ModelMiddleware, call_next: CallModel) -> CallModel:
    async def bound(request: ModelRequest) -> ModelResponse:
        return await mw(request, call_next)

    return bound


async def consume(stream: AsyncIterator[ModelStreamEvent], on_delta: Callable[[TextDelta | ReasoningDelta], None],
                  model_name: str) -> ModelResponse:
    """Read a model stream to its end, handing each delta to `on_delta`; return the whole response."""
    final: ModelResponse | None = None
    async for event in stream:
        if isinstance(event, ResponseComplete):
            final = event.response
        else:
            on_delta(event)
    if final is None:
        raise ModelResponseError(f"model {model_name!r} ended its stream without a response")
    return final


def no_deltas(delta: TextDelta | ReasoningDelta) -> None:
    """Drop nothing: a complete (not streamed) call has no deltas to forward."""


_RESPONSE_FIELDS = tuple(f.name for f in fields(ModelResponse) if f.name != "request")


def with_request(response: ModelResponse, request: ModelRequest) -> ModelResponse:
    """Return `response` carrying the request that produced it (`dataclasses.replace`, without its cost)."""
    return ModelResponse(**{name: getattr(response, name) for name in _RESPONSE_FIELDS}, request=request)
