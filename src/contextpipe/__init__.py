"""contextpipe: LLM agents built around the context pipeline.

Sessions with durable history, context providers that shape every model call, a tool-calling loop
that persists every step, and a record of where each part of every prompt came from.

``import contextpipe`` loads no model SDK and no database driver; they load when first used.
"""

from __future__ import annotations

from .agent import Agent, AgentStream
from .errors import (
    AfterRunError,
    CodecError,
    ConcurrentUpdate,
    ContextPipeError,
    ContextWindowExceeded,
    CorruptRecord,
    LeaseLost,
    McpError,
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
    SkillError,
    StoreError,
    UsageError,
)
from .events import (
    ReasoningDelta,
    RunDone,
    RunResult,
    StepPersisted,
    StopReason,
    StreamEvent,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from .loop import RunLimits
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
from .models.base import ModelSettings, Usage
from .pipeline import RunContext, RunOutcome
from .providers.base import ContextProvider, HistoryProvider
from .session import ProviderState, Session
from .telemetry import Telemetry
from .tools import Tool, ToolOutcome, tool
from .trace import PromptTrace

__version__ = "0.1.0"

__all__ = [
    "AfterRunError",
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
    "McpError",
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
    "ReasoningDelta",
    "ReasoningPart",
    "RequestInvariantError",
    "RunContext",
    "RunDone",
    "RunLimits",
    "RunOutcome",
    "RunResult",
    "ScriptExhausted",
    "Session",
    "SessionBusy",
    "SkillError",
    "Source",
    "StepPersisted",
    "StopReason",
    "StoreError",
    "StreamEvent",
    "Telemetry",
    "TextDelta",
    "TextPart",
    "Tool",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolOutcome",
    "UnknownPart",
    "UriPart",
    "Usage",
    "UsageError",
    "__version__",
    "tool",
]
