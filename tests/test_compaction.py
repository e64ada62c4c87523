"""Compaction and token budgets: never lose, never split, linear cost."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextpipe import (
    Agent,
    ContextPipeError,
    ContextProvider,
    FunctionCall,
    FunctionResult,
    Message,
    RequestInvariantError,
    RunContext,
    RunLimits,
    Usage,
    tool,
)
from contextpipe._run.invariants import check_messages
from contextpipe.compaction import (
    ClearToolResults,
    CompactionPipeline,
    CompactionStrategy,
    EmptySummary,
    SlidingWindow,
    Summarize,
    TokenBudget,
    Trigger,
    compact,
    group_messages,
)
from contextpipe.exchanges import exchange_problem
from contextpipe.models import ModelRequest, ModelResponse
from contextpipe.providers import Compaction, History
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from contextpipe.tokens import (
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    Calibration,
    EstimateTokenizer,
    TiktokenTokenizer,
    TokenCounter,
    tokenizer_for_model,
)

# --- tokens ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "text", "ids"),
    [
        ("cl100k_base", "hello world", [15339, 1917]),
        ("cl100k_base", "tiktoken is great!", [83, 1609, 5963, 374, 2294, 0]),
        ("o200k_base", "hello world", [24912, 2375]),
    ],
)
def test_exact_token_ids_for_known_strings(encoding: str, text: str, ids: list[int]) -> None:
    tokenizer = TiktokenTokenizer(encoding)
    assert tokenizer.encode(text) == ids
    assert tokenizer.count_text(text) == len(ids)


def test_model_names_pick_the_right_encoding() -> None:
    assert tokenizer_for_model("gpt-4o-mini").name == "o200k_base"
    assert tokenizer_for_model("openai/gpt-5").name == "o200k_base"
    assert tokenizer_for_model("gpt-4-turbo").name == "cl100k_base"
    assert tokenizer_for_model("llama3.2").name == "estimate"
    assert tokenizer_for_model("gpt-4o").exact and not tokenizer_for_model("mistral").exact


def test_message_counts_include_chat_overhead_and_are_cached() -> None:
    counter = TokenCounter(TiktokenTokenizer("cl100k_base"))
    m = Message.user("hello world")
    assert counter.message(m) == 2 + MESSAGE_OVERHEAD
    call = Message("assistant", (FunctionCall("c1", "lookup", '{"key": "k"}'),))
    assert counter.message(call) == MESSAGE_OVERHEAD + MESSAGE_OVERHEAD + 1 + len(
        TiktokenTokenizer("cl100k_base").encode('{"key": "k"}'))
    for _ in range(5):
        counter.messages([m, call, m.with_source(m.source or _input_source())])
    assert counter.counted == 2  # each message id is counted once, however often it is seen


def _input_source() -> Any:
    from contextpipe.messages import Source

    return Source("input")


def test_calibration_learns_from_reported_usage() -> None:
    counter = TokenCounter(EstimateTokenizer())
    m = Message.user("x" * 400)
    assert counter.message(m) == 103
    for _ in range(20):
        counter.calibration.observe(estimated=100, reported=150)
    assert counter.calibration.ratio == pytest.approx(1.5, rel=1e-3)
    assert counter.message(m) == 155
    exact = TokenCounter(TiktokenTokenizer("cl100k_base"), calibration=Calibration(ratio=3.0, samples=5))
    assert exact.message(Message.user("hello world")) == 5  # exact counts are never scaled
    restored = Calibration.from_dict(json.loads(json.dumps(counter.calibration.to_dict())))
    assert restored.ratio == counter.calibration.ratio


# --- grouping --------------------------------------------------------------------------------------


def call(cid: str, name: str = "lookup") -> Message:
    return Message("assistant", (FunctionCall(cid, name, "{}"),))


def result(*cids: str, text: str = "r") -> Message:
    return Message("tool", tuple(FunctionResult(c, text) for c in cids))


def test_grouping_keeps_each_exchange_whole_even_when_results_are_not_adjacent() -> None:
    msgs = [Message.system("rules"), Message.user("q"), Message("assistant", (FunctionCall("a", "f", "{}"),
                                                                              FunctionCall("b", "f", "{}"))),
            result("a"), Message.user("interjection"), result("b"), Message.assistant("answer"), result("zzz")]
    groups = group_messages(msgs)
    assert [(g.kind, g.start, g.end) for g in groups] == [
        ("system", 0, 1), ("user", 1, 2), ("tool_exchange", 2, 6), ("assistant", 6, 7), ("orphan", 7, 8)]


# --- strategies ------------------------------------------------------------------------------------


def conversation(turns: int, *, tool_every: int = 2, size: int = 40) -> list[Message]:
    out: list[Message] = []
    for t in range(turns):
        out.append(Message.user(f"question {t} " + "q" * size))
        if t % tool_every == 0:
            out += [call(f"c{t}"), result(f"c{t}", text=f"data {t} " + "d" * size * 3)]
        out.append(Message.assistant(f"answer {t} " + "a" * size))
    return out


def estimate() -> TokenCounter:
    return TokenCounter(EstimateTokenizer())


async def test_token_budget_drops_oldest_groups_until_it_fits() -> None:
    msgs = [*conversation(10), Message.user("latest")]
    counter = estimate()
    before = await compact(msgs, TokenBudget(10_000), counter)
    assert before.messages == msgs and not before.changed
    res = await compact(msgs, TokenBudget(300), counter, instructions="Be brief.")
    assert res.tokens_after <= 300 < res.tokens_before
    assert res.messages[-1].text == "latest"
    assert res.messages == msgs[len(msgs) - len(res.messages):]  # a suffix: only the oldest went
    [decision] = res.decisions
    assert decision.action == "dropped" and decision.tokens_before == res.tokens_before
    assert set(decision.message_ids) == {m.id for m in msgs[:len(msgs) - len(res.messages)]}
    check_messages(res.messages, latest_input=msgs[-1])


async def test_token_budget_never_drops_the_latest_input_and_says_so() -> None:
    msgs = [Message.user("old"), Message.assistant("old answer"), Message.user("L" * 4000)]
    res = await compact(msgs, TokenBudget(100), estimate())
    assert [m.text[:1] for m in res.messages] == ["L"]
    assert res.decisions[-1].action == "over_budget"


async def test_sliding_window_by_messages_and_turns() -> None:
    msgs = conversation(6)
    by_turns = await compact(msgs, SlidingWindow(max_turns=2), estimate())
    assert [m.text.split()[1] for m in by_turns.messages if m.role == "user"] == ["4", "5"]
    by_messages = await compact(msgs, SlidingWindow(max_messages=5), estimate())
    assert len(by_messages.messages) <= 5
    assert exchange_problem(by_messages.messages) is None


async def test_triggers_decide_when_a_strategy_runs() -> None:
    msgs = conversation(6)
    quiet = await compact(msgs, SlidingWindow(max_turns=1, trigger=Trigger(messages=100)), estimate())
    assert not quiet.changed
    fired = await compact(msgs, SlidingWindow(max_turns=1, trigger=Trigger(turns=3)), estimate())
    assert fired.changed
    tokens = await compact(msgs, SlidingWindow(max_turns=1, trigger=Trigger(tokens=50)), estimate())
    assert tokens.changed


async def test_clear_tool_results_replaces_old_large_results_with_placeholders() -> None:
    msgs = conversation(8, tool_every=1)
    res = await compact(msgs, ClearToolResults(keep_last=2, min_tokens=20), estimate())
    tool_msgs = [m for m in res.messages if m.role == "tool"]
    assert len(tool_msgs) == 8
    cleared = [m for m in tool_msgs if m.function_results[0].result.startswith("[cleared")]
    assert len(cleared) == 6
    assert "tokens of lookup output" in cleared[0].function_results[0].result
    assert [m.function_results[0].result for m in tool_msgs[-2:]] == [
        m.function_results[0].result for m in msgs if m.role == "tool"][-2:]
    assert res.tokens_after < res.tokens_before
    assert all(m.metadata["compacted_from"] for m in cleared)
    originals = [m for m in msgs if m.role == "tool"]
    assert all(not m.function_results[0].result.startswith("[cleared") for m in originals)  # inputs untouched


async def test_summarize_replaces_old_turns_with_a_summary() -> None:
    summariser = ScriptedModel(["The user asked about 0 to 3; lookups returned data."])
    msgs = conversation(6)
    res = await compact(msgs, Summarize(summariser, keep_last_turns=2), estimate())
    assert res.messages[0].text.startswith("[Summary of the earlier conversation]\nThe user asked")
    assert [m.text.split()[1] for m in res.messages[1:] if m.role == "user"] == ["4", "5"]
    sent = summariser.requests[0]
    # Each message on a line of its own, as `contextpipe.trace.preview` renders it, after its role.
    assert "user: question 0" in sent.messages[0].text and "\nassistant: call lookup({})\n" in sent.messages[0].text
    assert "\ntool: result: data 0" in sent.messages[0].text
    assert sent.instructions is not None and "summary" in sent.instructions
    assert res.decisions[-1].action == "summarised"
    assert res.summarised == [m.id for m in msgs[:len(msgs) - len(res.messages) + 1]]


async def test_summarize_caps_its_input_and_falls_back_to_truncation_on_failure() -> None:
    msgs = conversation(10)
    capped = ScriptedModel(["short summary"])
    res = await compact(msgs, Summarize(capped, keep_last_turns=2, max_input_tokens=120), estimate())
    assert [d.action for d in res.decisions] == ["dropped", "summarised"]
    assert "input cap" in res.decisions[0].reason
    assert "question 0" not in capped.requests[0].messages[0].text
    failing = ScriptedModel([ConnectionError("summariser down")])
    res = await compact(msgs, Summarize(failing, keep_last_turns=2), estimate())
    assert [d.action for d in res.decisions] == ["dropped"]
    assert "summary failed (ConnectionError: summariser down)" in res.decisions[0].reason
    silent = ScriptedModel(["  "])
    res = await compact(msgs, Summarize(silent, keep_last_turns=2), estimate())
    assert [d.action for d in res.decisions] == ["dropped"]
    assert "summary failed (EmptySummary: the summariser model 'scripted' returned no text" in res.decisions[0].reason
    assert issubclass(EmptySummary, ContextPipeError)
    assert [m.text.split()[1] for m in res.messages if m.role == "user"] == ["8", "9"]


async def test_pipeline_runs_strategies_in_order() -> None:
    msgs = conversation(12, tool_every=1)
    pipeline = CompactionPipeline([ClearToolResults(keep_last=1, min_tokens=10), TokenBudget(600)])
    res = await compact(msgs, pipeline, estimate())
    assert [d.strategy for d in res.decisions] == ["clear_tool_results", "token_budget"]
    assert res.tokens_after <= 600


# --- property tests --------------------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Random conversations: text turns, single and parallel calls, results split or late."""
    out: list[Message] = []
    if draw(st.booleans()):
        out.append(Message.system("system " + "s" * draw(st.integers(0, 80))))
    n = 0
    for _ in range(draw(st.integers(1, 12))):
        out.append(Message.user("u" * draw(st.integers(1, 200))))
        for _ in range(draw(st.integers(0, 3))):
            width = draw(st.integers(1, 3))
            ids = [f"c{n + i}" for i in range(width)]
            n += width
            out.append(Message("assistant", tuple(FunctionCall(c, "f", "{}") for c in ids)))
            if draw(st.booleans()):
                out.append(result(*ids, text="r" * draw(st.integers(0, 300))))
            else:
                for c in ids:
                    out.append(result(c, text="r" * draw(st.integers(0, 300))))
        if draw(st.booleans()):
            out.append(Message.assistant("a" * draw(st.integers(0, 200))))
    out.append(Message.user("latest " + "l" * draw(st.integers(0, 50))))
    return out


