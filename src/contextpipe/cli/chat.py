"""``contextpipe chat``: the model, the agent over the session file, and the interactive prompt.

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
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape

from ..agent import Agent
from ..config import Durability
from ..errors import ContextPipeError, UsageError
from ..events import ToolCallFinished, ToolCallStarted
from ..messages import Message, Source
from ..models.base import ChatModel, ModelRequest, ModelResponse, ResponseComplete, TextDelta
from ..providers.compaction import Compaction
from ..providers.history import History
from ..session import DEFAULT_TENANT, Session
from ..stores.sqlite import SQLiteStore
from ._shared import (
    CONTROL_CHARACTERS,
    DEFAULT_DB,
    DbOption,
    TenantOption,
    check_new_db,
    complete_sessions,
    err,
    fail,
    message_line,
    out,
    shown,
)
from .index import embedders
from .inspect import show_trace

if TYPE_CHECKING:
    from ..providers import McpTools

__all__ = ["COMMANDS", "PROVIDERS", "ChatRepl", "DemoChatModel", "WordWrap", "chat"]

T = TypeVar("T")

COMMANDS: dict[str, str] = {
    "/help": "list these commands",
    "/session": "the session's id, size and where it is stored",
    "/history [N]": "the session's last N messages (default 10)",
    "/inspect [N]": "where the tokens of the Nth stored model call came from (default: the last)",
    "/exit": "leave (also /quit, Ctrl-D or Ctrl-C)",
}
"""The slash commands the prompt understands; any other line goes to the model (start it with // to
send a line that begins with /)."""

_INPUT = Source("input")


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
           provider: str = "openai") -> ChatModel:
    """Return the model the flags and the environment name (the demo model when asked or accepted)."""
    if demo_model:
        return DemoChatModel()
    if provider not in PROVIDERS:
        raise fail(f"unknown --provider {provider!r}; choose one of: {', '.join(PROVIDERS)}", code=2)
    env = "ANTHROPIC" if provider == "anthropic" else "OPENAI"
    model = model or os.environ.get(f"{env}_MODEL")
    base_url = base_url or os.environ.get(f"{env}_BASE_URL")
    api_key = api_key or os.environ.get(f"{env}_API_KEY")
    if not model or not (api_key or base_url):
        return _without_a_model(NO_MODEL if env == "OPENAI" else NO_CLAUDE)
    return _client(provider, model, base_url, api_key)


def _without_a_model(message: str) -> ChatModel:
    """Offer the demo model on a terminal; else stop, saying how to configure one."""
    if sys.stdin.isatty() and typer.confirm(message + "\n\nUse the offline demo model now?", default=False, err=True):
        return DemoChatModel()
    raise fail(message, code=2)


def _client(provider: str, model: str, base_url: str | None, api_key: str | None) -> ChatModel:
    if provider == "anthropic":
        from ..models.anthropic import AnthropicChatModel

        return AnthropicChatModel(model, base_url=base_url, api_key=api_key)
    if provider == "openai-responses":
        from ..models.openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(model, base_url=base_url, api_key=api_key)
    from ..models.openai import OpenAIChatModel

    return OpenAIChatModel(model, base_url=base_url, api_key=api_key)


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
) -> None:
    """Chat with a model; every turn is stored in the session (type /help for commands, /exit to leave)."""
    chat_model = _model(model, base_url, api_key, demo_model, provider)
    options = _ChatOptions(instructions, max_input_tokens, skills or [], memory, user, search, mcp or [])
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
                  durability=Durability(store_traces=True))
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
        raise UsageError(f"--mcp {spec!r} is not a command line: {exc}") from None
    if not argv:
        raise UsageError("--mcp needs a command line (run over stdio) or an http(s) URL")
    return McpTools(StdioServer(argv[0], argv[1:]), source_id=source_id)


# --- the prompt ----------------------------------------------------------------------------------


class WordWrap:
    r"""Write streamed text to a terminal, breaking lines between words rather than inside them.

    >>> lines = []
    >>> wrap = WordWrap(lines.append, width=12)
    >>> for chunk in ["The qui", "ck brown fox jum", "ps over it."]:
    ...     wrap.feed(chunk)
    >>> wrap.finish()
    >>> "".join(lines).split("\n")
    ['The quick ', 'brown fox ', 'jumps over ', 'it.']

    A word is written once it is complete (the next space or line break arrives, or `finish`); a
    word wider than the terminal is written on a line of its own and the terminal breaks it.
    `width=None` writes the text as it comes (output that is not a terminal). Control characters
    are dropped either way, so a model cannot send escape sequences to the user's terminal.
    """

    def __init__(self, write: Callable[[str], None], width: int | None, column: int = 0) -> None:
        self._write = write
        self.width = width
        self.column = column
        """Cells already used on the current line."""
        self._word = ""

    def feed(self, text: str) -> None:
        """Take the next piece of the stream."""
        text = CONTROL_CHARACTERS.sub("", text)
        if self.width is None:
            self._write(text)
            return
        for char in text:
            if char == "\n":
                self._flush_word()
                self._write("\n")
                self.column = 0
            elif char in " \t":
                self._flush_word()
                if self.column + 1 > self.width:
                    self._write("\n")
                    self.column = 0
                else:
                    self._write(char)
                    self.column += 1
            else:
                self._word += char

    def finish(self) -> None:
        """Write the last, unfinished word."""
        self._flush_word()

    def _flush_word(self) -> None:
        if not self._word:
            return
        size = cell_len(self._word)
        if self.width is not None and self.column > 0 and self.column + size > self.width:
            self._write("\n")
            self.column = 0
        self._write(self._word)
        self.column += size
        if self.width is not None and self.column > self.width:
            self.column %= self.width
        self._word = ""


class ChatRepl:
    """Read lines, run them through the agent turn by turn, and answer slash commands."""

    def __init__(
        self,
        runner: asyncio.Runner,
        agent: Agent,
        session: Session,
        where: str,
        out: Console,
        err: Console,
        *,
        render_trace: Callable[[int, dict[str, Any]], None],
    ) -> None:
        self.runner = runner
        self.agent = agent
        self.session = session
        self.where = where
        self.out = out
        self.err = err
        self._render_trace = render_trace
        self._history_file: Path | None = None

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Chat until /exit, Ctrl-D (exit code 0) or Ctrl-C at the prompt (130)."""
        if sys.stdin.isatty():
            self._start_line_editing()
        try:
            while True:
                try:
                    line = input("you> ")
                except EOFError:
                    self.out.print()
                    return 0
                except KeyboardInterrupt:
                    self.out.print()
                    return 130
                text = line.strip()
                if not text:
                    continue
                if text.startswith("//"):
                    text = text[1:]
                elif text.startswith("/"):
                    if not self._command(text):
                        return 0
                    continue
                self._turn(text)
        finally:
            self._save_history()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    # --- a turn ------------------------------------------------------------------------------------

    def _turn(self, text: str) -> None:
        message = Message.user(text)
        self.out.print("[bold]assistant>[/bold] ", end="")
        stream = self.out.file
        width = self.out.width if self.out.is_terminal else None

        def write(piece: str) -> None:
            stream.write(piece)
            stream.flush()

        wrap = WordWrap(write, width, column=len("assistant> "))
        try:
            self._call(self._stream(message, wrap))
            wrap.finish()
            self.out.print()
            return
        except KeyboardInterrupt:  # an interrupted run saves its input itself: say whether it is there
            wrap.finish()
            self.out.print()
            self._report_kept(message)
            return
        except ContextPipeError as exc:
            wrap.finish()
            self.out.print()
            self.err.print(f"[red]error:[/red] {shown(str(exc))}")
            problem = "the run failed"
        except Exception:  # a bug: keep the message, then let the traceback show
            wrap.finish()
            self.out.print()
            self._keep_input(message, "the run crashed")
            raise
        self._keep_input(message, problem)

    async def _stream(self, message: Message, wrap: WordWrap) -> None:
        async for event in self.agent.stream(message, session=self.session):
            if isinstance(event, TextDelta):
                wrap.feed(event.text)
            elif isinstance(event, ToolCallStarted):
                wrap.finish()
                self.out.print(f"\n[dim]  calling {shown(event.call.name)}({shown(event.call.arguments)})[/dim]")
                wrap.column = 0
            elif isinstance(event, ToolCallFinished):
                self.out.print(f"[dim]  -> {shown(event.result.result[:200])}[/dim]")
                wrap.column = 0

    def _report_kept(self, message: Message) -> None:
        """Tell the user whether the interrupted run's message is in the session (the agent saved it)."""
        store, session = self.agent.store, self.session
        try:
            recent = self._call(store.load(session.tenant, session.id, limit=50)).messages
        except (ContextPipeError, KeyboardInterrupt) as exc:
            self.err.print(f"[yellow]interrupted; the session could not be read to check your message: "
                           f"{shown(str(exc))}[/yellow]")
            return
        if any(m.id == message.id for m in recent):
            self.err.print("[dim]interrupted; your message is kept in the session[/dim]")
        else:
            self.err.print("[yellow]interrupted; your message could not be kept in the session[/yellow]")

    def _keep_input(self, message: Message, problem: str) -> None:
        """Make sure the user's message is in the session after a failed turn.

        The agent stores the input together with the first model answer (or when the run is
        interrupted); a run that failed before that stores nothing, so the message is appended
        here (appending is idempotent by message id).
        """
        store, session = self.agent.store, self.session
        try:
            self._call(store.append(session.tenant, session.id, [message.with_source(_INPUT)]))
        except (ContextPipeError, KeyboardInterrupt) as exc:
            self.err.print(f"[yellow]{problem}; your message could not be kept in the session: "
                           f"{shown(str(exc))}[/yellow]")
            return
        self.err.print(f"[dim]{problem}; your message is kept in the session[/dim]")

    # --- slash commands ----------------------------------------------------------------------------

    def _command(self, text: str) -> bool:
        """Run a slash command; return False to leave the chat."""
        name, _, argument = text.partition(" ")
        argument = argument.strip()
        if name in ("/exit", "/quit"):
            return False
        try:
            if name == "/help":
                self._help()
            elif name == "/session":
                self._call(self._show_session())
            elif name == "/history":
                self._call(self._show_history(self._number(argument, 10)))
            elif name == "/inspect":
                self._call(self._inspect(self._number(argument, None)))
            else:
                self.err.print(f"unknown command {escape(name)}; /help lists the commands (start a line with // "
                               "to send it to the model as it is)")
        except KeyboardInterrupt:
            self.out.print()
        except ContextPipeError as exc:
            self.err.print(f"[red]error:[/red] {shown(str(exc))}")
        return True

    def _help(self) -> None:
        for usage, what in COMMANDS.items():
            self.out.print(f"  {escape(usage):<14} {escape(what)}")
        self.out.print("[dim]  Lines starting with // are sent to the model without the first /.[/dim]")

    @staticmethod
    def _number(argument: str, default: int | None) -> int | None:
        if not argument:
            return default
        if not argument.isdigit() or int(argument) < 1:
            raise UsageError(f"expected a number from 1, got {argument!r}")
        return int(argument)

    async def _show_session(self) -> None:
        store, session = self.agent.store, self.session
        stored = await store.get_session(session.tenant, session.id)
        page = await store.load(session.tenant, session.id, limit=1)
        traces = await store.load_traces(session.tenant, session.id)
        providers = ", ".join(f"{p.kind}:{p.source_id}" for p in self.agent.providers) or "none"
        self.out.print(f"session {escape(repr(session.id))} (tenant {escape(repr(session.tenant))}) in "
                       f"{escape(self.where)}: {page.last_seq} message(s), "
                       f"version {stored.version if stored else 0}, {len(traces)} stored model call(s)")
        self.out.print(f"model {escape(self.agent.model.name)}; context: {escape(providers)}")

    async def _show_history(self, last: int | None) -> None:
        page = await self.agent.store.load(self.session.tenant, self.session.id, limit=last)
        if not page.messages:
            self.out.print("[dim]no messages yet[/dim]")
        for seq, m in enumerate(page.messages, page.first_seq):
            self.out.print(message_line(seq, m))

    async def _inspect(self, number: int | None) -> None:
        traces = await self.agent.store.load_traces(self.session.tenant, self.session.id)
        if not traces:
            self.out.print("[dim]no model call stored yet in this session[/dim]")
            return
        if number is None:
            number = len(traces)
        if number > len(traces):
            self.err.print(f"this session has {len(traces)} stored model call(s)")
            return
        self._render_trace(number, traces[number - 1])

    # --- line editing ------------------------------------------------------------------------------

    def _start_line_editing(self) -> None:
        try:
            import readline
        except ImportError:  # pragma: no cover - Windows without pyreadline
            return
        names = sorted({usage.split(" ")[0] for usage in COMMANDS} | {"/quit"})

        def complete(text: str, state: int) -> str | None:
            matches = [n for n in names if n.startswith(text)] if text.startswith("/") else []
            return matches[state] if state < len(matches) else None

        readline.set_completer(complete)
        readline.set_completer_delims(" \t\n")
        readline.parse_and_bind("tab: complete")
        readline.set_history_length(1000)
        name = os.environ.get("CONTEXTPIPE_HISTORY", str(Path.home() / ".contextpipe_history"))
        if not name:
            return
        self._history_file = Path(name)
        try:
            readline.read_history_file(self._history_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.err.print(f"[dim]prompt history not read from {escape(name)}: {escape(str(exc))}[/dim]")

    def _save_history(self) -> None:
        if self._history_file is None:
            return
        import readline

        try:
            readline.write_history_file(self._history_file)
        except OSError as exc:
            self.err.print(f"[dim]prompt history not saved to {escape(str(self._history_file))}: "
                           f"{escape(str(exc))}[/dim]")
