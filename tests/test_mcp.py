"""MCP tools as a context provider: servers written for the tests and real servers from PyPI."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import Agent, ContextPipeError
from contextpipe.messages import DataPart
from contextpipe.models import ModelRequest
from contextpipe.providers.mcp import HttpServer, McpError, McpTools, StdioServer, model_tool_name
from contextpipe.testing import ScriptedModel, tool_call

SERVER = str(Path(__file__).parent / "fixtures" / "mcp_server.py")


async def test_mcp_tools_over_stdio_end_to_end() -> None:
    model = ScriptedModel([tool_call("math_add", a=20, b=22) + tool_call("math_explode", reason="test"),
                           tool_call("math_shout", text=7), "42 it is."])
    async with McpTools(StdioServer(sys.executable, [SERVER]), source_id="math", prefix="math_",
                        include=["add", "explode", "shout"], offer_resources=False) as mcp:
        agent = Agent(model, providers=[mcp])
        result = await agent.run("What is 20 + 22?")
    assert result.text == "42 it is."
    assert sorted(t.name for t in model.requests[0].tools) == ["math_add", "math_explode", "math_shout"]
    by_call = {r.call_id: r for m in result.messages[1:3] for r in m.function_results}  # one message per result
    add, explode = (by_call[c.call_id] for c in result.messages[0].function_calls)
    assert (add.result, add.is_error) == ("42", False)
    assert explode.is_error and "explode" in explode.result
    shout = result.messages[4].function_results[0]
    assert shout.is_error and "valid string" in shout.result  # the server's own validation error
    assert {t.source_id for t in result.traces[0].tools} == {"math"}


async def test_mcp_include_filter_and_reuse_across_runs() -> None:
    async with McpTools(StdioServer(sys.executable, [SERVER]), include=["shout"], offer_resources=False) as mcp:
        model = ScriptedModel([tool_call("shout", text="hi"), "done", tool_call("shout", text="again"), "done"])
        agent = Agent(model, providers=[mcp])
        first = await agent.run("one")
        second = await agent.run("two")
    assert [t.name for t in model.requests[0].tools] == ["shout"]
    assert first.messages[1].function_results[0].result == "HI"
    assert second.messages[1].function_results[0].result == "AGAIN"


async def test_mcp_server_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    mcp = McpTools(StdioServer(sys.executable, [str(tmp_path / "missing.py")]), connect_timeout=20)
    with pytest.raises(McpError, match="MCP server") as info:
        await mcp.tools()
    assert "missing.py" in str(info.value) and "No such file or directory" in str(info.value)  # the server's stderr
    assert "ExceptionGroup" not in str(info.value) and "TaskGroup" not in str(info.value)
    await mcp.close()


async def test_mcp_command_not_found_and_wrong_port_are_one_clear_error() -> None:
    missing = McpTools(StdioServer("no-such-mcp-server-binary", ["--flag"]), connect_timeout=20)
    with pytest.raises(McpError) as info:
        await missing.tools()
    assert str(info.value) == ("MCP server 'no-such-mcp-server-binary --flag' failed: command "
                               "'no-such-mcp-server-binary' not found")
    assert isinstance(info.value, ContextPipeError)
    await missing.close()
    port = free_port()  # nothing listens there
    refused = McpTools(HttpServer(f"http://127.0.0.1:{port}/mcp"), connect_timeout=20)
    with pytest.raises(McpError) as info:
        await refused.tools()
    message = str(info.value)
    assert message.startswith(f"MCP server http://127.0.0.1:{port}/mcp failed: connection refused"), message
    assert "ExceptionGroup" not in message and "TaskGroup" not in message
    await refused.close()


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


# --- names, content, resources, prompts, changes ------------------------------------------------------


@pytest.mark.parametrize(("prefix", "remote", "expected"), [
    ("", "math.mul", "math_mul"), ("git.", "log", "git_log"), ("fs/", "read file", "fs_read_file"),
    ("", "ünïcode", "_n_code"), ("", "x" * 70, None),
    ("git.", "git_status", "git_status"), ("git.", "git.log", "git_log"), ("git_", "git.log", "git_log"),
    ("git.", "gitk", "git_gitk"), ("git.", "Git_log", "git_Git_log"), ("git.", "x" * 70, None),
    ("a", "add", "aadd"), ("a", "sub", "asub"), ("git-", "git-log", "git-log")])
def test_model_tool_names(prefix: str, remote: str, expected: str | None) -> None:
    name = model_tool_name(prefix, remote)
    assert len(name) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)
    if expected is not None:
        assert name == expected
    else:
        assert name != model_tool_name(prefix, "x" * 71)  # shortened names stay distinct


async def test_dotted_names_any_prefix_and_annotations() -> None:
    model = ScriptedModel([tool_call("calc_math_mul", a=6, b=7), "42."])
    async with McpTools(StdioServer(sys.executable, [SERVER]), prefix="calc.") as mcp:
        result = await Agent(model, providers=[mcp]).run("6 x 7?")
        tools = {t.name: t for t in await mcp.tools()}
    assert result.messages[1].function_results[0].result == "42"
    assert {"calc_math_mul", "calc_add", "calc_set_flag", "calc_read_resource"} <= {t.name for t in
                                                                                     model.requests[0].tools}
    assert tools["calc_math_mul"].idempotent and tools["calc_set_flag"].idempotent  # readOnly / idempotent hints
    assert not tools["calc_add"].idempotent and mcp.problems == []


async def test_images_and_audio_become_data_parts() -> None:
    async with McpTools(StdioServer(sys.executable, [SERVER])) as mcp:
        tools = {t.name: t for t in await mcp.tools()}
        picture = await tools["picture"].invoke("{}")
        sound = await tools["sound"].invoke("{}")
    [png] = picture.parts
    assert isinstance(png, DataPart) and png.media_type == "image/png" and png.data.startswith(b"\x89PNG")
    assert picture.result.startswith("A red pixel.\n[image: image/png, ") and picture.result.endswith(" bytes]")
    [wav] = sound.parts
    assert isinstance(wav, DataPart) and wav.media_type == "audio/wav" and wav.data.startswith(b"RIFF")


async def test_resources_as_a_read_tool_and_as_context() -> None:
    def answer(request: ModelRequest) -> str:
        assert request.messages[0].text.startswith("Resource docs://guide:\n# Guide")  # context_resources
        return "Use add."

    model = ScriptedModel([tool_call("read_resource", uri="docs://guide"), answer])
    async with McpTools(StdioServer(sys.executable, [SERVER]), context_resources=["docs://guide"]) as mcp:
        result = await Agent(model, providers=[mcp]).run("How do I use it?")
        pixel = await mcp.read_resource("data://pixel.png")
        missing = await mcp.read_resource("docs://nope")
    read_tool = next(t for t in model.requests[0].tools if t.name == "read_resource")
    assert "docs://guide (guide, text/markdown) - How to use the service." in read_tool.description
    assert result.messages[1].function_results[0].result == "# Guide\n\nCall add to add numbers."
    [png] = pixel.parts
    assert isinstance(png, DataPart) and png.media_type == "image/png"
    assert missing.is_error and "docs://nope" in missing.result


async def test_prompts_are_offered_to_the_application() -> None:
    async with McpTools(StdioServer(sys.executable, [SERVER])) as mcp:
        [prompt] = await mcp.prompts()
        messages = await mcp.get_prompt("review", {"language": "Rust"})
        with pytest.raises(McpError, match="prompt 'nope' failed"):
            await mcp.get_prompt("nope")
    assert prompt.name == "review" and [a.name for a in prompt.arguments] == ["language"]
    assert [(m.role, m.text) for m in messages] == [("user", "Review this Rust code for bugs.")]


async def test_a_changed_tool_list_is_listed_again() -> None:
    model = ScriptedModel([tool_call("enable_extra"), "enabled", tool_call("extra_echo", text="hello"), "done"])
    async with McpTools(StdioServer(sys.executable, [SERVER])) as mcp:
        agent = Agent(model, providers=[mcp])
        await agent.run("enable it")
        for _ in range(500):  # the notification travels on its own; wait for it (bounded)
            if mcp.tool_list_changes:
                break
            await asyncio.sleep(0.01)
        result = await agent.run("echo hello")
    assert "extra_echo" not in [t.name for t in model.requests[0].tools]
    assert "extra_echo" in [t.name for t in model.requests[2].tools]
    assert result.messages[1].function_results[0].result == "hello"


async def test_server_stderr_goes_to_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="contextpipe.mcp"):
        async with McpTools(StdioServer(sys.executable, [SERVER])) as mcp:
            await mcp.tools()
            for _ in range(500):
                if any("contextpipe test server starting" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
    assert any(r.name == "contextpipe.mcp" and "contextpipe test server starting" in r.getMessage()
               for r in caplog.records)


# --- real servers from PyPI --------------------------------------------------------------------------


async def test_real_mcp_server_time() -> None:
    server = StdioServer(sys.executable, ["-m", "mcp_server_time", "--local-timezone", "UTC"])
    model = ScriptedModel([tool_call("time.convert_time".replace(".", "_"), source_timezone="UTC", time="12:00",
                                     target_timezone="Asia/Tokyo"), "21:00 in Tokyo."])
    async with McpTools(server, prefix="time.") as mcp:
        result = await Agent(model, providers=[mcp]).run("12:00 UTC in Tokyo?")
        tools = {t.name: t for t in await mcp.tools()}
    assert {"time_get_current_time", "time_convert_time"} <= set(tools)
    assert tools["time_convert_time"].idempotent  # the server marks it read-only
    converted = json.loads(result.messages[1].function_results[0].result)
    assert converted["target"]["datetime"].endswith("T21:00:00+09:00") and converted["time_difference"] == "+9.0h"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.name=Ada", "-c", "user.email=ada@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "notes.md").write_text("first\n")
    subprocess.run([*git, "add", "notes.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "Add the release notes"], check=True)
    (repo / "draft.md").write_text("untracked\n")
    return repo


async def test_real_mcp_server_git(repo: Path) -> None:
    server = StdioServer(sys.executable, ["-m", "mcp_server_git", "--repository", str(repo)])
    model = ScriptedModel([tool_call("git_log", repo_path=str(repo), max_count=5)
                           + tool_call("git_status", repo_path=str(repo)), "One commit, one draft."])
    async with McpTools(server, prefix="git.") as mcp:
        result = await Agent(model, providers=[mcp]).run("What happened in the repo?")
        tools = {t.name: t for t in await mcp.tools()}
    by_call = {r.call_id: r for m in result.messages[1:3] for r in m.function_results}  # one message per result
    log, status = (by_call[c.call_id] for c in result.messages[0].function_calls)
    assert not log.is_error and "Add the release notes" in log.result and "Ada" in log.result
    assert not status.is_error and "draft.md" in status.result
    assert tools["git_status"].idempotent and not tools["git_commit"].idempotent
    assert {"git_diff", "git_show", "git_branch"} <= set(tools)  # the server's own names: "git." is not doubled
    assert not [name for name in tools if name.startswith("git_git")]


async def test_tool_names_that_clash_or_are_too_long_are_mapped_apart() -> None:
    odd = str(Path(__file__).parent / "fixtures" / "mcp_odd_server.py")
    async with McpTools(StdioServer(sys.executable, [odd])) as mcp:
        tools = {t.name: t for t in await mcp.tools()}
        outcomes = {name: await t.invoke('{"text": "hi"}') for name, t in tools.items()}
    assert len(tools) == 5 and "weird_name_v2" in tools and all(len(n) <= 64 for n in tools)
    assert sorted(o.result for o in outcomes.values()) == sorted(
        ["weird.name/v2: hi", "weird_name_v2: hi", f"{'x' * 80}: hi", "echo: hi", "odd_echo: hi"])  # by server name
    assert mcp.problems == []


async def test_two_tools_one_name_by_the_prefix_rule_is_a_clear_error() -> None:
    odd = StdioServer(sys.executable, [str(Path(__file__).parent / "fixtures" / "mcp_odd_server.py")])
    mcp = McpTools(odd, prefix="odd.")
    try:
        with pytest.raises(McpError, match=r"tools 'echo' and 'odd_echo' would both be offered as 'odd_echo'.*"
                                           r"include=") as info:
            await mcp.tools()
    finally:
        await mcp.close()
    assert "mcp_odd_server.py" in str(info.value)
    async with McpTools(odd, prefix="odd.", include=["echo", "weird.name/v2", "weird_name_v2"]) as mcp:
        tools = {t.name: t for t in await mcp.tools()}
        assert (await tools["odd_echo"].invoke('{"text": "hi"}')).result == "echo: hi"
    assert len(tools) == 3 and "odd_weird_name_v2" in tools  # the character clash is still told apart


@given(st.text(max_size=20), st.text(min_size=1, max_size=120))
def test_every_mapped_tool_name_is_accepted_by_model_apis(prefix: str, remote: str) -> None:
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", model_tool_name(prefix, remote))


@given(st.text(max_size=10), st.text(min_size=1, max_size=40))
def test_a_mapped_name_starts_with_the_prefix_once(prefix: str, remote: str) -> None:
    name = model_tool_name(prefix, remote)
    mapped = model_tool_name("", prefix) if prefix else ""
    assert name.startswith(mapped)
    if mapped.endswith(("_", "-")):
        assert model_tool_name(prefix, name) == name  # mapping an offered name again adds nothing
    elif len(mapped + remote) <= 64:
        assert name == mapped + model_tool_name("", remote)  # no separator: the prefix always goes first
