"""The loop's records: what a model step produced, what the loop produced, and the `Stop` that ends it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import StopReason
from ..messages import FunctionCall, Message
from ..models.base import Usage

__all__ = ["LoopState", "ModelStep", "Stop"]


@dataclass(frozen=True, slots=True)
class Stop:
    """The run is over."""

    reason: StopReason
    """Why."""


@dataclass(slots=True)
class ModelStep:
    """What one model call produced."""

    step: int
    """Model call number, from 1."""
    final: bool
    """True when tools were withdrawn for this call (a limit was reached)."""
    produced: list[Message]
    """The model's new messages, tagged with the model as source and normalised."""
    calls: list[FunctionCall]
    """The function calls among them, in order."""


@dataclass(slots=True)
class LoopState:
    """What the loop produced; read by the agent to build the result."""

    new_messages: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: StopReason = "completed"
    steps: int = 0
    error_steps: int = 0
