"""Packaging: what `import contextpipe` loads, the public API, and the README's demo command."""

from __future__ import annotations

import subprocess
import sys

import contextpipe

OPTIONAL = ("openai", "anthropic", "httpx", "httpx2", "asyncpg", "psycopg", "redis", "sqlite_vec", "torch",
            "sentence_transformers", "tiktoken", "numpy")


def test_import_loads_no_optional_backend() -> None:
    code = (
        "import sys, contextpipe, contextpipe.models, contextpipe.stores, contextpipe.providers, "
        "contextpipe.testing\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_openai_model_loads_its_sdk_on_first_use() -> None:
    code = (
        "import sys\nfrom contextpipe.models import OpenAIChatModel\n"
        "print('openai' in sys.modules)\n"
        "OpenAIChatModel('m', base_url='http://127.0.0.1:9/v1')\n"
        "print('openai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]


def test_anthropic_and_responses_models_load_their_sdks_on_first_use() -> None:
    code = (
        "import sys\nfrom contextpipe.models import AnthropicChatModel, OpenAIResponsesModel\n"
        "print('anthropic' in sys.modules, 'openai' in sys.modules)\n"
        "AnthropicChatModel('claude', api_key='k')\n"
        "print('anthropic' in sys.modules, 'openai' in sys.modules)\n"
        "OpenAIResponsesModel('m', base_url='http://127.0.0.1:9/v1')\n"
        "print('anthropic' in sys.modules, 'openai' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True", "False", "True", "True"]


def test_public_api_is_pinned() -> None:
    assert sorted(contextpipe.__all__) == sorted([
        "AfterRunError", "Agent", "AgentInfo", "AgentStream", "ApprovalError", "ApprovalRequired",
        "ClientTool", "CodecError", "ConcurrentUpdate", "ContextPipeError",
        "ContextProvider", "ContextWindowExceeded", "CorruptRecord", "DataPart", "Durability", "ForgetReport",
        "FunctionCall", "FunctionResult", "Heartbeat", "HistoryPolicy", "HistoryProvider", "InputConflict", "LeaseLost",
        "Message",
        "ModelAuthError",
        "ModelBadRequest",
        "ModelConnectionError", "ModelError", "ModelRateLimited", "ModelResponseError", "ModelServerError",
        "ModelSettings", "ModelTimeout", "OutputValidationError", "PendingApproval", "PromptTrace", "ProviderState",
        "ReasoningPart",
        "RequestInvariantError", "RunContext",
        "RunDone", "RunLimits", "RunOutcome", "RunResult", "ScriptExhausted", "Session",
        "SessionBusy", "Source", "StepPersisted", "MessageDelivered", "StoreError", "StreamEvent", "TextDelta",
        "TextPart", "Tool",
        "ToolCallFinished", "ToolCallStarted", "UnknownPart", "McpError", "SkillError", "ReasoningDelta",
        "StopReason", "Telemetry", "ToolContext", "ToolMiddlewareError", "ToolOutcome", "UriPart", "Usage",
        "UsageError",
        "__version__",
        "approve",
        "reject",
        "tool",
    ])
    for name in contextpipe.__all__:
        assert hasattr(contextpipe, name), name


def test_every_error_is_a_contextpipe_error() -> None:
    from contextpipe import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.ContextPipeError), name
