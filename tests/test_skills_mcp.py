"""Skills (Agent Skills folders and skills in code) and MCP tools as context providers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent, UsageError
from contextpipe.models import ModelRequest
from contextpipe.providers.mcp import HttpServer, McpTools, StdioServer
from contextpipe.providers.skills import ScriptRequest, Skill, SkillError, Skills
from contextpipe.testing import ScriptedModel, tool_call

SERVER = str(Path(__file__).parent / "fixtures" / "mcp_server.py")


def write_skill(root: Path, folder: str, front: str, body: str = "Body.", files: dict[str, str] | None = None) -> Path:
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    (path / "SKILL.md").write_text(f"---\n{front}\n---\n{body}\n", encoding="utf-8")
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    write_skill(root, "weather-advice", "name: weather-advice\ndescription: Turn a forecast into clothing advice.",
                "# Weather advice\nAbove 24 C suggest light clothes. See references/table.md.",
                {"references/table.md": "| temp | clothes |\n| 25 | T-shirt |", "scripts/feels.py":
                 "import sys\nprint('feels like', int(sys.argv[1]) - 2)\n"})
    write_skill(root, "haiku", "name: haiku\ndescription: Write haiku.\nlicense: MIT", "Use 5-7-5 syllables.")
    (tmp_path / "secret.txt").write_text("TOP SECRET", encoding="utf-8")
    os.symlink(tmp_path / "secret.txt", root / "weather-advice" / "link-out.txt")
    (root / "weather-advice" / "big.txt").write_text("x" * 5000, encoding="utf-8")
    return root


async def invoke(skills: Skills, tool_name: str, **arguments: Any) -> Any:
    tools = {t.name: t for t in [skills._load_tool({s.name: s for s in skills.catalog()}),
                                 skills._resource_tool({s.name: s for s in skills.catalog()})]}
    if skills.allow_scripts:
        tools["run_skill_script"] = skills._script_tool({s.name: s for s in skills.catalog()})
    return await tools[tool_name].invoke(json.dumps(arguments))


async def test_end_to_end_model_lists_loads_reads_and_answers(skills_dir: Path) -> None:
    def answer(request: ModelRequest) -> str:
        body = request.messages[-3].function_results[0].result
        table = request.messages[-1].function_results[0].result
        assert "Above 24 C" in body and "T-shirt" in table
        return "Wear a T-shirt (per the weather-advice skill)."

    model = ScriptedModel([tool_call("load_skill", name="weather-advice"),
                           tool_call("read_skill_resource", skill="weather-advice", path="references/table.md"),
                           answer])
    agent = Agent(model, instructions="Be helpful.", providers=[Skills(skills_dir)])
    result = await agent.run("25 C today, what should I wear?")
    assert result.text == "Wear a T-shirt (per the weather-advice skill)."
    instructions = model.requests[0].instructions or ""
    assert "- weather-advice: Turn a forecast into clothing advice." in instructions
    assert "- haiku: Write haiku." in instructions
    assert [t.name for t in model.requests[0].tools] == ["load_skill", "read_skill_resource"]
    loaded = model.requests[1].messages[-1].function_results[0].result
    assert "Files of this skill:" in loaded and "references/table.md" in loaded and "link-out.txt" not in loaded
    sources = result.traces[0]
    assert {t.source_id for t in sources.tools} == {"skills"}


@pytest.mark.parametrize("path", [
    "../haiku/SKILL.md", "../../secret.txt", "references/../../haiku/SKILL.md", "/etc/passwd", "~/secret",
    "link-out.txt", "references\\..\\..\\secret.txt", "refer\x00ences/table.md", "references/\u202etable.md",
    "", "a" * 600,
])
async def test_unsafe_resource_paths_are_refused(skills_dir: Path, path: str) -> None:
    outcome = await invoke(Skills(skills_dir), "read_skill_resource", skill="weather-advice", path=path)
    assert outcome.is_error
    assert "TOP SECRET" not in outcome.result and "Write haiku" not in outcome.result


async def test_odd_but_harmless_paths_just_miss(skills_dir: Path) -> None:
    for path in ("%2e%2e/%2e%2e/secret.txt", "\uff0e\uff0e/secret.txt", "references/missing.md"):
        outcome = await invoke(Skills(skills_dir), "read_skill_resource", skill="weather-advice", path=path)
        assert outcome.is_error and "has no file" in outcome.result


async def test_size_limits_and_unknown_skills(skills_dir: Path) -> None:
    small = Skills(skills_dir, max_resource_bytes=1000)
    outcome = await invoke(small, "read_skill_resource", skill="weather-advice", path="big.txt")
    assert outcome.is_error and "5000 bytes, over the 1000-byte limit" in outcome.result
    outcome = await invoke(small, "load_skill", name="nope")
    assert outcome.is_error and "Available: haiku, weather-advice" in outcome.result


@pytest.mark.parametrize(("front", "fragment"), [
    ("description: no name", "non-empty 'name'"),
    ("name: x\ndescription: [unclosed", "YAML front matter is invalid"),
    ("name: Bad_Name\ndescription: d", "lowercase letters"),
    ("- a list", "must be a YAML mapping"),
])
def test_malformed_skill_names_the_file(tmp_path: Path, front: str, fragment: str) -> None:
    write_skill(tmp_path, "broken", front)
    with pytest.raises(SkillError, match=fragment) as info:
        Skills(tmp_path)
    assert str(tmp_path / "broken" / "SKILL.md") in str(info.value)


def test_duplicate_names_and_missing_front_matter(tmp_path: Path) -> None:
    write_skill(tmp_path, "one", "name: same\ndescription: first")
    write_skill(tmp_path, "two", "name: same\ndescription: second")
    with pytest.raises(SkillError, match="'same' is already used by"):
        Skills(tmp_path)
    other = tmp_path / "other"
    (other / "plain").mkdir(parents=True)
    (other / "plain" / "SKILL.md").write_text("# no front matter", encoding="utf-8")
    with pytest.raises(SkillError, match="missing YAML front matter"):
        Skills(other)


async def test_changes_on_disk_are_picked_up_without_restart(skills_dir: Path) -> None:
    skills = Skills(skills_dir)
    assert sorted(s.name for s in skills.catalog()) == ["haiku", "weather-advice"]
    write_skill(skills_dir, "new-one", "name: new-one\ndescription: Added later.")
    haiku = skills_dir / "haiku" / "SKILL.md"
    haiku.write_text("---\nname: haiku\ndescription: Write tanka now.\n---\nx\n")
    os.utime(haiku, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # a clearly newer mtime
    names = {s.name: s.description for s in skills.catalog()}
    assert names == {"haiku": "Write tanka now.", "new-one": "Added later.",
                     "weather-advice": "Turn a forecast into clothing advice."}


async def test_skills_defined_in_code(tmp_path: Path) -> None:
    skills = Skills(skills=[Skill("refunds", "How to process refunds.", "Check the order first.",
                                  resources={"policy.md": "30 days."})])
    assert (await invoke(skills, "load_skill", name="refunds")).result.startswith("Check the order first.")
    assert (await invoke(skills, "read_skill_resource", skill="refunds", path="policy.md")).result == "30 days."
    with pytest.raises(SkillError):
        Skills(skills=[Skill("Bad Name", "d", "b")])


async def test_scripts_are_off_by_default_and_need_approval(skills_dir: Path) -> None:
    agent_model = ScriptedModel(["ok"])
    await Agent(agent_model, providers=[Skills(skills_dir)]).run("hi")
    assert "run_skill_script" not in [t.name for t in agent_model.requests[0].tools]
    with pytest.raises(UsageError, match="approve"):
        Skills(skills_dir, allow_scripts=True)
    asked: list[ScriptRequest] = []

    def approve(request: ScriptRequest) -> bool:
        asked.append(request)
        return request.args != ["0"]

    skills = Skills(skills_dir, allow_scripts=True, approve=approve, script_timeout=5)
    ran = await invoke(skills, "run_skill_script", skill="weather-advice", path="scripts/feels.py", args=["25"])
    assert ran.result == "exit code 0\nfeels like 23\n" and not ran.is_error
    refused = await invoke(skills, "run_skill_script", skill="weather-advice", path="scripts/feels.py", args=["0"])
    assert refused.is_error and "not approved" in refused.result
    escape = await invoke(skills, "run_skill_script", skill="weather-advice", path="../../secret.txt")
    assert escape.is_error and "inside the skill" in escape.result
    assert [r.args for r in asked] == [["25"], ["0"]]


async def test_script_timeout(tmp_path: Path) -> None:
    write_skill(tmp_path, "slow", "name: slow\ndescription: Sleeps.", files={"scripts/wait.py":
                                                                          "import time\ntime.sleep(30)\n"})
    skills = Skills(tmp_path, allow_scripts=True, approve=lambda r: True, script_timeout=0.5)
    outcome = await invoke(skills, "run_skill_script", skill="slow", path="scripts/wait.py")
    assert outcome.is_error and "did not finish within 0.5 s" in outcome.result


# --- MCP ---------------------------------------------------------------------------------------------


async def test_mcp_tools_over_stdio_end_to_end() -> None:
    model = ScriptedModel([tool_call("math_add", a=20, b=22) + tool_call("math_explode", reason="test"),
                           tool_call("math_shout", text=7), "42 it is."])
    async with McpTools(StdioServer(sys.executable, [SERVER]), source_id="math", prefix="math_") as mcp:
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
