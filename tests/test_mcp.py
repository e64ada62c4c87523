"""MCP tools as a context provider: servers written for the tests and real servers from PyPI."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contextpipe import Agent, UsageError
from contextpipe.models import ScriptedModel, tool_call
from contextpipe.providers.mcp import HttpServer, McpTools, StdioServer

SERVER = str(Path(__file__).parent / "fixtures" / "mcp_server.py")


# --- MCP ---------------------------------------------------------------------------------------------


async def test_mcp_tools_over_stdio_end_to_end() -> None:
    model = ScriptedModel([tool_call("math_add", a=20, b=22) + tool_call("math_explode", reason="test"),
                           tool_call("math_shout", text=7), "42 it is."])
    async with McpTools(StdioServer(sys.executable, [SERVER]), source_id="math", prefix="math_") as mcp:
        agent = Agent(model, providers=[mcp])
        result = await agent.run("What is 20 + 22?")
    assert result.text == "42 it is."
    assert sorted(t.name for t in model.requests[0].tools) == ["math_add", "math_explode", "math_shout"]
    add, explode = result.messages[1].function_results
    assert (add.result, add.is_error) == ("42", False)
    assert explode.is_error and "explode" in explode.result
    shout = result.messages[3].function_results[0]
    assert shout.is_error and "valid string" in shout.result  # the server's own validation error
    assert {t.source_id for t in result.traces[0].tools} == {"math"}


async def test_mcp_include_filter_and_reuse_across_runs() -> None:
    async with McpTools(StdioServer(sys.executable, [SERVER]), include=["shout"]) as mcp:
        model = ScriptedModel([tool_call("shout", text="hi"), "done", tool_call("shout", text="again"), "done"])
        agent = Agent(model, providers=[mcp])
        first = await agent.run("one")
        second = await agent.run("two")
    assert [t.name for t in model.requests[0].tools] == ["shout"]
    assert first.messages[1].function_results[0].result == "HI"
    assert second.messages[1].function_results[0].result == "AGAIN"


async def test_mcp_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    mcp = McpTools(StdioServer(sys.executable, [str(tmp_path / "missing.py")]), connect_timeout=20)
    with pytest.raises(UsageError, match="MCP server"):
        await mcp.tools()
    await mcp.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http_server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the MCP HTTP server did not start")


async def test_mcp_tools_over_streamable_http() -> None:
    port = free_port()
    proc = start_http_server(port)
    try:
        async with McpTools(HttpServer(f"http://127.0.0.1:{port}/mcp")) as mcp:
            tools = {t.name: t for t in await mcp.tools()}
            outcome = await tools["add"].invoke('{"a": 1, "b": 2}')
        assert (outcome.result, outcome.is_error) == ("3", False)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
