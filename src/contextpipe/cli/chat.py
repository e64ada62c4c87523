"""``contextpipe chat``: the model and the agent over the session file; the prompt they run is `_repl`.

The model comes from flags or the usual environment variables (``OPENAI_API_KEY``,
``OPENAI_BASE_URL``, ``OPENAI_MODEL``; with ``--provider anthropic`` the ``ANTHROPIC_`` ones); any
OpenAI-compatible server works, and ``--demo-model`` chats offline with `DemoChatModel`.

The chat runs on one event loop (`asyncio.Runner`) driven turn by turn from the main thread, and
the prompt is read between turns in the main thread too: so Ctrl-C at the prompt leaves at once, and
Ctrl-C during a turn cancels just that run (the agent releases the session's lease) while the
user's message is kept in the session. On a terminal the prompt has line editing and a history
(GNU readline; arrow keys, Ctrl-R), saved in ``~/.contextpipe_history`` (``$CONTEXTPIPE_HISTORY``
names another file; set it empty to keep none).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import typer
from rich.markup import escape

from ..agent import Agent
from ..config import Durability
from ..errors import UsageError, shorten
from ..messages import Message
from ..models.base import ChatModel, ModelRequest, ModelResponse, ResponseComplete, TextDelta
from ..providers.compaction import Compaction
from ..providers.history import History
from ..session import DEFAULT_TENANT, Session
from ..stores.sqlite import SQLiteStore
from ._repl import COMMANDS, ChatRepl, WordWrap
from ._shared import (
    DEFAULT_DB,
    DbOption,
    TenantOption,
    check_new_db,
    complete_sessions,
    err,
    fail,
    out,
)
from .index import embedders
from .inspect import show_trace

if TYPE_CHECKING:
    from ..providers import McpTools

__all__ = ["COMMANDS", "PROVIDERS", "ChatRepl", "DemoChatModel", "WordWrap", "chat"]


# --- the command ---------------------------------------------------------------------------------


NO_MODEL = """No model is configured. Either:
  - set OPENAI_API_KEY and OPENAI_MODEL (e.g. gpt-4o-mini) for OpenAI,
  - or point at any OpenAI-compatible server:
      contextpipe chat --base-url http://127.0.0.1:11434/v1 --model llama3.2      (Ollama)
  - or chat with the offline demo model:  contextpipe chat --demo-model"""
NO_CLAUDE = ("No Claude model is configured: set ANTHROPIC_API_KEY and ANTHROPIC_MODEL (e.g. claude-sonnet-5), "
             "or pass --api-key and --model")
PROVIDERS = ("openai", "openai-responses", "anthropic")


class DemoChatModel:
    """The offline model `chat --demo-model` talks to: it answers from what the session holds."""

    name = "demo"

    async def complete(self, request: ModelRequest) -> Any:
        """Answer with what the user said last and how many messages came before it."""
        users = [m for m in request.messages if m.role == "user"]
        last = users[-1].text if users else ""
        reply = (f"(demo model) You said {last!r}. I can see {len(request.messages) - 1} earlier message(s) "
                 "in this session. Configure a real model to get real answers.")
        return ModelResponse([Message.assistant(reply)], finish_reason="stop", model="demo")

    async def stream(self, request: ModelRequest) -> Any:
        """Stream the same answer word by word."""
        response = await self.complete(request)
        for word in response.text.split(" "):
            yield TextDelta(word + " ")
        yield ResponseComplete(response)


def _model(model: str | None, base_url: str | None, api_key: str | None, demo_model: bool,
           provider: str = "openai", timeout: float | None = None) -> ChatModel:
    """Return the model the flags and the environment name (the demo model when asked or accepted)."""
    if demo_model:
        return DemoChatModel()
    if provider not in PROVIDERS:
        raise fail(f"unknown --provider {shorten(provider)}; choose one of: {', '.join(PROVIDERS)}", code=2)
    env = "ANTHROPIC" if provider == "anthropic" else "OPENAI"
    model = model or os.environ.get(f"{env}_MODEL")
    base_url = base_url or os.environ.get(f"{env}_BASE_URL")
    api_key = api_key or os.environ.get(f"{env}_API_KEY")
    if not model or not (api_key or base_url):
        return _without_a_model(NO_MODEL if env == "OPENAI" else NO_CLAUDE)
    return _client(provider, model, base_url, api_key, _Timeout() if timeout is None else _Timeout(timeout=timeout))


def _without_a_model(message: str) -> ChatModel:
    """Offer the demo model on a terminal; else stop, saying how to configure one."""
    if sys.stdin.isatty() and typer.confirm(message + "\n\nUse the offline demo model now?", default=False, err=True):
        return DemoChatModel()
    raise fail(message, code=2)


class _Timeout(TypedDict, total=False):
    timeout: float  # not given: the client's own default


def _client(provider: str, model: str, base_url: str | None, api_key: str | None, timeout: _Timeout) -> ChatModel:
    if provider == "anthropic":
        from ..models.anthropic import AnthropicChatModel

        return AnthropicChatModel(model, base_url=base_url, api_key=api_key, **timeout)
    if provider == "openai-responses":
        from ..models.openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(model, base_url=base_url, api_key=api_key, **timeout)
    from ..models.openai import OpenAIChatModel

    return OpenAIChatModel(model, base_url=base_url, api_key=api_key, **timeout)


def chat(
    session: Annotated[str, typer.Option("--session", "-s", help="Session to continue (created if new).",
                                         autocompletion=complete_sessions)] = "chat",
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = DEFAULT_TENANT,
    provider: Annotated[str, typer.Option(help="Model API: openai, openai-responses or anthropic.")] = "openai",
    model: Annotated[str | None, typer.Option(help="Model name (default: $OPENAI_MODEL, or $ANTHROPIC_MODEL).")]
    = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL).")]
    = None,
    api_key: Annotated[str | None, typer.Option(help="API key (default: $OPENAI_API_KEY or $ANTHROPIC_API_KEY).")]
    = None,
    demo_model: Annotated[bool, typer.Option("--demo-model", help="Use the offline demo model.")] = False,
    timeout: Annotated[float | None, typer.Option(
        min=0.1, metavar="SECONDS", help="How long the model may stay silent before a request fails (default 60, "
        "600 with anthropic); a request that times out is tried 3 times in all.")] = None,
    instructions: Annotated[str, typer.Option(help="System instructions.")] = "You are a helpful assistant.",
    max_input_tokens: Annotated[int | None, typer.Option(min=1, help="Compact the context to this many tokens.")]
    = None,
    skills: Annotated[list[Path] | None, typer.Option("--skills", help="Folder of Agent Skills (repeatable).")]
    = None,
    memory: Annotated[bool, typer.Option("--memory", help="Recall what this user said in other sessions.")] = False,
    user: Annotated[str, typer.Option(help="User id that memory is kept under.")] = "me",
    search: Annotated[bool, typer.Option("--search", help="Let the model search the documents indexed with "
                                         "`contextpipe index`.")] = False,
    mcp: Annotated[list[str] | None, typer.Option(
        "--mcp", help="MCP server whose tools the model may call: a command line (run over stdio) or an "
        "http(s) URL (repeatable).")] = None,
    ask_before: Annotated[list[str] | None, typer.Option(
        "--ask-before", metavar="TOOLS", help="Ask y/n before running a call to the tools matching this name "
        "pattern, such as 'git_*' or '*' (repeatable); a call waiting for your answer is kept in the session.")]
    = None,
) -> None:
    """Chat with a model; every turn is stored in the session (type /help for commands, /exit to leave).

    A multi-line paste is sent as one message (the terminal's bracketed paste); /paste takes the
    lines typed or pasted up to a line holding only "." (or Ctrl-D) as one message. Piped to stdin,
    each line is a message.

    Exit status: 0; 1 when stdin is not a terminal and a message got no answer (its model call
    failed or was interrupted), or when the chat cannot start; 2 when no model is configured; 130
    on Ctrl-C at the prompt.
    """
    chat_model = _model(model, base_url, api_key, demo_model, provider, timeout)
    options = _ChatOptions(instructions, max_input_tokens, skills or [], memory, user, search, mcp or [],
                           ask_before or [])
    check_new_db(db)
    with asyncio.Runner() as runner:
        stack = AsyncExitStack()
        try:
            agent, chat_session = runner.run(_open_chat(stack, chat_model, session, db, tenant, options))
            earlier = runner.run(agent.history(chat_session))
            out.print(f"[dim]session {escape(repr(session))} in {escape(str(db))} ({len(earlier)} earlier "
                      f"message(s)); model {escape(chat_model.name)}. Type /help for commands, /exit to leave.[/dim]")
            code = ChatRepl(runner, agent, chat_session, str(db), out, err,
                            render_trace=lambda n, trace: show_trace(n, trace, session, tenant, db)).run()
        finally:
            runner.run(stack.aclose())
    if code:
        raise typer.Exit(code)


@dataclass(frozen=True)
class _ChatOptions:
    instructions: str
    max_input_tokens: int | None
    skills: list[Path]
    memory: bool
    user: str
    search: bool
    mcp: list[str]
    ask_before: list[str]


async def _open_chat(stack: AsyncExitStack, model: ChatModel, session_id: str, db: Path, tenant: str,
                     options: _ChatOptions) -> tuple[Agent, Session]:
    """Build the chat's agent; everything opened is closed by `stack` (store, vectors, MCP servers)."""
    store = await stack.enter_async_context(SQLiteStore(db))
    providers: list[Any] = [History(store)]
    if options.memory or options.search:
        vectors = store.vectors()
        stack.push_async_callback(vectors.close)
        chosen = await embedders(vectors, [c for c, on in (("memory", options.memory),
                                                            ("documents", options.search)) if on])
        if options.memory:
            from ..providers.memory import SemanticMemory

            providers.append(SemanticMemory(vectors, chosen["memory"]))
        if options.search:
            from ..providers.search import TextSearch

            providers.append(TextSearch.from_vector_store(vectors, chosen["documents"], mode="tool"))
    if options.skills:
        from ..providers.skills import Skills

        providers.append(Skills(*options.skills))
    for number, spec in enumerate(options.mcp, 1):
        tools = _mcp_tools(spec, "mcp" if number == 1 else f"mcp{number}")
        stack.push_async_callback(tools.close)
        providers.append(tools)
    if options.max_input_tokens:
        providers.append(Compaction(max_input_tokens=options.max_input_tokens))
    agent = Agent(model, instructions=options.instructions, providers=providers,
                  durability=Durability(store_traces=True), needs_approval=options.ask_before or None)
    session = await agent.session(session_id, tenant=tenant)
    session.state.setdefault("user_id", options.user)
    return agent, session


def _mcp_tools(spec: str, source_id: str) -> McpTools:
    """Return the tools of the MCP server `spec` names: an http(s) URL, else a command line run over stdio."""
    from ..providers import HttpServer, McpTools, StdioServer

    if spec.startswith(("http://", "https://")):
        return McpTools(HttpServer(spec), source_id=source_id)
    try:
        argv = shlex.split(spec)
    except ValueError as exc:
        raise UsageError(f"--mcp {shorten(spec)} is not a command line: {exc}") from None
    if not argv:
        raise UsageError("--mcp needs a command line (run over stdio) or an http(s) URL")
    return McpTools(StdioServer(argv[0], argv[1:]), source_id=source_id)
