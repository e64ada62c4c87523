"""A long session always gets a summary checkpoint, and the summariser is called only when the trigger is crossed."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextpipe import Agent, Message
from contextpipe.compaction import Summarize, TokenBudget, Trigger, compact
from contextpipe.providers import Compaction, History
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel
from contextpipe.tokens import EstimateTokenizer, TokenCounter

ANSWER = "Here is what I found about that order: " + "the parcel left the warehouse and is on its way. " * 8


def long_log(turns: int) -> list[Message]:
    out: list[Message] = []
    for i in range(turns):
        out += [Message.user(f"Question {i}: where is order A-{1000 + i}?"), Message.assistant(f"{i}: {ANSWER}")]
    return out


def summariser() -> ScriptedModel:
    return ScriptedModel([f"summary #{n}: orders were asked about and tracked." for n in range(1, 50)])


async def test_the_summariser_is_called_once_then_only_when_the_trigger_is_crossed_again(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "long.db", synchronous="FULL")
    await store.append("default", "s", long_log(2_000))  # ~240,000 tokens, far over the summariser's cap
    summary_model = summariser()
    compaction = Compaction(Summarize(summary_model, keep_last_turns=2, max_input_tokens=2_000,
                                      trigger=Trigger(tokens=3_000)), tokenizer=EstimateTokenizer())
    model = ScriptedModel([ANSWER] * 60)
    agent = Agent(model, providers=[History(store), compaction])
    session = await agent.session("s")

    await agent.run("Where is my latest order?", session=session)
    assert len(summary_model.requests) == 1
    first = await store.latest_checkpoint("default", "s")
    assert first is not None and first.seq == 3_998  # everything but the two kept turns
    assert model.requests[-1].messages[0].text.endswith("summary #1: orders were asked about and tracked.")
    assert len(model.requests[-1].messages) == 1 + 2 + 1  # summary, the last stored turn, the input

    calls_by_run = []
    for i in range(40):
        await agent.run(f"Follow-up {i}?", session=session)
        calls_by_run.append(len(summary_model.requests))
    # New material gathers run by run; the summariser is called again once it crosses the trigger.
    crossing = calls_by_run.index(2)
    assert crossing >= 5 and calls_by_run[:crossing] == [1] * crossing
    assert calls_by_run[crossing:crossing + 5] == [2] * 5
    assert "summary #1" in summary_model.requests[1].messages[0].text  # the summary was rolled forward
    second = await store.latest_checkpoint("default", "s")
    assert second is not None and second.seq > first.seq
    # A cold start (another process) loads the checkpoint and the tail, and calls nobody.
    cold_summary = summariser()
    cold_model = ScriptedModel(["ok"])
    cold = Agent(cold_model, providers=[History(SQLiteStore(tmp_path / "long.db")), Compaction(
        Summarize(cold_summary, keep_last_turns=2, max_input_tokens=2_000, trigger=Trigger(tokens=3_000)),
        tokenizer=EstimateTokenizer())])
    await cold.run("Anything new?", session=await cold.session("s"))
    assert cold_summary.requests == []
    sent = cold_model.requests[0].messages
    assert sent[0].text.endswith("summary #2: orders were asked about and tracked.")
    assert len(sent) < 40
    assert (await store.load("default", "s", limit=1)).last_seq == 4_000 + 2 * 42  # 42 runs, nothing removed
    await store.close()


async def test_a_long_old_part_is_summarised_in_chunks_rolling_forward() -> None:
    messages = [*long_log(300), Message.user("latest")]
    model = summariser()
    counter = TokenCounter(EstimateTokenizer())
    result = await compact(messages, Summarize(model, keep_last_turns=1, max_input_tokens=1_500, max_chunks=3),
                           counter)
    assert len(model.requests) == 3
    for n, request in enumerate(model.requests[1:], 1):
        assert request.messages[0].text.startswith(f"user: [Summary of the earlier conversation]\nsummary #{n}")
    assert result.messages[0].text.endswith("summary #3: orders were asked about and tracked.")
    assert [m.text for m in result.messages[1:]] == ["latest"]
    # The summary stands for every older message, those too old to be sent included (in order).
    assert result.summarised == [m.id for m in messages[:-1]]
    actions = [d.action for d in result.decisions]
    assert actions == ["dropped", "summarised"]
    with pytest.raises(Exception, match="max_chunks"):
        Summarize(model, max_chunks=0)


async def test_an_earlier_summary_is_always_rolled_forward() -> None:
    earlier = Message.user("[Summary of the earlier conversation]\nthe customer is Ada", metadata={"summary": True})
    messages = [earlier, *long_log(100), Message.user("latest")]
    model = summariser()
    result = await compact(messages, Summarize(model, keep_last_turns=1, max_input_tokens=500),
                           TokenCounter(EstimateTokenizer()))
    sent = model.requests[0].messages[0].text
    assert sent.startswith("user: [Summary of the earlier conversation]\nthe customer is Ada")
    assert result.summarised[0] == earlier.id and len(result.summarised) == 201


async def test_token_budget_after_the_checkpoint_still_fits() -> None:
    # A pipeline as users write it: summarise, then enforce the budget on what is left.
    messages = [*long_log(50), Message.user("latest")]
    result = await compact(messages, Summarize(summariser(), keep_last_turns=2, max_input_tokens=1_000),
                           TokenCounter(EstimateTokenizer()))
    after = await compact(result.messages, TokenBudget(1_000), TokenCounter(EstimateTokenizer()))
    assert after.messages[0].metadata.get("summary") and after.tokens_after <= 1_000
