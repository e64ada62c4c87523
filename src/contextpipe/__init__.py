"""contextpipe: LLM agents built around the context pipeline.

Sessions with durable history, context providers that shape every model call, a tool-calling loop
that persists every step, and a record of where each part of every prompt came from.

``import contextpipe`` loads only this file and its small `_lazy` helper: every name below is
imported from its module when first used (``from contextpipe import Agent`` loads the agent and what
it needs), and no model SDK or database driver is loaded until a model client or store needs one.
"""

from __future__ import annotations

from ._lazy import lazy_exports

TYPE_CHECKING = False  # as typing.TYPE_CHECKING (mypy reads it so), without importing typing
if TYPE_CHECKING:
    from .agent import Agent, AgentStream
    from .approvals import PendingApproval, approve, reject
    from .client_tools import ClientTool
    from .config import Durability, Heartbeat, HistoryPolicy, RunLimits
    from .erasure import ForgetReport
    from .errors import (
        AfterRunError,
        ApprovalError,
        CodecError,
        ConcurrentUpdate,
        ContextPipeError,
        ContextWindowExceeded,
        CorruptRecord,
        InputConflict,
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
        OutputValidationError,
        RequestInvariantError,
        ScriptExhausted,
        SessionBusy,
        SkillError,
        StoreError,
        ToolMiddlewareError,
        UsageError,
    )
    from .events import (
        ApprovalRequired,
        MessageDelivered,
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
    from .pipeline import AgentInfo, RunContext, RunOutcome
    from .providers.base import ContextProvider, HistoryProvider
    from .session import ProviderState, Session
    from .telemetry import Telemetry
    from .tool_context import ToolContext
    from .tools import Tool, ToolOutcome, tool
    from .trace import PromptTrace

__version__ = "0.1.0"

__all__ = [
    "AfterRunError",
    "Agent",
    "AgentInfo",
    "AgentStream",
    "ApprovalError",
    "ApprovalRequired",
    "ClientTool",
    "CodecError",
    "ConcurrentUpdate",
    "ContextPipeError",
    "ContextProvider",
    "ContextWindowExceeded",
    "CorruptRecord",
    "DataPart",
    "Durability",
    "ForgetReport",
    "FunctionCall",
    "FunctionResult",
    "Heartbeat",
    "HistoryPolicy",
    "HistoryProvider",
    "InputConflict",
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
    "OutputValidationError",
    "PendingApproval",
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
    "MessageDelivered",
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
    "ToolContext",
    "ToolMiddlewareError",
    "ToolOutcome",
    "UnknownPart",
    "UriPart",
    "Usage",
    "UsageError",
    "__version__",
    "approve",
    "reject",
    "tool",
]

# Where each public name lives. The modules `import contextpipe` used to load eagerly stay reachable as
# attributes (``contextpipe.stores``), imported when first named.
_EXPORTS: dict[str, str] = {
    "Agent": ".agent", "AgentStream": ".agent", "ClientTool": ".client_tools",
    **dict.fromkeys(("PendingApproval", "approve", "reject"), ".approvals"),
    **dict.fromkeys(("AfterRunError", "ApprovalError", "CodecError", "ConcurrentUpdate", "ContextPipeError",
                     "ContextWindowExceeded", "CorruptRecord", "InputConflict", "LeaseLost", "McpError",
                     "ModelAuthError", "ModelBadRequest", "ModelConnectionError", "ModelError", "ModelRateLimited",
                     "ModelResponseError", "ModelServerError", "ModelTimeout", "OutputValidationError",
                     "RequestInvariantError",
                     "ScriptExhausted", "SessionBusy", "SkillError", "StoreError", "ToolMiddlewareError",
                     "UsageError"), ".errors"),
    **dict.fromkeys(("ApprovalRequired", "MessageDelivered", "ReasoningDelta", "RunDone", "RunResult", "StepPersisted",
                     "StopReason", "StreamEvent", "TextDelta", "ToolCallFinished", "ToolCallStarted"), ".events"),
    **dict.fromkeys(("Durability", "Heartbeat", "HistoryPolicy", "RunLimits"), ".config"),
    "ForgetReport": ".erasure",
    **dict.fromkeys(("DataPart", "FunctionCall", "FunctionResult", "Message", "ReasoningPart", "Source", "TextPart",
                     "UnknownPart", "UriPart"), ".messages"),
    "ModelSettings": ".models.base", "Usage": ".models.base",
    "AgentInfo": ".pipeline", "RunContext": ".pipeline", "RunOutcome": ".pipeline",
    "ContextProvider": ".providers.base", "HistoryProvider": ".providers.base",
    "ProviderState": ".session", "Session": ".session",
    "Telemetry": ".telemetry",
    "Tool": ".tools", "ToolOutcome": ".tools", "tool": ".tools", "ToolContext": ".tool_context",
    "PromptTrace": ".trace",
}
_SUBMODULES = ("agent", "approvals", "codec", "compaction", "config", "erasure", "errors", "events", "exchanges",
               "messages",
               "models", "pipeline", "providers", "session", "stores", "telemetry", "tokens", "tool_context", "tools",
               "trace", "vectors")

__getattr__ = lazy_exports(__name__, _EXPORTS, submodules=_SUBMODULES)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
