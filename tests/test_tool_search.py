"""Tool search (`contextpipe.providers.ToolSearch`): a real MCP server with 300 tools, through `Agent.run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contextpipe import Agent, Tool, UsageError
from contextpipe.models import ModelRequest, OpenAIChatModel
from contextpipe.providers import History, McpTools, StdioServer, ToolSearch
from contextpipe.stores import SQLiteStore
from contextpipe.testing import FakeOpenAIServer, FakeReply, ScriptedModel, Turn, tool_call
from many_tools import TOOLS  # (fixtures/mcp, on the tests' path: pyproject.toml)

SERVER = str(Path(__file__).resolve().parent.parent / "fixtures" / "mcp" / "many_tools.py")


def _tool(name: str, description: str) -> Tool:
    def run(query: str = "", limit: int = 20) -> str:
        return f"{name}: {query}"

    return Tool(run, name=name, description=description)


POOL = [_tool(n, d) for n, d in TOOLS]
"""The MCP server's toolset as plain tools, for the tests that need no server."""


def names(request: ModelRequest) -> list[str]:
    return [t.name for t in request.tools]


def last_found(request: ModelRequest) -> list[str]:
    """The tool names the latest ``search_tools`` result in `request` lists."""
    result = request.messages[-1].function_results[0]
    return [t["name"] for t in json.loads(result.result)["tools"]]


def call_best(request: ModelRequest) -> Turn:
    """A model step that calls the best tool the search just found (so the search decides, not the script)."""
    return tool_call(last_found(request)[0], title="Login page is broken")


async def test_300_mcp_tools_offer_the_search_and_reach_the_right_tool() -> None:
    model = ScriptedModel([tool_call("search_tools", query="open a new GitHub issue"), call_best, "Filed it."])
    async with McpTools(StdioServer(sys.executable, [SERVER]), source_id="saas", offer_resources=False) as mcp:
        assert len(await mcp.tools()) == 300  # the fixture is built before anything is measured
        agent = Agent(model, providers=[mcp, ToolSearch(threshold=30, max_results=8)])
        result = await agent.run("File a bug: the login page is broken.")
    assert result.text == "Filed it."
    assert [len(r.tools) for r in model.requests] == [1, 9, 9]  # never the 300: at most the threshold + search_tools
    assert names(model.requests[0]) == ["search_tools"]
    assert last_found(model.requests[1])[0] == "github_create_issue"
    assert "github_create_issue" in names(model.requests[1]) and "search_tools" in names(model.requests[1])
    ran = result.messages[3].function_results[0]
    assert not ran.is_error and ran.result.startswith("github_create_issue: ")  # the server ran the right tool
    instructions = model.requests[0].instructions or ""
    assert "search_tools" in instructions and all(name in instructions for name, _ in TOOLS)  # names, as summaries
    assert "more: search to find them" not in instructions                                  # would not all fit
    assert result.traces[0].tokens_by_source()["instructions:tool-search"] <= 2_000  # the catalogue's bound
    for trace in result.traces:
        change = next(c for c in trace.changes if c.action == "tool_search")
        assert change.source_id == "tool-search"
        assert change.items[0] == f"offered {len(trace.tools)} of 301 tools"
    assert [t.name for t in result.traces[2].tools] == names(model.requests[2])


