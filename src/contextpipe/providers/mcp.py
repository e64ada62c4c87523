"""`McpTools`: the tools, resources and prompts of a Model Context Protocol server, offered to the model.

Connects through the official `mcp` package (``pip install "contextpipe[mcp]"``) over stdio (a
subprocess) or streamable HTTP. The connection is opened on first use and kept for the provider's
life, in a background task that owns it (the MCP client's task groups must be entered and left in
one task); call `close()` (or use ``async with``) when done.

- Tool names are mapped to what model APIs accept (``^[a-zA-Z0-9_-]{1,64}$``): every other character,
  in the prefix as in the name, becomes ``_``, so ``math.mul`` with ``prefix="calc."`` is offered as
  ``calc_math_mul`` and called on the server as ``math.mul``. A name that already starts with the
  prefix (so written) does not get it twice: mcp-server-git's ``git_status`` with ``prefix="git."``
  stays ``git_status``. Two tools mapped to one name by that rule are an `McpError`; two mapped to
  one name by the character mapping alone are told apart by a hash. A tool that cannot be offered is
  skipped with a warning and listed in `McpTools.problems`.
- ``readOnlyHint`` / ``idempotentHint`` make a tool idempotent, so crash repair re-runs it.
- Text results become the tool's text; images and audio become `DataPart` s in `ToolOutcome.parts`
  (and are described in the text); resource links become `UriPart` s.
- A server with resources gets a ``read_resource`` tool (its resources listed in the description),
  and `context_resources` are read before every run and added as context. Prompts are offered to the
  application: `prompts()` and `get_prompt()`.
- The tool list is refreshed when the server says it changed (``notifications/tools/list_changed``).
- A stdio server's stderr goes to the ``contextpipe.mcp`` logger; a server that cannot be started or
  reached raises one `McpError` naming the server and the cause (its last stderr lines included).

>>> server = StdioServer("python", ["my_mcp_server.py"])
>>> McpTools(server, source_id="files").kind
'mcp'
>>> model_tool_name("git.", "log"), model_tool_name("git.", "git_log")
('git_log', 'git_log')
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ..errors import McpError, UsageError
from ..messages import DataPart, Message, TextPart, UriPart
from ..tools import Tool, ToolOutcome
from .base import ContextProvider

if TYPE_CHECKING:
    from ..pipeline import RunContext
    from ..tool_context import ToolContext

__all__ = ["HttpServer", "McpError", "McpTools", "StdioServer", "model_tool_name"]

logger = logging.getLogger("contextpipe.mcp")

_BAD_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class StdioServer:
    """An MCP server run as a subprocess, speaking over its stdin and stdout."""

    command: str
    """The program to run (looked up on ``PATH``)."""
    args: Sequence[str] = ()
    """Its arguments."""
    env: dict[str, str] | None = None
    """Extra environment variables (the MCP package passes a small default environment)."""
    cwd: str | None = None
    """Working directory."""


@dataclass(frozen=True)
class HttpServer:
    """An MCP server reached over streamable HTTP."""

    url: str
    """The server's MCP endpoint, for example ``http://127.0.0.1:8000/mcp``."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra HTTP headers (authorization, ...)."""


def model_tool_name(prefix: str, remote: str) -> str:
    """Return the name a model may call for server tool `remote` with `prefix` (any separator allowed).

    Characters model APIs refuse become ``_`` (``git.`` reads ``git_``); a `prefix` ending in a
    separator is not added to a name that already starts with it, both so mapped (``git.`` and
    ``git_status`` give ``git_status``; ``a`` and ``add`` give ``aadd``).
    A name over 64 characters is shortened and made unique with a hash of the original.
    """
    full = remote if _prefixed(prefix, remote) else f"{prefix}{remote}"
    name = _BAD_CHARS.sub("_", full) or "_"
    if len(name) > 64:
        name = f"{name[:55]}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    return name


def _prefixed(prefix: str, remote: str) -> bool:
    """Whether `remote`, mapped to the characters model APIs accept, already starts with `prefix` so mapped.

    Only a prefix that ends in a separator (``_`` or ``-`` once mapped: ``git.``, ``git_``) counts:
    with ``prefix="a"``, ``add`` is ``aadd`` like every other tool, not left as it is.
    """
    mapped = _BAD_CHARS.sub("_", prefix)
    return mapped.endswith(("_", "-")) and _BAD_CHARS.sub("_", remote).startswith(mapped)


@dataclass
class _Op:
    run: Callable[[Any], Awaitable[Any]]
    done: asyncio.Future[Any]


