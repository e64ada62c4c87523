#!/usr/bin/env python3
"""What tool definitions cost per request with 300 MCP tools, with and without `ToolSearch`.

A real MCP server (``fixtures/mcp/many_tools.py``, 300 tools of 20 services) is started over
stdio and its tools are offered to an agent whose scripted model (named ``gpt-4o``, so the run's
token counter counts exactly with ``o200k_base``) files a GitHub issue:

- ``all definitions``: the model calls ``github_create_issue``, then answers (2 requests);
- ``tool search``: ``ToolSearch(threshold=30, max_results=8)``; the model searches, calls the tool
  the search ranked first, then answers (3 requests).

Counted from each request's trace (`PromptTrace.tools` and `tokens_by_source`, the run's counter):
tool definition tokens per request, the catalogue the search adds to the instructions, and the
whole request. Counts, not timings: one run per side gives the same figures every time.

    python bench/tool_search.py --out bench/results/tool-search.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from typing import Any

import _harness as h
from contextpipe import Agent
from contextpipe.models import ModelRequest
from contextpipe.providers import McpTools, StdioServer, ToolSearch
from contextpipe.testing import ScriptedModel, Turn, tool_call

SERVER = str(h.ROOT / "fixtures" / "mcp" / "many_tools.py")
CASE = "300 MCP tools"
TASK = "File a bug in GitHub: the login page is broken."


def _call_best(request: ModelRequest) -> Turn:
    found = json.loads(request.messages[-1].function_results[0].result)["tools"]
    return tool_call(found[0]["name"], title="Login page is broken")


async def _side(mcp: McpTools, search: bool) -> dict[str, Any]:
    script: list[Any] = ([tool_call("search_tools", query="open a new GitHub issue"), _call_best, "Filed."] if search
                         else [tool_call("github_create_issue", title="Login page is broken"), "Filed."])
    model = ScriptedModel(script, name="gpt-4o")
    providers: list[Any] = [mcp, ToolSearch(threshold=30, max_results=8)] if search else [mcp]
    result = await Agent(model, providers=providers).run(TASK)
    assert result.messages[-2].function_results[0].result.startswith("github_create_issue: ")
    traces = result.traces
    return {
        "tools": [sum(t.tokens for t in trace.tools) for trace in traces],
        "offered": [len(trace.tools) for trace in traces],
        "catalogue": traces[0].tokens_by_source().get("instructions:tool-search", 0),
        "total": [trace.total_tokens for trace in traces],
        "tokenizer": traces[0].tokenizer,
    }


async def main(out: Any) -> dict[str, Any]:
    results = h.Results("tool-search", "Tool definition tokens per request with 300 MCP tools, counted by the run's "
                        "token counter (o200k_base), with every definition offered and with ToolSearch(threshold=30)",
                        notes=["Counts from each request's trace, not timings: the figures repeat exactly.",
                               "With tool search the first request offers search_tools alone; the next ones the "
                               "8 tools found and search_tools. The catalogue (names and one-line summaries, at "
                               "most 2,000 tokens) is in the instructions of every request."])
    async with McpTools(StdioServer(sys.executable, [SERVER]), source_id="saas", offer_resources=False) as mcp:
        assert len(await mcp.tools()) == 300
        sides = {"all definitions": await _side(mcp, False), "tool search": await _side(mcp, True)}
    for side, got in sides.items():
        results.add(CASE, side, "tool definition tokens per request (mean)", "tokens",
                    value=round(statistics.fmean(got["tools"]), 1), per_request=got["tools"])
        results.add(CASE, side, "tools offered per request (max)", "tools", value=max(got["offered"]),
                    per_request=got["offered"])
        results.add(CASE, side, "catalogue in the instructions", "tokens", value=got["catalogue"])
        results.add(CASE, side, "whole request per request (mean)", "tokens",
                    value=round(statistics.fmean(got["total"]), 1), per_request=got["total"])
        results.add(CASE, side, "requests to file the issue", "requests", value=len(got["total"]))
    results.ratio(CASE, "tool definition tokens per request (mean)", side="tool search", over="all definitions")
    results.ratio(CASE, "whole request per request (mean)", side="tool search", over="all definitions")
    return results.write(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    h.out_argument(parser, "tool-search")
    doc = asyncio.run(main(parser.parse_args().out))
    print(h.table(doc))
