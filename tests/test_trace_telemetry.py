"""Prompt provenance (PromptTrace) and OpenTelemetry spans."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from contextpipe import Agent, ContextProvider, Message, ModelServerError, RunContext, Usage, tool
from contextpipe.compaction import TokenBudget
from contextpipe.models import ModelResponse
from contextpipe.providers import Compaction, History
from contextpipe.stores import MemoryStore
from contextpipe.telemetry import Telemetry
from contextpipe.testing import ScriptedModel, Turn, tool_call
from contextpipe.tokens import REPLY_PRIMING, TiktokenTokenizer, TokenCounter


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-{key}"


@tool
def search_docs(query: str) -> str:
    """Search the documents."""
    return "doc"


class Memory(ContextProvider):
    kind = "memory"

    async def before_run(self, ctx: RunContext) -> None:
        ctx.add_instructions("The user likes tea.")
        ctx.add_messages([Message.user("Memory: the user visited Suzhou last year.")])
        ctx.add_tools([search_docs])


async def traced_run(budget: int | None = None) -> tuple[Any, Agent, MemoryStore]:
    store = MemoryStore()
    seed = Agent(ScriptedModel(["first answer " + "x" * 400]), providers=[History(store)])
    session = await seed.session("s")
    await seed.run("first question " + "q" * 400, session=session)
    providers: list[ContextProvider] = [History(store), Memory("memory")]
    if budget is not None:
        providers.append(Compaction(TokenBudget(budget), tokenizer=TiktokenTokenizer("o200k_base")))
    model = ScriptedModel([
        Turn(calls=tool_call("lookup", key="k").calls, usage=Usage(321, 12)),
        Turn(text="done", usage=Usage(400, 3)),
    ], name="gpt-4o")
    agent = Agent(model, instructions="You are helpful.", tools=[lookup], providers=providers)
    result = await agent.run("what is k?", session=session)
    return result, agent, store


async def test_trace_shows_every_source_and_tokens_add_up() -> None:
    result, agent, _ = await traced_run()
    first, second = result.traces
    assert [(i.source_id, i.text) for i in first.instructions] == [
        ("agent", "You are helpful."), ("memory", "The user likes tea.")]
    assert [(m.role, m.source_kind, m.source_id) for m in first.messages] == [
        ("user", "history", "history"), ("assistant", "history", "history"),
        ("user", "context", "memory"), ("user", "input", None)]
    assert [(t.name, t.source_id) for t in first.tools] == [("lookup", "agent"), ("search_docs", "memory")]
    assert [(m.source_kind, m.source_id) for m in second.messages[-2:]] == [("model", "gpt-4o"), ("tool", "lookup")]
    assert first.usage == Usage(321, 12) and first.finish_reason == "tool_calls"
    assert {t.source_id for t in first.provider_timings} == {"history", "memory"}
    assert {t.hook for t in second.provider_timings} == {"after_run"}
    for trace in result.traces:
        by_source = trace.tokens_by_source()
        assert sum(by_source.values()) == trace.total_tokens
        # The total is the exact o200k count of what the model was sent.
        counter = TokenCounter(TiktokenTokenizer("o200k_base"))
        request = agent.model.requests[trace.step - 1]  # type: ignore[attr-defined]
        expected = (counter.text(request.instructions) - counter.text("\n\n")
                    + sum(counter.messages(request.messages)) + counter.tools(request.tools) + REPLY_PRIMING)
        assert abs(trace.total_tokens - expected) <= 1  # instructions are counted block by block
        assert trace.tokenizer == "o200k_base"
    assert first.tokens_by_source()["history:history"] == sum(
        m.tokens for m in first.messages if m.source_kind == "history")
    text = first.table()
    assert "history:history" in text and "context:memory" in text and "tools:memory" in text


async def test_trace_records_what_compaction_did_and_serialises() -> None:
    result, _, _ = await traced_run(budget=200)
    first = result.traces[0]
    [decision] = [d for d in first.compaction if d.action == "dropped"]
    assert decision.strategy == "token_budget" and decision.tokens_after <= 200 < decision.tokens_before
    # The oldest group (the first question) left the view; the trace shows what remained and why.
    assert [m.role for m in first.messages if m.source_kind == "history"] == ["assistant"]
    assert len(decision.message_ids) == 1
    data = json.loads(first.to_json())
    assert data["compaction"][0]["action"] == "dropped"
    assert data["tokens_by_source"] == first.tokens_by_source()
    assert "compaction: token_budget dropped 1 message(s)" in first.table()


async def test_stored_traces_fold_history_runs() -> None:
    result, _, _ = await traced_run()
    folded = result.traces[0].to_dict(compact_runs=True)["messages"]
    assert folded[0]["run"] is True and folded[0]["count"] == 2
    assert [m["source_kind"] for m in folded] == ["history", "context", "input"]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


async def test_otel_spans_follow_genai_conventions(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    store = MemoryStore()
    model = ScriptedModel([Turn(calls=tool_call("lookup", key="k").calls, usage=Usage(50, 5)),
                           Turn(text="done", usage=Usage(60, 2))], name="gpt-4o")
    agent = Agent(model, tools=[lookup], providers=[History(store)], name="weather",
                  telemetry=Telemetry(tracer_provider=provider))
    await agent.run("what is k?", session=await agent.session("conv-1"))
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert set(finished) == {"invoke_agent weather", "chat gpt-4o", "execute_tool lookup",
                             "contextpipe.before_run history", "contextpipe.after_run history"}
    root = finished["invoke_agent weather"]
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == "conv-1"
    assert root.attributes["gen_ai.usage.input_tokens"] == 110
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-4o"]
    assert len(chats) == 2 and chats[0].kind == SpanKind.CLIENT
    assert chats[0].attributes["gen_ai.usage.input_tokens"] == 50
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_call",)
    assert chats[0].attributes["gen_ai.request.model"] == "gpt-4o"
    tool_span = finished["execute_tool lookup"]
    assert tool_span.attributes["gen_ai.tool.name"] == "lookup"
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call_1"
    for span in exporter.get_finished_spans():
        if span is not root:
            assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert "gen_ai.input.messages" not in (span.attributes or {})  # content is opt-in
        assert "gen_ai.tool.call.arguments" not in (span.attributes or {})


async def test_otel_content_is_recorded_only_when_asked(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans
    model = ScriptedModel([tool_call("lookup", key="secret"), "done"])
    agent = Agent(model, tools=[lookup], telemetry=Telemetry(tracer_provider=provider, capture_content=True))
    await agent.run("what is secret?")
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    chat = next(s for s in exporter.get_finished_spans() if s.name.startswith("chat"))
    assert "what is secret?" in chat.attributes["gen_ai.input.messages"]
    assert by_name["execute_tool lookup"].attributes["gen_ai.tool.call.arguments"] == '{"key": "secret"}'
    assert by_name["execute_tool lookup"].attributes["gen_ai.tool.call.result"] == "value-secret"


async def test_otel_marks_failures(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = spans

    def failing(_: Any) -> ModelResponse:
        raise ModelServerError("HTTP 503", status_code=503)

    agent = Agent(ScriptedModel([failing]), telemetry=Telemetry(tracer_provider=provider))
    with pytest.raises(ModelServerError):
        await agent.run("hi")
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    for name in ("chat scripted", "invoke_agent agent"):
        assert by_name[name].status.status_code == StatusCode.ERROR
        assert by_name[name].attributes["error.type"] == "ModelServerError"


def test_no_tracer_provider_means_no_opentelemetry_at_all() -> None:
    code = (
        "import asyncio, sys\nfrom contextpipe import Agent\nfrom contextpipe.testing import ScriptedModel\n"
        "asyncio.run(Agent(ScriptedModel(['hi'])).run('hello'))\n"
        "print(any(m.startswith('opentelemetry') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


async def test_otel_run_span_ends_when_the_session_is_busy(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    from contextpipe import SessionBusy

    provider, exporter = spans
    store = MemoryStore()
    agent = Agent(ScriptedModel([]), providers=[History(store)], telemetry=Telemetry(tracer_provider=provider))
    session = await agent.session("busy")
    await store.acquire_lease("default", "busy", "another-worker", ttl=30)
    with pytest.raises(SessionBusy):
        await agent.run("hi", session=session)
    [root] = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert root.attributes["error.type"] == "SessionBusy"
