"""contextpipe: LLM agents built around the context pipeline.

Sessions with durable history, context providers that shape every model call, a tool-calling loop
that persists every step, and a record of where each part of every prompt came from.

``import contextpipe`` loads no model SDK and no database driver; they load when first used.
"""

from __future__ import annotations

from .agent import Agent, AgentStream, RunDone, RunResult, StreamEvent
from .errors import (
    CodecError,
    ConcurrentUpdate,
    ContextPipeError,
    ContextWindowExceeded,
    CorruptRecord,
    LeaseLost,
    ModelAuthError,
    ModelBadRequest,
    ModelConnectionError,
    ModelError,
    ModelRateLimited,
    ModelResponseError,
    ModelServerError,
    ModelTimeout,
    ProviderError,
    RequestInvariantError,
    ScriptExhausted,
    SessionBusy,
    StoreError,
    UsageError,
)
from .loop import RunLimits, StepPersisted, ToolCallFinished, ToolCallStarted
from .messages import (
    DataPart,
    FunctionCall,
    FunctionResult,
    Message,
    ReasoningPart,
    Source,
    TextPart,
    UnknownPart,
    UriPart,
)
from .models.base import ModelSettings, TextDelta, Usage
from .pipeline import RunContext, RunOutcome, Segment
from .providers.base import ContextProvider, HistoryProvider
from .session import ProviderState, Session
from .tools import Tool, tool
from .trace import PromptTrace

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentStream",
    "CodecError",
    "ConcurrentUpdate",
    "ContextPipeError",
    "ContextProvider",
    "ContextWindowExceeded",
    "CorruptRecord",
    "DataPart",
    "FunctionCall",
    "FunctionResult",
    "HistoryProvider",
    "LeaseLost",
    "Message",
    "ModelAuthError",
    "ModelBadRequest",
    "ModelConnectionError",
    "ModelError",
    "ModelRateLimited",
    "ModelResponseError",
    "ModelServerError",
    "ModelSettings",
    "ModelTimeout",
    "ProviderError",
    "PromptTrace",
    "ProviderState",
    "ReasoningPart",
    "RequestInvariantError",
    "RunContext",
    "RunDone",
    "RunLimits",
    "RunOutcome",
    "RunResult",
    "ScriptExhausted",
    "Segment",
    "Session",
    "SessionBusy",
    "Source",
    "StepPersisted",
    "StoreError",
    "StreamEvent",
    "TextDelta",
    "TextPart",
    "Tool",
    "ToolCallFinished",
    "ToolCallStarted",
    "UnknownPart",
    "UriPart",
    "Usage",
    "UsageError",
    "__version__",
    "tool",
]