class McpTools(ContextProvider):
    """Offers the tools (and resources) of one MCP server; optionally only `include`, and with a name `prefix`.

    `include` names the server's tools (their names on the server). `prefix` goes before each tool's
    name unless the name already starts with it (``.`` and other characters model APIs refuse read
    ``_``: see `model_tool_name`). `context_resources` are resource URIs read before every run and
    added to the context.

    It takes none of the seeds' message filters: it reads no request message (the same tools and
    resources for every run) and stores nothing, so a filter would have nothing to choose.
    """

    kind = "mcp"

    def __init__(
        self,
        server: StdioServer | HttpServer,
        *,
        source_id: str = "mcp",
        prefix: str = "",
        include: Sequence[str] | None = None,
        call_timeout: float = 60.0,
        connect_timeout: float = 30.0,
        offer_resources: bool = True,
        context_resources: Sequence[str] = (),
    ) -> None:
        super().__init__(source_id)
        self.server = server
        self.prefix = prefix
        self.include = set(include) if include is not None else None
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.offer_resources = offer_resources
        self.context_resources = list(context_resources)
        self._queue: asyncio.Queue[_Op | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Any] | None = None
        self._capabilities: Any = None
        self._tools: list[Tool] | None = None
        self._problems: list[str] = []
        self._stderr: deque[str] = deque(maxlen=20)
        self._stderr_thread: threading.Thread | None = None
        self.tool_list_changes = 0
        """How many times the server said its tool list changed (each one refreshes the tools)."""

    async def __aenter__(self) -> McpTools:
        await self.tools()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def problems(self) -> list[str]:
        """Server tools that could not be offered to the model, and why."""
        return list(self._problems)

    async def tools(self) -> list[Tool]:
        """Connect if needed and return the server's tools as contextpipe tools (re-listed after a change)."""
        await self._connect()
        if self._tools is None:
            specs = await self._request(lambda s: _list_all(s.list_tools, "tools"))
            self._tools = self._build_tools(specs)
        return self._tools

    async def before_run(self, ctx: RunContext) -> None:
        """Offer the server's tools (and resource reader) for this run; add `context_resources`."""
        tools = list(await self.tools())
        if self.offer_resources and self._has("resources"):
            resources = await self.resources()
            if resources:
                tools.append(self._resource_tool(resources))
        ctx.add_tools(tools)
        for uri in self.context_resources:
            outcome = await self.read_resource(uri)
            if outcome.is_error:
                raise McpError(f"MCP server {self._describe()}: context resource {uri!r} cannot be read: "
                               f"{outcome.result}")
            ctx.add_messages([Message("user", (TextPart(f"Resource {uri}:\n{outcome.result}"), *outcome.parts))])

    async def resources(self) -> list[Any]:
        """Return the server's resources (each with ``uri``, ``name``, ``description``, media type); [] without any."""
        await self._connect()
        if not self._has("resources"):
            return []
        return list(await self._request(lambda s: _list_all(s.list_resources, "resources")))

    async def read_resource(self, uri: str) -> ToolOutcome:
        """Read a resource: its text, and any binary contents as `DataPart` s."""
        await self._connect()
        try:
            result = await self._request(lambda s: s.read_resource(uri))
        except Exception as exc:
            return ToolOutcome(f"Error: reading {uri!r} failed: {_cause(exc)}", is_error=True)
        texts: list[str] = []
        parts: list[DataPart | UriPart] = []
        for item in result.contents:
            _content(item, texts, parts)
        return ToolOutcome("\n".join(texts), parts=tuple(parts))

    async def prompts(self) -> list[Any]:
        """Return the server's prompts (each with ``name``, ``description`` and ``arguments``); [] without any."""
        await self._connect()
        if not self._has("prompts"):
            return []
        return list(await self._request(lambda s: _list_all(s.list_prompts, "prompts")))

    async def get_prompt(self, name: str, arguments: dict[str, str] | None = None) -> list[Message]:
        """Render a server prompt into messages the application can pass to `Agent.run`."""
        await self._connect()
        try:
            result = await self._request(lambda s: s.get_prompt(name, arguments or {}))
        except McpError:
            raise
        except Exception as exc:
            raise McpError(f"MCP server {self._describe()}: prompt {name!r} failed: {_cause(exc)}") from exc
        messages = []
        for item in result.messages:
            texts: list[str] = []
            parts: list[DataPart | UriPart] = []
            _content(item.content, texts, parts)
            parts_of = (*(TextPart(t) for t in texts), *parts)
            messages.append(Message("assistant" if item.role == "assistant" else "user", parts_of))
        return messages

    async def close(self) -> None:
        """Close the connection (and stop a stdio server)."""
        if self._queue is not None and self._task is not None:
            self._queue.put_nowait(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=10)
            if not self._task.done():
                self._task.cancel()
        self._queue = self._task = None
        self._tools = None

    # --- connection --------------------------------------------------------------------------------

    async def _connect(self) -> None:
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            self._ready = loop.create_future()
            self._tools = None
            self._task = asyncio.create_task(self._serve(self._queue, self._ready), name=f"mcp:{self.source_id}")
        assert self._ready is not None
        try:
            self._capabilities = await asyncio.wait_for(asyncio.shield(self._ready), timeout=self.connect_timeout)
        except TimeoutError:
            await self.close()
            raise McpError(f"MCP server {self._describe()} did not answer within {self.connect_timeout:g} s"
                           f"{self._stderr_tail()}") from None

    def _has(self, capability: str) -> bool:
        return getattr(self._capabilities, capability, None) is not None

    async def _request(self, run: Callable[[Any], Awaitable[Any]]) -> Any:
        if self._queue is None or self._task is None or self._task.done():
            await self._connect()
        assert self._queue is not None
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Op(run, done))
        return await done

    def _describe(self) -> str:
        if isinstance(self.server, StdioServer):
            return f"'{' '.join([self.server.command, *self.server.args])}'"
        return self.server.url

    def _stderr_tail(self) -> str:
        return ("; its last output: " + " | ".join(self._stderr)) if self._stderr else ""

    async def _serve(self, queue: asyncio.Queue[_Op | None], ready: asyncio.Future[Any]) -> None:
        """Own the MCP session: open it, then answer requests until told to stop."""
        try:
            from mcp import ClientSession
        except ImportError:
            ready.set_exception(UsageError('McpTools needs the mcp package: pip install "contextpipe[mcp]"'))
            return
        error = McpError(f"MCP server {self._describe()} was closed")
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write,
                                                                        message_handler=self._on_message))
                capabilities = (await session.initialize()).capabilities
                tools = getattr(capabilities, "tools", None)
                changes = _field(tools, "list_changed", "listChanged")
                listener = asyncio.create_task(self._listen(session)) if changes else None
                ready.set_result(capabilities)
                try:
                    await self._answer(session, queue)
                finally:
                    if listener is not None:
                        listener.cancel()
                        with contextlib.suppress(BaseException):
                            await listener
        except Exception as exc:
            if self._stderr_thread is not None:  # let the server's last words arrive for the message
                await asyncio.to_thread(self._stderr_thread.join, 2.0)
            error = McpError(f"MCP server {self._describe()} failed: {_cause(exc)}{self._stderr_tail()}")
            error.__cause__ = exc
        if not ready.done():
            ready.set_exception(error)
        while not queue.empty():
            pending = queue.get_nowait()
            if pending is not None and not pending.done.done():
                pending.done.set_exception(error)

    async def _answer(self, session: Any, queue: asyncio.Queue[_Op | None]) -> None:
        """Run queued requests on the session, one at a time, until `None` arrives."""
        while (op := await queue.get()) is not None:
            try:
                result = await asyncio.wait_for(op.run(session), timeout=self.call_timeout)
            except Exception as exc:
                if not op.done.done():
                    op.done.set_exception(exc)
            else:
                if not op.done.done():
                    op.done.set_result(result)

    async def _on_message(self, message: Any) -> None:
        """Session notifications: a changed tool list makes the next run list the tools again."""
        try:
            from mcp.types import ToolListChangedNotification
        except ImportError:
            return
        if isinstance(getattr(message, "root", message), ToolListChangedNotification):  # 1.x wraps in .root
            self._tool_list_changed()

    def _tool_list_changed(self) -> None:
        self.tool_list_changes += 1
        self._tools = None
        logger.info("MCP server %s: the tool list changed; it will be listed again", self._describe())

    async def _listen(self, session: Any) -> None:
        """On 2026-07-28 connections, change notifications come through a ``subscriptions/listen`` stream."""
        try:
            from mcp.client.subscriptions import ToolsListChanged, listen
            from mcp_types.version import MODERN_PROTOCOL_VERSIONS
        except ImportError:
            return
        if session.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return
        try:
            async with listen(session, tools_list_changed=True) as subscription:
                async for event in subscription:
                    if isinstance(event, ToolsListChanged):
                        self._tool_list_changed()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("MCP server %s: tool list changes cannot be followed: %s", self._describe(), _cause(exc))

    def _transport(self, stack: contextlib.AsyncExitStack) -> contextlib.AbstractAsyncContextManager[tuple[Any, Any]]:
        if isinstance(self.server, StdioServer):
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(command=self.server.command, args=list(self.server.args),
                                           env=self.server.env, cwd=self.server.cwd)
            return stdio_client(params, errlog=self._stderr_pipe(stack))
        return _http_transport(self.server)

    def _stderr_pipe(self, stack: contextlib.AsyncExitStack) -> Any:
        """Return a pipe for the server's stderr, read line by line into the ``contextpipe.mcp`` logger."""
        read_fd, write_fd = os.pipe()
        writer = os.fdopen(write_fd, "w")
        stack.callback(writer.close)
        name = self._describe()
        tail = self._stderr
        tail.clear()

        def pump() -> None:
            with os.fdopen(read_fd, "r", encoding="utf-8", errors="replace") as reader:
                for line in reader:
                    line = line.rstrip()
                    if line:
                        tail.append(line[:300])
                        logger.info("MCP server %s: %s", name, line)

        self._stderr_thread = threading.Thread(target=pump, name=f"mcp-stderr:{self.source_id}", daemon=True)
        self._stderr_thread.start()
        return writer

    # --- tools -------------------------------------------------------------------------------------

    def _build_tools(self, specs: list[Any]) -> list[Tool]:
        tools: list[Tool] = []
        problems: list[str] = []
        taken: dict[str, str] = {}
        for spec in specs:
            remote = str(spec.name)
            if self.include is not None and remote not in self.include:
                continue
            name = self._offered_name(remote, taken)
            raw = _field(spec, "input_schema", "inputSchema")
            schema = dict(raw) if isinstance(raw, dict) else {"type": "object", "properties": {}}
            if schema.get("type", "object") != "object":
                problems.append(f"tool {remote!r}: its input schema is not an object schema; it is not offered")
                continue
            annotations = _field(spec, "annotations", "annotations")
            idempotent = bool(_field(annotations, "read_only_hint", "readOnlyHint")
                              or _field(annotations, "idempotent_hint", "idempotentHint"))
            try:
                tool = Tool.from_schema(name, spec.description or "", schema, self._caller(remote),
                                        idempotent=idempotent, with_context=True)
            except UsageError as exc:
                problems.append(f"tool {remote!r}: {exc}; it is not offered")
                continue
            taken[name] = remote
            tools.append(tool)
        for problem in problems:
            if problem not in self._problems:
                logger.warning("MCP server %s: %s", self._describe(), problem)
        self._problems = problems
        return tools

    def _offered_name(self, remote: str, taken: dict[str, str]) -> str:
        """Return the model's name for server tool `remote`, none of `taken` (model name -> server name)."""
        name = model_tool_name(self.prefix, remote)
        if name not in taken:
            return name
        if _prefixed(self.prefix, remote) != _prefixed(self.prefix, taken[name]):
            raise McpError(f"MCP server {self._describe()}: its tools {taken[name]!r} and {remote!r} would both be "
                           f"offered as {name!r} (the prefix {self.prefix!r} is not added to a name that already "
                           "starts with it); leave one out with include=[...], or choose another prefix")
        return model_tool_name(self.prefix, f"{remote}_{hashlib.sha1(remote.encode()).hexdigest()[:6]}")

    def _caller(self, remote: str) -> Callable[[dict[str, Any], ToolContext[Any] | None], Awaitable[ToolOutcome]]:
        async def call(arguments: dict[str, Any], context: ToolContext[Any] | None) -> ToolOutcome:
            # The server is sent the arguments only: who the call serves (the context) stays in the process.
            try:
                result = await self._request(lambda s: s.call_tool(remote, arguments))
            except Exception as exc:
                return ToolOutcome(f"Error: MCP tool {remote!r} failed: {_cause(exc)}", is_error=True)
            return _outcome(result)

        return call

    def _resource_tool(self, resources: list[Any]) -> Tool:
        listed = []
        for r in resources[:50]:
            media = _field(r, "mime_type", "mimeType")
            about = f" - {r.description}" if getattr(r, "description", None) else ""
            listed.append(f"{r.uri} ({r.name}{', ' + media if media else ''}){about}")
        more = f"\n(and {len(resources) - 50} more)" if len(resources) > 50 else ""

        async def read(arguments: dict[str, Any]) -> ToolOutcome:
            uri = arguments.get("uri")
            if not isinstance(uri, str) or not uri:
                return ToolOutcome("Error: 'uri' must be a resource URI (a string).", is_error=True)
            return await self.read_resource(uri)

        return Tool.from_schema(
            model_tool_name(self.prefix, "read_resource"),
            f"Read a resource of the {self.source_id} MCP server by URI. Resources:\n" + "\n".join(listed) + more,
            {"type": "object", "properties": {"uri": {"type": "string", "description": "The resource's URI."}},
             "required": ["uri"], "additionalProperties": False}, read, idempotent=True)


