"""`McpTools`: the tools of a Model Context Protocol server, offered to the model for each run.

Connects through the official `mcp` package (``pip install "contextpipe[mcp]"``) over stdio (a
subprocess) or streamable HTTP. The connection is opened on first use and kept for the provider's
life, in a background task that owns it (the MCP client's task groups must be entered and left in
one task); call `close()` (or use ``async with``) when done. MCP errors and tool errors come back to
the model as error results.

>>> server = StdioServer("python", ["my_mcp_server.py"])
>>> McpTools(server, source_id="files").kind
'mcp'
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import McpError, UsageError
from ..tools import Tool, ToolOutcome
from .base import ContextProvider

if TYPE_CHECKING:
    from ..pipeline import RunContext

__all__ = ["HttpServer", "McpError", "McpTools", "StdioServer"]


@dataclass(frozen=True)
class StdioServer:
    """An MCP server run as a subprocess, speaking over its stdin and stdout."""

    command: str
    args: Sequence[str] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None


@dataclass(frozen=True)
class HttpServer:
    """An MCP server reached over streamable HTTP."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Call:
    name: str
    arguments: dict[str, Any]
    done: asyncio.Future[Any]


class McpTools(ContextProvider):
    """Offers the tools of one MCP server (optionally only `include`, and with a name `prefix`)."""

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
    ) -> None:
        super().__init__(source_id)
        self.server = server
        self.prefix = prefix
        self.include = set(include) if include is not None else None
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self._queue: asyncio.Queue[_Call | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._tools: list[Tool] | None = None
        self._ready: asyncio.Future[list[Any]] | None = None

    async def __aenter__(self) -> McpTools:
        await self.tools()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def tools(self) -> list[Tool]:
        """Connect if needed and return the server's tools as contextpipe tools."""
        if self._tools is None:
            specs = await self._connect()
            tools = []
            for spec in specs:
                if self.include is not None and spec.name not in self.include:
                    continue
                tools.append(self._tool(spec))
            self._tools = tools
        return self._tools

    async def before_run(self, ctx: RunContext) -> None:
        """Offer the server's tools for this run."""
        ctx.add_tools(await self.tools())

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

    async def _connect(self) -> list[Any]:
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._queue = asyncio.Queue()
            self._ready = loop.create_future()
            self._task = asyncio.create_task(self._serve(self._queue, self._ready), name=f"mcp:{self.source_id}")
        assert self._ready is not None
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), timeout=self.connect_timeout)
        except TimeoutError:
            await self.close()
            raise McpError(f"MCP server {self._describe()} did not answer within {self.connect_timeout:g} s") from None

    def _describe(self) -> str:
        if isinstance(self.server, StdioServer):
            return f"'{self.server.command} {' '.join(self.server.args)}'".strip()
        return self.server.url

    async def _serve(self, queue: asyncio.Queue[_Call | None], ready: asyncio.Future[list[Any]]) -> None:
        """Own the MCP session: open it, list tools, then answer calls until told to stop."""
        try:
            from mcp import ClientSession
        except ImportError as exc:
            ready.set_exception(UsageError('McpTools needs the mcp package: pip install "contextpipe[mcp]"'))
            del exc
            return
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await session.list_tools()
                ready.set_result(list(listed.tools))
                while (call := await queue.get()) is not None:
                    try:
                        result = await asyncio.wait_for(session.call_tool(call.name, call.arguments),
                                                        timeout=self.call_timeout)
                    except Exception as exc:
                        if not call.done.done():
                            call.done.set_exception(exc)
                    else:
                        if not call.done.done():
                            call.done.set_result(result)
        except Exception as exc:
            error = McpError(f"MCP server {self._describe()} failed: {type(exc).__name__}: {exc}")
            if not ready.done():
                ready.set_exception(error)
            while not queue.empty():
                pending = queue.get_nowait()
                if pending is not None and not pending.done.done():
                    pending.done.set_exception(error)

    def _transport(self) -> contextlib.AbstractAsyncContextManager[tuple[Any, Any]]:
        if isinstance(self.server, StdioServer):
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            params = StdioServerParameters(command=self.server.command, args=list(self.server.args),
                                           env=self.server.env, cwd=self.server.cwd)
            return stdio_client(params)
        return _http_transport(self.server)

    # --- tools -------------------------------------------------------------------------------------

    def _tool(self, spec: Any) -> Tool:
        remote_name = spec.name

        async def call(arguments: dict[str, Any]) -> ToolOutcome:
            if self._queue is None or self._task is None or self._task.done():
                await self._connect()
            assert self._queue is not None
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._queue.put_nowait(_Call(remote_name, arguments, done))
            try:
                result = await done
            except Exception as exc:
                return ToolOutcome(f"Error: MCP tool {remote_name!r} failed: {type(exc).__name__}: {exc}",
                                   is_error=True)
            return _outcome(result)

        raw = getattr(spec, "input_schema", None) or getattr(spec, "inputSchema", None)  # mcp 2.x / 1.x
        schema = dict(raw or {"type": "object", "properties": {}})
        return Tool.from_schema(f"{self.prefix}{remote_name}", spec.description or "", schema, call)


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


def _outcome(result: Any) -> ToolOutcome:
    texts = []
    for item in getattr(result, "content", None) or ():
        text = getattr(item, "text", None)
        if text is not None:
            texts.append(text)
        else:
            kind = getattr(item, "type", type(item).__name__)
            texts.append(f"[{kind} content]")
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if not texts and structured is not None:
        import json

        texts.append(json.dumps(structured, ensure_ascii=False))
    error = getattr(result, "is_error", None)
    if error is None:
        error = getattr(result, "isError", False)
    return ToolOutcome("\n".join(texts), is_error=bool(error))