async def test_found_tools_stay_offered_and_a_resumed_run_offers_them_again(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    first = ScriptedModel([tool_call("search_tools", query="slack message"),
                           tool_call("search_tools", query="stripe refund"), RuntimeError("the worker died")])
    async with SQLiteStore(path) as store:
        agent = Agent(first, tools=POOL, providers=[History(store), ToolSearch(threshold=20, max_results=4)])
        with pytest.raises(RuntimeError):
            await agent.run("Refund the customer and tell #billing.", session=await agent.session("s"))
    found = set(last_found(first.requests[1])) | set(last_found(first.requests[2]))
    assert set(last_found(first.requests[1])) <= set(names(first.requests[2]))  # still there after the next search
    assert set(names(first.requests[2])) == found | {"search_tools"}
    again = ScriptedModel(["Done."])
    async with SQLiteStore(path) as store:  # a new process's objects: nothing remembered but the log
        agent = Agent(again, tools=POOL, providers=[History(store), ToolSearch(threshold=20, max_results=4)])
        await agent.run(None, session=await agent.session("s"))
    assert names(again.requests[0]) == names(first.requests[2])


async def test_the_catalogue_has_summaries_when_they_fit_and_stays_in_its_bound() -> None:
    model = ScriptedModel(["ok", "ok"])
    await Agent(model, tools=POOL[:40], providers=[ToolSearch(threshold=10)]).run("go")
    assert "- gmail_get_draft: Get one draft from Gmail by its id" in (model.requests[0].instructions or "")
    result = await Agent(model, tools=POOL, providers=[ToolSearch(catalogue_tokens=300)]).run("go")
    assert result.traces[0].tokens_by_source()["instructions:tool-search"] <= 300
    assert "more: search to find them)" in (model.requests[1].instructions or "")


async def test_a_tool_called_unoffered_runs_and_is_offered_from_then_on() -> None:
    model = ScriptedModel([tool_call("gmail_get_draft", query="home"), "ok"])
    result = await Agent(model, tools=POOL[:40], providers=[ToolSearch(threshold=10)]).run("route home")
    assert result.messages[1].function_results[0].result == "gmail_get_draft: home"
    assert names(model.requests[0]) == ["search_tools"]
    assert names(model.requests[1]) == ["gmail_get_draft", "search_tools"]


async def test_at_most_threshold_found_tools_the_latest_kept() -> None:
    queries = ["github", "calendar", "gmail"]
    model = ScriptedModel([*(tool_call("search_tools", query=q) for q in queries), "ok"])
    await Agent(model, tools=POOL, providers=[ToolSearch(threshold=6, max_results=5)]).run("go")
    assert [len(r.tools) for r in model.requests] == [1, 6, 7, 7]
    assert {n.split("_")[0] for n in names(model.requests[3]) if n != "search_tools"} <= {"calendar", "gmail"}
    assert set(last_found(model.requests[3])) <= set(names(model.requests[3]))


def _bodies(server: FakeOpenAIServer) -> list[str]:
    return [json.dumps(b, sort_keys=True) for b in server.requests]


@pytest.mark.parametrize("tool_search", [False, True])
async def test_at_or_below_the_threshold_requests_are_unchanged(tool_search: bool) -> None:
    bodies = []
    for with_search in (False, tool_search):
        with FakeOpenAIServer() as server:
            server.enqueue(FakeReply(tool_calls=(("github_create_issue", '{"query": "bug"}'),)))
            server.enqueue(FakeReply("Filed."))
            model = OpenAIChatModel("fake-model", base_url=server.base_url, max_retries=0)
            agent = Agent(model, tools=POOL[:30], providers=[ToolSearch(threshold=30)] if with_search else [])
            result = await agent.run("File a bug.")
            await model.close()
            assert result.text == "Filed."
            bodies.append(_bodies(server))
    assert len(bodies[0]) == 2 and bodies[0] == bodies[1]  # byte for byte, tools and instructions alike
    assert '"search_tools"' not in bodies[1][0]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(UsageError, match="max_results <= threshold"):
        ToolSearch(threshold=5, max_results=8)
    with pytest.raises(UsageError, match="catalogue_tokens >= 0"):
        ToolSearch(catalogue_tokens=-1)


_NAMES = [n for n, _ in TOOLS[:60]] + ["no_such_tool"]
_queries = st.lists(st.one_of(st.text(max_size=30).map(lambda q: ("search", q)),
                              st.sampled_from(_NAMES).map(lambda n: ("call", n))), max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picked=st.sets(st.integers(0, 59), min_size=1, max_size=40), threshold=st.integers(1, 12), steps=_queries,
       max_results=st.integers(1, 12))
async def test_offered_tools_are_of_the_toolset_and_bounded(picked: set[int], threshold: int,
                                                          steps: list[tuple[str, str]], max_results: int) -> None:
    toolset = [POOL[i] for i in sorted(picked)]
    script: list[Any] = [tool_call("search_tools", query=x) if kind == "search" else tool_call(x, query="q")
                         for kind, x in steps]
    model = ScriptedModel([*script, "done"])
    search = ToolSearch(threshold=threshold, max_results=min(max_results, threshold))
    await Agent(model, tools=toolset, providers=[search]).run("go")
    allowed = {t.name for t in toolset}
    active = len(toolset) > threshold
    for request in model.requests:
        offered = names(request)
        assert len(offered) == len(set(offered))
        if not offered:  # a call at a limit (steps, or tool errors in a row): every tool withdrawn
            continue
        if active:
            assert set(offered) <= allowed | {"search_tools"} and "search_tools" in offered
            assert len(offered) <= threshold + 1
        else:
            assert offered == [t.name for t in toolset]