async def _list_all(method: Callable[..., Awaitable[Any]], attribute: str) -> list[Any]:
    """Call a paginated MCP list method until the last page."""
    items: list[Any] = []
    cursor = None
    for _ in range(1000):
        if cursor is None:
            page = await method()
        else:
            try:
                from mcp.types import PaginatedRequestParams

                page = await method(params=PaginatedRequestParams(cursor=cursor))
            except (ImportError, TypeError):  # mcp 1.x
                page = await method(cursor)
        items.extend(getattr(page, attribute))
        cursor = _field(page, "next_cursor", "nextCursor")
        if not cursor:
            break
    return items


def _field(obj: Any, snake: str, camel: str) -> Any:
    """Read a field of an MCP object under its mcp 2.x (snake) or 1.x (camel) name."""
    if obj is None:
        return None
    value = getattr(obj, snake, None)
    return value if value is not None else getattr(obj, camel, None)


def _cause(exc: BaseException) -> str:
    """Describe the root cause of `exc`, looking inside exception groups (task groups wrap everything)."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        if not inner:
            break
        exc = inner[0]
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"command {exc.filename!r} not found"
    text = str(exc) or type(exc).__name__
    lowered = text.lower()
    if "connect" in lowered and ("refused" in lowered or "all connection attempts failed" in lowered):
        return f"connection refused ({type(exc).__name__}: {text})"
    return f"{type(exc).__name__}: {text}"


def _content(item: Any, texts: list[str], parts: list[DataPart | UriPart]) -> None:
    """Add one MCP content item (or resource contents) to the text and the data parts of a result."""
    kind = getattr(item, "type", None)
    text = getattr(item, "text", None)
    if text is not None:
        texts.append(text)
        return
    media = _field(item, "mime_type", "mimeType") or "application/octet-stream"
    data = getattr(item, "data", None) or getattr(item, "blob", None)
    if data is not None:
        raw = base64.b64decode(data) if isinstance(data, str) else bytes(data)
        parts.append(DataPart(raw, media))
        label = kind if kind in ("image", "audio") else "file"
        where = f" {item.uri}" if getattr(item, "uri", None) else ""
        texts.append(f"[{label}{where}: {media}, {len(raw)} bytes]")
        return
    if kind == "resource":
        _content(item.resource, texts, parts)
        return
    uri = getattr(item, "uri", None)
    if uri is not None:
        parts.append(UriPart(str(uri), media))
        name = getattr(item, "name", None)
        texts.append(f"[resource link{' ' + name if name else ''}: {uri} ({media})]")
        return
    texts.append(f"[{kind or type(item).__name__} content that contextpipe cannot show]")


def _outcome(result: Any) -> ToolOutcome:
    texts: list[str] = []
    parts: list[DataPart | UriPart] = []
    for item in getattr(result, "content", None) or ():
        _content(item, texts, parts)
    structured = _field(result, "structured_content", "structuredContent")
    if not texts and structured is not None:
        import json

        texts.append(json.dumps(structured, ensure_ascii=False))
    error = _field(result, "is_error", "isError")
    return ToolOutcome("\n".join(texts), is_error=bool(error), parts=tuple(parts))


@contextlib.asynccontextmanager
async def _http_transport(server: HttpServer) -> Any:
    try:
        from mcp.client.streamable_http import streamable_http_client
    except ImportError:  # mcp 1.x
        from mcp.client.streamable_http import streamablehttp_client  # type: ignore[attr-defined]

        async with streamablehttp_client(server.url, headers=server.headers or None) as streams:
            yield streams[0], streams[1]
        return
    if server.headers:
        import httpx2

        async with httpx2.AsyncClient(headers=server.headers) as client, \
                streamable_http_client(server.url, http_client=client) as streams:
            yield streams[0], streams[1]
    else:
        async with streamable_http_client(server.url) as streams:
            yield streams[0], streams[1]
