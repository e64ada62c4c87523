"""The token cache: bounded, constant-time eviction, and one part per session."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from contextpipe import Agent, Message
from contextpipe.compaction import TokenBudget
from contextpipe.errors import UsageError
from contextpipe.providers import Compaction, History
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel
from contextpipe.tokens import EstimateTokenizer, TiktokenTokenizer, TokenCache, TokenCounter


def test_counting_over_more_messages_than_the_cache_holds_stays_bounded_and_exact() -> None:
    messages = [Message.user(f"message number {i} " + "x" * (i % 37)) for i in range(5_000)]
    exact = TokenCounter(TiktokenTokenizer("o200k_base"), cache_size=10**9)
    expected = exact.messages(messages)
    bounded = TokenCounter(TiktokenTokenizer("o200k_base"), cache_size=700)
    for _ in range(3):
        assert bounded.messages(messages) == expected
        assert len(bounded._cache) <= 700
    # Each pass counted what had been dropped again, and kept the newest 700 counts.
    assert bounded.counted == 3 * 5_000
    assert list(bounded._cache) == [m.id for m in messages[-700:]]
    assert [bounded.raw_message(m) for m in messages[-700:]] == expected[-700:]
    assert bounded.counted == 3 * 5_000  # those were cache hits


def test_any_mapping_can_be_the_cache_and_stays_bounded() -> None:
    plain: dict[str, int] = {}
    counter = TokenCounter(EstimateTokenizer(), cache=plain, cache_size=50)
    counts = counter.messages([Message.user("y" * i) for i in range(1, 200)])
    assert counts == [3 + -(-i // 4) for i in range(1, 200)]
    assert len(plain) <= 50
    with pytest.raises(UsageError, match="cache_size"):
        TokenCounter(EstimateTokenizer(), cache_size=0)


def test_a_busy_session_cannot_evict_the_others_counts() -> None:
    cache = TokenCache(max_messages=3_000, max_per_session=1_000)
    quiet = [Message.user(f"quiet {i}") for i in range(200)]
    TokenCounter(EstimateTokenizer(), cache=cache.scope("quiet"), cache_size=cache.max_per_session).messages(quiet)
    busy = TokenCounter(EstimateTokenizer(), cache=cache.scope("busy"), cache_size=cache.max_per_session)
    busy.messages([Message.user(f"busy {i}") for i in range(20_000)])
    assert len(cache.scope("busy")) == 1_000
    again = TokenCounter(EstimateTokenizer(), cache=cache.scope("quiet"), cache_size=cache.max_per_session)
    again.messages(quiet)
    assert again.counted == 0  # every count of the quiet session was still there
    # Sessions beyond max_messages // max_per_session: the least recently used one goes, whole.
    for name in ("a", "b"):
        cache.scope(name)["m"] = 1
    assert len(cache) <= 3_000 and "m" in cache.scope("b")
    assert len(cache.scope("busy")) == 0  # "busy" was used longest ago, so it was dropped
    with pytest.raises(UsageError, match="max_per_session"):
        TokenCache(max_messages=10, max_per_session=20)


async def test_the_agent_and_compaction_count_each_session_in_its_own_part() -> None:
    store = MemoryStore()
    compaction = Compaction(TokenBudget(100_000), tokenizer=EstimateTokenizer())
    agent = Agent(ScriptedModel(["ok"] * 4), providers=[History(store), compaction])
    for name in ("one", "two"):
        await store.append("default", name, [Message.user(f"{name} {i}") for i in range(30)])
        await agent.run("hi", session=await agent.session(name))
    # The counter a run gets from the agent (traces, and compaction without its own tokenizer):
    for name in ("one", "two"):
        session = await agent.session(name)
        agent.token_counter(session).messages(await agent.history(session))
    for cache in (compaction._cache, agent._token_cache):
        one, two = cache.scope(("default", "one")), cache.scope(("default", "two"))
        assert isinstance(one, OrderedDict) and len(one) >= 31 and len(two) >= 31
        assert not set(one) & set(two)
