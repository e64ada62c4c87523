"""The shape of the package: public surfaces, the import graph's layers, and function complexity."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import TypeVar

import pytest
from radon.complexity import cc_visit
from radon.metrics import mi_visit

T = TypeVar("T")

SRC = Path(__file__).resolve().parents[1] / "src" / "contextpipe"

# --- public surfaces -------------------------------------------------------------------------------------

SURFACES = {
    "contextpipe.artifacts": ["MAX_ARTIFACT_BYTES", "Artifact", "artifact_info", "put_artifact", "read_artifact"],
    "contextpipe.budget": ["SOURCES", "BudgetParticipant", "ContextBudget", "RankedItems", "contributed_tokens",
                           "fit_history", "fit_listed", "fit_ranked", "ranked_message"],
    "contextpipe.models": [
        "AnthropicChatModel", "CallModel", "ChatModel", "DescribedModel", "ModelInfo", "ModelMiddleware",
        "ModelRequest", "ModelResponse", "ModelSettings", "ModelStreamEvent", "OpenAIChatModel", "OpenAIResponsesModel",
        "ReasoningDelta", "ResponseComplete", "TextDelta", "Usage",
    ],
    "contextpipe.providers": [
        "Artifacts", "Compaction", "ContextBudget", "ContextProvider", "Fact", "FactMemory", "History",
        "HistoryProvider", "HttpServer", "LoadedHistory", "McpTools", "MessageContext", "MessageFilter",
        "MessageProvider", "ScriptRequest", "SearchResult", "SemanticMemory", "Skill", "SkillProblem", "Skills",
        "StdioServer", "TextSearch", "ToolSearch", "external_input",
    ],
    "contextpipe.stores": [
        "Checkpoint", "Erased", "Lease", "MemoryStore", "MessagePage", "OutboxEntry", "PostgresStore", "RedisStore",
        "SQLiteStore", "SessionDeletedHook", "SessionInfo", "SessionKey", "SessionListing", "SessionStore",
    ],
    "contextpipe.vectors": [
        "Chunk", "E5SmallEmbedder", "Embedder", "HashEmbedder", "IndexStats", "LocalEmbedder", "MPNetEmbedder",
        "MemoryVectorStore",
        "OpenAIEmbedder", "PgVectorStore", "SQLiteVectorStore", "SearchHit", "SentenceTransformerEmbedder",
        "VectorRecord", "VectorStore", "Where", "chunk_markdown", "chunk_text", "embed_query", "embedder_for",
        "ingest_folder",
    ],
    "contextpipe.testing": [
        "AnthropicReply", "FakeAnthropicCut", "FakeAnthropicServer", "FakeError", "FakeOpenAIServer", "FakeRaw",
        "FakeReply", "FakeStreamCut", "FakeStreamError", "ScriptStep", "ScriptedModel", "Turn", "tool_call",
    ],
}


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_every_subpackage_surface_is_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(SURFACES[package])
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name}"


def test_each_concept_has_one_home() -> None:
    import contextpipe.models as models

    assert not hasattr(models, "ScriptedModel")  # test doubles live in contextpipe.testing only
    from contextpipe import errors

    assert not hasattr(errors, "ProviderError")  # AfterRunError has one name (0.1.0 was never released)


# --- the import graph ------------------------------------------------------------------------------------

# Layers from the bottom up. A module may import from its own layer or below, never from above.
# Patterns are matched against the dotted name inside the package; the first match wins, and a module
# that matches nothing is at the top (like cli and demo: it may use anything, nothing may use it).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "_lazy", "_sqlite", "_compat", "_compaction_decision", "_tool_spec",
     "_prompt_cache"),
    ("messages", "codec", "_media", "_preview", "session", "outbox", "tool_context", "approvals", "tools",
     "client_tools", "tokens", "config", "output"),
    ("exchanges", "models.base", "vectors", "vectors.*"),
    ("stores", "stores.*", "rewind"),  # a store makes its vector store (SQLiteStore.vectors); vectors know no store
    # rewind: the view of a log its markers leave, over any store
    ("_run.invariants", "compaction", "models", "models.*", "testing.scripted"),
    ("trace", "telemetry", "_semconv"),
    ("pipeline", "events", "_stream", "queue", "artifacts"),  # queue, artifacts: a session's, kept by the stores
    ("providers.base", "_run.writer", "_run.heartbeat", "_run.hooks", "_run.threads", "_run.calls", "_run.replay",
     "_run.repair", "_run.model_chain", "_run.tool_chain", "_run.way_out", "_run.approvals", "_run.inbox",
     "_run.steps", "_run.cache_watch"),
    ("providers", "providers.*", "erasure", "_agent_state", "_fork", "budget"),  # erasure: what providers, stores keep
    # of a user; budget: a provider over the other providers' contributions
    ("_run.loop", "_run", "_run.output"),  # _run.output: the loop of a run with an output type
    ("agent",),
]


def _layer(module: str) -> int:
    for rank, patterns in enumerate(LAYERS):
        if any(fnmatch(module, p) for p in patterns):
            return rank
    return len(LAYERS)


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts) or "__init__"] = path
    return found


def _retrying(parse: Callable[[str], T], source: str) -> T:
    """Parse `source`, again when CPython's AST builder raises its spurious SystemError.

    CPython 3.11 before 3.11.9 keeps the AST builder's recursion count per interpreter, so another
    thread's parse can make one fail with "AST constructor recursion depth mismatch"
    (python/cpython#106905); the same source parses on a second try.
    """
    for _ in range(4):
        try:
            return parse(source)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return parse(source)


def _imports(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Every module of the package that `name` imports: runtime, TYPE_CHECKING and function-level alike."""
    package = name.split(".") if path.name == "__init__.py" and name != "__init__" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    for node in ast.walk(_retrying(ast.parse, path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module and node.module.startswith("contextpipe"):
                target = node.module.removeprefix("contextpipe").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                yield sub if sub in known else target or "__init__"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("contextpipe."):
                    yield alias.name.removeprefix("contextpipe.")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: {t for t in _imports(name, path, known) if t != name and t in known}
            for name, path in modules.items()}


def test_no_module_imports_from_a_higher_layer() -> None:
    upward = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
              for a, targets in _graph().items() for b in sorted(targets) if _layer(b) > _layer(a)]
    assert upward == []


def test_the_import_graph_has_no_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def test_the_graph_scan_sees_type_checking_and_relative_imports() -> None:
    graph = _graph()
    assert "pipeline" in graph["providers.base"]  # a TYPE_CHECKING import
    assert "stores.base" in graph["_run.writer"]
    assert "exchanges" in graph["models.openai"]


# --- size, complexity and maintainability ---------------------------------------------------------------


def _sources() -> Iterator[tuple[str, str]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), path.read_text()


def test_no_module_holds_two_concepts() -> None:
    """A module past 600 lines is usually two concepts (STYLE.md): the inspector's JavaScript modules too."""
    scripts = ((p.relative_to(SRC).as_posix(), p.read_text()) for p in sorted(SRC.rglob("static/*.js")))
    long = {rel: lines for rel, source in (*_sources(), *scripts) if (lines := len(source.splitlines())) > 600}
    assert long == {}


def test_every_module_is_maintainable() -> None:
    """radon's maintainability index is A or B (10 or more, docstrings counted as comments) for every module."""
    low = {rel: round(index, 1) for rel, source in _sources() if (index := _retrying(_maintainability, source)) < 10}
    assert low == {}


def _maintainability(source: str) -> float:
    return float(mi_visit(source, multi=True))


def _blocks() -> Iterator[tuple[str, int]]:
    for rel, source in _sources():
        for block in _retrying(cc_visit, source):
            for item in [block, *getattr(block, "methods", [])]:
                name = f"{item.classname}.{item.name}" if getattr(item, "classname", None) else item.name
                yield f"{rel}:{name}", item.complexity


def test_the_loop_reads_like_the_algorithm() -> None:
    complexity = dict(_blocks())
    assert complexity["_run/loop.py:StepLoop.events"] <= 10


def test_no_function_is_too_complex() -> None:
    too_complex = {name: c for name, c in _blocks() if c > 15}
    assert too_complex == {}