def strategies_under_test(budget: int) -> list[CompactionStrategy]:
    return [
        TokenBudget(budget),
        SlidingWindow(max_messages=max(1, budget // 40)),
        SlidingWindow(max_turns=max(0, budget // 200)),
        ClearToolResults(keep_last=1, min_tokens=10),
        Summarize(ScriptedModel(["summary"] * 3), keep_last_turns=1),
        Summarize(ScriptedModel([RuntimeError("down")]), keep_last_turns=1),
        CompactionPipeline([ClearToolResults(keep_last=1, min_tokens=5), TokenBudget(budget)]),
    ]


@settings(max_examples=60, deadline=None)
@given(msgs=conversations(), budget=st.integers(20, 3000))
async def test_every_strategy_keeps_every_invariant(msgs: list[Message], budget: int) -> None:
    assert exchange_problem(msgs) is None  # the generator makes valid conversations
    latest = msgs[-1]
    systems = [m for m in msgs if m.role == "system"]
    originals = {m.id: m for m in msgs}
    for strategy in strategies_under_test(budget):
        res = await compact(msgs, strategy, estimate(), instructions="rules")
        check_messages(res.messages, latest_input=latest)  # non-empty, whole exchanges, input kept
        assert all(s in res.messages for s in systems)
        ids = [m.id for m in res.messages]
        kept = [i for i in ids if i in originals]
        assert kept == [m.id for m in msgs if m.id in set(kept)]  # order preserved, nothing invented
        for m in res.messages:
            assert m.id in originals or m.metadata.get("summary") or m.metadata.get("compacted_from")
        if isinstance(strategy, TokenBudget) and res.tokens_after > budget:
            assert res.decisions[-1].action == "over_budget"


# --- in the agent ----------------------------------------------------------------------------------


async def test_sixty_step_tool_loop_stays_under_budget_and_loses_nothing() -> None:
    budget = 1_500
    tokenizer = TiktokenTokenizer("o200k_base")
    counter = TokenCounter(tokenizer)
    seen: list[int] = []
    problems: list[str] = []

    def step(request: ModelRequest) -> Any:
        problem = exchange_problem(request.messages)
        if problem:
            problems.append(problem)
        seen.append(counter.text(request.instructions) + counter.tools(request.tools)
                    + sum(counter.messages(request.messages)) + REPLY_PRIMING)
        return Turn(text="all 60 pages read") if len(seen) > 60 else tool_call("read_page", page=len(seen))

    @tool(run_in_thread=False)
    def read_page(page: int) -> str:
        """Read one page of a long report."""
        return f"page {page}: " + " ".join(f"word{page}-{i}" for i in range(60))

    store = MemoryStore()
    model = ScriptedModel([step] * 61, name="gpt-4o")
    agent = Agent(model, instructions="Read every page, then answer.", tools=[read_page],
                  providers=[History(store), Compaction(max_input_tokens=budget, tokenizer=tokenizer)],
                  limits=RunLimits(max_steps=100))
    session = await agent.session("report")
    result = await agent.run("Summarise the report.", session=session)
    assert result.text == "all 60 pages read"
    assert len(seen) == 61 and max(seen) <= budget, f"largest request {max(seen)} tokens"
    assert problems == []
    assert all(any(m.text == "Summarise the report." for m in r.messages) for r in model.requests)
    log = await agent.history(session)
    assert len(log) == 1 + 60 * 2 + 1  # nothing stored was lost: every call and result is in the log
    assert sum(1 for m in log for _ in m.function_results) == 60
    dropped = [d for t in result.traces for d in t.compaction if d.action == "dropped"]
    assert dropped and all(d.tokens_after < d.tokens_before for d in dropped)


async def test_summary_checkpoint_is_stored_and_used_by_the_next_run() -> None:
    store = MemoryStore()
    chat = ScriptedModel([f"answer {i}" for i in range(6)])
    agent = Agent(chat, providers=[History(store)])
    session = await agent.session("long")
    for i in range(6):
        await agent.run(f"question {i}", session=session)
    summariser = ScriptedModel(["Q0-Q4 were asked and answered."])
    compaction = Compaction(Summarize(summariser, keep_last_turns=2), tokenizer=EstimateTokenizer())
    model = ScriptedModel(["answer 6", "answer 7"])
    agent2 = Agent(model, providers=[History(store), compaction])
    await agent2.run("question 6", session=session)
    sent = model.requests[0].messages
    assert sent[0].text.endswith("Q0-Q4 were asked and answered.")
    assert [m.text for m in sent[1:]] == ["question 5", "answer 5", "question 6"]
    assert len(summariser.requests) == 1  # the in-loop pass reuses the summary, it does not redo it
    checkpoint = await store.latest_checkpoint("default", "long")
    assert checkpoint is not None and checkpoint.seq == 10
    # Next run: the checkpoint plus the tail are loaded; the summariser is not needed again.
    plain = ScriptedModel(["answer 7"])
    await Agent(plain, providers=[History(store)]).run("question 7", session=session)
    assert plain.requests[0].messages[0].text.endswith("Q0-Q4 were asked and answered.")
    assert [m.text for m in plain.requests[0].messages[1:]] == [
        "question 5", "answer 5", "question 6", "answer 6", "question 7"]
    assert len(await agent.history(session)) == 16  # the log itself is complete and unchanged


async def test_calibration_is_learned_per_session_from_usage() -> None:
    def reply(request: ModelRequest) -> ModelResponse:
        return ModelResponse([Message.assistant("ok")], usage=Usage(input_tokens=200, output_tokens=1))

    store = MemoryStore()
    compaction = Compaction(max_input_tokens=100_000, tokenizer=EstimateTokenizer())
    agent = Agent(ScriptedModel([reply] * 3), providers=[History(store), compaction])
    session = await agent.session("cal")
    for _ in range(3):
        await agent.run("hello", session=session)
    stored = await store.get_session("default", "cal")
    assert stored is not None
    state = stored.state["contextpipe.calibration"]  # the agent's, shared by traces and compaction
    assert state["samples"] == 3 and state["ratio"] > 1.5


async def test_an_agent_without_compaction_calibrates_its_estimates_too() -> None:
    """The run learns the calibration after every model call that reports usage, whatever its providers."""
    def reply(request: ModelRequest) -> ModelResponse:
        return ModelResponse([Message.assistant("ok")], usage=Usage(input_tokens=500, output_tokens=1))

    store = MemoryStore()
    agent = Agent(ScriptedModel([reply] * 2), providers=[History(store)])  # no Compaction
    session = await agent.session("plain")
    first = await agent.run("hello there", session=session)
    stored = await store.get_session("default", "plain")
    assert stored is not None
    kept = stored.state["contextpipe.calibration"]
    assert kept["samples"] == 1 and kept["ratio"] > 5  # reported 500 for a request estimated at a few dozen
    second = await agent.run("and again", session=session)
    # The first run's call was estimated uncalibrated; the second run starts from the learned ratio.
    assert first.traces[0]._ratio == 1.0 and second.traces[0]._ratio == pytest.approx(kept["ratio"])
    estimate = EstimateTokenizer().count_text("hello there") + MESSAGE_OVERHEAD
    assert first.traces[0].tokens_by_source()["input"] == estimate
    assert second.traces[0].tokens_by_source()["history:history"] > 5 * estimate  # the same message, calibrated


async def test_a_broken_request_never_reaches_the_model() -> None:
    class Breaker(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            ctx.replace_messages([call("dangling")])

    model = ScriptedModel(["never"])
    with pytest.raises(RequestInvariantError, match="dangling"):
        await Agent(model, providers=[Breaker("breaker")]).run("hi")
    assert model.requests == []


def test_decisions_serialise_for_traces() -> None:
    from dataclasses import asdict

    from contextpipe.compaction import CompactionDecision

    d = CompactionDecision("token_budget", "dropped", ("m1",), "over", 10, 5)
    assert json.loads(json.dumps(asdict(d)))["tokens_after"] == 5


async def test_traces_and_compaction_count_with_one_calibrated_counter() -> None:
    def reply(request: ModelRequest) -> ModelResponse:
        return ModelResponse([Message.assistant("ok " * 20)], usage=Usage(input_tokens=2_000, output_tokens=1))

    budgets: list[int] = []

    class Budgeter(ContextProvider):
        async def before_run(self, ctx: RunContext) -> None:
            budgets.append(sum(ctx.tokens.message(m) for m in ctx.messages if m.source and
                               m.source.kind == "history"))

    store = MemoryStore()
    agent = Agent(ScriptedModel([reply] * 4), providers=[History(store), Budgeter("budget"),
                                                         Compaction(max_input_tokens=100_000)])
    session = await agent.session("one-count")
    for _ in range(4):
        result = await agent.run("hello there, how are you today?", session=session)
    ratio = session.state["contextpipe.calibration"]["ratio"]
    assert ratio > 5  # the model reports far more than the estimate: calibration matters here
    assert result.traces[0].tokens_by_source()["history:history"] == budgets[-1]


async def test_a_run_learns_the_calibration_once_whatever_its_steps() -> None:
    """Learning passes over the whole request: once a run, not once a model call of a long tool loop."""
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    def calls(request: ModelRequest) -> ModelResponse:
        return ModelResponse([Message("assistant", (FunctionCall(f"c{len(request.messages)}", "ping", "{}"),))],
                             usage=Usage(input_tokens=400, output_tokens=1))

    def answer(request: ModelRequest) -> ModelResponse:
        return ModelResponse([Message.assistant("done")], usage=Usage(input_tokens=900, output_tokens=1))

    store = MemoryStore()
    agent = Agent(ScriptedModel([calls, calls, answer]), tools=[ping], providers=[History(store)])
    session = await agent.session("loop")
    result = await agent.run("ping twice", session=session)
    assert len(result.traces) == 3
    assert session.state["contextpipe.calibration"]["samples"] == 1


async def test_compaction_with_a_tokenizer_of_its_own_learns_the_ratio_of_its_own_estimates() -> None:
    """Compaction scales its own counts with the calibration, so it must learn from its own estimates."""
    def reply(request: ModelRequest) -> ModelResponse:
        return ModelResponse([Message.assistant("ok")], usage=Usage(input_tokens=3_000, output_tokens=1))

    ratios = []
    for chars_per_token in (4.0, 8.0):  # the second counts half as many tokens for the same request
        compaction = Compaction(max_input_tokens=100_000, tokenizer=EstimateTokenizer(chars_per_token))
        agent = Agent(ScriptedModel([reply]), providers=[History(MemoryStore()), compaction])
        session = await agent.session("own")
        await agent.run("a question long enough to be counted in tokens " * 4, session=session)
        ratios.append(session.state["contextpipe.calibration"]["ratio"])
    assert ratios[1] == pytest.approx(2 * ratios[0], rel=0.2)
