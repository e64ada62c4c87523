#!/usr/bin/env python3
"""Framework-overhead benchmark for contextpipe: workloads W0-W6 of the MAF baseline.

No LLM, no network: a fake chat model answers instantly, so the time measured is contextpipe's own
work plus the fake model's small, separately reported cost (W0). Timing, warm-up, iteration counts
and statistics follow ``maf_bench.py`` (in the shared bench folder) exactly, so the two can be
compared case by case; ``bench/compare.py`` runs both and prints the ratios.

Output: JSON on stdout, a table on stderr.

    python bench/contextpipe_bench.py > results.json
    python bench/contextpipe_bench.py --only W1,W3 --scale 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from contextpipe import Agent, ContextProvider, Durability, Message, RunContext, RunOutcome, TextDelta, tool
from contextpipe.codec import dumps, loads
from contextpipe.messages import FunctionCall, TextPart
from contextpipe.models import ModelRequest, ModelResponse, ModelStreamEvent, ResponseComplete
from contextpipe.providers import History
from contextpipe.session import Session
from contextpipe.stores import MemoryStore

USER_INPUT = "hi"
REPLY_TEXT = "ok"
FINAL_TOOL_LOOP_TEXT = "done"
STREAM_CHUNKS = [f"tok{i} " for i in range(50)]
W1_NS = [0, 100, 1000, 10000]
W2_N = 100
W2_KS = [0, 1, 5, 20]
W3_TS = [1, 5, 20]
W4_NS = [100, 1000, 10000]
W5_NS = [100, 1000, 10000, 100000]
MEM_N = 10000
SESSION = "bench-session"
TENANT = "default"


def history_text(i: int) -> str:
    return f"This is message number {i} in the conversation history."


def make_history(n: int) -> list[Message]:
    """n plain text messages, alternating user/assistant starting with user (ids assigned at creation)."""
    return [Message.user(history_text(i)) if i % 2 == 0 else Message.assistant(history_text(i)) for i in range(n)]


class FakeModel:
    """Answers instantly, like the baseline's fake client.

    Non-streaming: the first ``tool_calls`` calls of a run each return one call to ``lookup``; later
    calls return ``reply_text``. Streaming: one text delta per chunk, then the assembled response.
    """

    name = "fake"

    def __init__(self) -> None:
        self.reply_text = REPLY_TEXT
        self.tool_calls = 0
        self.run_call_index = 0
        self.last_messages_len = -1
        self.last_instructions: str | None = None

    def script(self, *, tool_calls: int = 0, reply_text: str = REPLY_TEXT) -> None:
        self.tool_calls = tool_calls
        self.reply_text = reply_text
        self.run_call_index = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        index = self.run_call_index
        self.run_call_index += 1
        self.last_messages_len = len(request.messages)
        self.last_instructions = request.instructions
        if index < self.tool_calls:
            call = FunctionCall(f"call_{index}", "lookup", f'{{"key": "k{index}"}}')
            return ModelResponse([Message("assistant", (call,))], finish_reason="tool_calls")
        return ModelResponse([Message.assistant(self.reply_text)], finish_reason="stop")

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        self.run_call_index += 1
        self.last_messages_len = len(request.messages)
        for chunk in STREAM_CHUNKS:
            yield TextDelta(chunk)
        yield ResponseComplete(ModelResponse([Message("assistant", (TextPart("".join(STREAM_CHUNKS)),))],
                                             finish_reason="stop"))


TOOL_INVOCATIONS = 0


@tool
def lookup(key: str) -> str:
    """Look up a value by key."""
    global TOOL_INVOCATIONS
    TOOL_INVOCATIONS += 1
    return f"value-{key}"


@tool(name="lookup", run_in_thread=False)
def lookup_inline(key: str) -> str:
    """Look up a value by key (runs on the event loop)."""
    global TOOL_INVOCATIONS
    TOOL_INVOCATIONS += 1
    return f"value-{key}"


class NoOpContextProvider(ContextProvider):
    """W2 provider: one instruction and one message in before_run; reads the response in after_run."""

    def __init__(self, source_id: str) -> None:
        super().__init__(source_id)
        self.instruction = f"Instruction from {source_id}."
        self.message_text = f"Context from {source_id}."
        self.response_chars = 0

    async def before_run(self, ctx: RunContext) -> None:
        ctx.add_instructions(self.instruction)
        ctx.add_messages([Message.user(self.message_text)])

    async def after_run(self, ctx: RunContext, outcome: RunOutcome) -> None:
        for m in outcome.response_messages or ():
            self.response_chars += len(m.text)


# --- timing (same method as maf_bench.py) -----------------------------------------------------------

RESULTS: list[dict[str, Any]] = []
ARGS: argparse.Namespace


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct_nearest_rank(sorted_values: list[int], p: float) -> int:
    k = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[k - 1]


async def measure(
    workload: str,
    case: str,
    op: Callable[[], Awaitable[Any]],
    *,
    setup: Callable[[], Awaitable[Any]] | None = None,
    check: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
    params: dict[str, Any] | None = None,
    target_s: float = 1.0,
    min_iters: int = 10,
    max_iters: int = 5000,
    warmup_s: float = 0.25,
    min_warmup: int = 3,
    max_warmup: int = 200,
) -> dict[str, Any]:
    """Run setup() (untimed) and op() (timed) repeatedly; report median / p95 in microseconds."""
    target_s *= ARGS.scale
    warmup_s *= ARGS.scale
    gc.collect()
    perf = time.perf_counter_ns
    wall0 = perf()
    warm_n = 0
    warm_ns = 0
    while warm_n < max_warmup and (warm_n < min_warmup or warm_ns < warmup_s * 1e9):
        if setup is not None:
            await setup()
        t0 = perf()
        await op()
        warm_ns += perf() - t0
        warm_n += 1
    samples: list[int] = []
    total = 0
    while len(samples) < max_iters and (len(samples) < min_iters or total < target_s * 1e9):
        if setup is not None:
            await setup()
        t0 = perf()
        await op()
        dt = perf() - t0
        samples.append(dt)
        total += dt
    extra = await check() if check is not None else None
    s = sorted(samples)
    row = {
        "workload": workload, "case": case, "params": params or {}, "iterations": len(samples),
        "warmup_iterations": warm_n, "median_us": round(statistics.median(s) / 1000, 2),
        "p95_us": round(pct_nearest_rank(s, 95) / 1000, 2), "min_us": round(s[0] / 1000, 2),
        "mean_us": round(statistics.fmean(s) / 1000, 2), "max_us": round(s[-1] / 1000, 2),
        "case_wall_s": round((perf() - wall0) / 1e9, 2),
    }
    if extra:
        row["extra"] = extra
    RESULTS.append(row)
    log(f"  {workload:<9} {case:<34} n={row['iterations']:<5} median={row['median_us']:>12,.1f} us"
        f"  p95={row['p95_us']:>12,.1f} us")
    return row


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(msg)


async def reset_history(store: MemoryStore, prefill: list[Message]) -> Session:
    """Start the bench session again with exactly `prefill` in its log (untimed)."""
    await store.delete_session(TENANT, SESSION)
    session = await store.load_or_create(TENANT, SESSION)
    if prefill:
        await store.append(TENANT, SESSION, prefill)
    return session


async def stored(store: MemoryStore) -> list[Message]:
    return (await store.load(TENANT, SESSION)).messages


# --- workloads ---------------------------------------------------------------------------------------

async def w0_fake_floor() -> None:
    model = FakeModel()
    request = ModelRequest([Message.user(USER_INPUT)])

    async def text_op() -> None:
        await model.complete(request)

    await measure("W0", "fake client text reply", text_op, params={"chunks": 1})

    async def stream_op() -> None:
        async for _ in model.stream(request):
            pass

    await measure("W0", "fake client 50 stream chunks (raw gen)", stream_op, params={"chunks": len(STREAM_CHUNKS)})


async def w1_plain(ns: list[int], tag: str) -> None:
    model = FakeModel()
    store = MemoryStore()
    agent = Agent(model, providers=[History(store)])
    current: dict[str, Session] = {}
    for n in ns:
        prefill = make_history(n)

        async def setup(prefill: list[Message] = prefill) -> None:
            current["s"] = await reset_history(store, prefill)
            model.script()

        async def op() -> None:
            await agent.run(USER_INPUT, session=current["s"])

        async def check(n: int = n, prefill: list[Message] = prefill) -> dict[str, Any]:
            msgs = await stored(store)
            expect(len(msgs) == n + 2, f"{tag}: stored {len(msgs)} != {n + 2}")
            expect(model.last_messages_len == n + 1, f"{tag}: model saw {model.last_messages_len}")
            expect(not prefill or prefill[0].source is None, "prefill mutated")
            return {"stored_after_run": len(msgs), "messages_sent_to_model": model.last_messages_len}

        slow = n >= 10000
        await measure(tag, f"N={n}", op, setup=setup, check=check, params={"N": n},
                      min_iters=10 if slow else 20, min_warmup=2 if slow else 3)


async def w1_memory() -> dict[str, Any]:
    model = FakeModel()
    store = MemoryStore()
    agent = Agent(model, providers=[History(store)])
    current: dict[str, Session] = {}
    warm = make_history(MEM_N)
    for _ in range(2):
        current["s"] = await reset_history(store, warm)
        await agent.run(USER_INPUT, session=current["s"])
    del warm
    current["s"] = await reset_history(store, [])
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        prefill = make_history(MEM_N)
        after_history = tracemalloc.get_traced_memory()[0]
        current["s"] = await reset_history(store, prefill)
        gc.collect()
        tracemalloc.reset_peak()
        before_run = tracemalloc.get_traced_memory()[0]
        await agent.run(USER_INPUT, session=current["s"])
        after_run, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expect(len(await stored(store)) == MEM_N + 2, "memory run did not store history")
    mem = {
        "N": MEM_N, "history_bytes": after_history - base,
        "history_bytes_per_message": round((after_history - base) / MEM_N, 1),
        "run_peak_bytes_above_pre_run": peak - before_run, "run_retained_bytes_after_run": after_run - before_run,
    }
    log(f"  W1-mem    N={MEM_N}: history {mem['history_bytes'] / 2**20:.2f} MiB, run peak +"
        f"{mem['run_peak_bytes_above_pre_run'] / 2**20:.2f} MiB, retained +"
        f"{mem['run_retained_bytes_after_run'] / 2**20:.2f} MiB")
    return mem


async def w2_providers() -> None:
    prefill = make_history(W2_N)
    for k in W2_KS:
        model = FakeModel()
        store = MemoryStore()
        providers = [NoOpContextProvider(f"noop_{j}") for j in range(k)]
        agent = Agent(model, providers=[History(store), *providers])
        current: dict[str, Session] = {}

        async def setup(store: MemoryStore = store, model: FakeModel = model,
                        current: dict[str, Session] = current) -> None:
            current["s"] = await reset_history(store, prefill)
            model.script()

        async def op(agent: Agent = agent, current: dict[str, Session] = current) -> None:
            await agent.run(USER_INPUT, session=current["s"])

        async def check(k: int = k, model: FakeModel = model, store: MemoryStore = store) -> dict[str, Any]:
            expect(model.last_messages_len == W2_N + k + 1, f"W2 model saw {model.last_messages_len}")
            lines = model.last_instructions.split("\n\n") if model.last_instructions else []
            expect(len(lines) == k, f"W2 instructions {len(lines)} != {k}")
            expect(len(await stored(store)) == W2_N + 2, "W2 history size")
            return {"messages_sent_to_model": model.last_messages_len, "instruction_lines": len(lines)}

        await measure("W2", f"N={W2_N} K={k}", op, setup=setup, check=check, params={"N": W2_N, "K": k},
                      min_iters=20)


async def w3_tool_loop() -> None:
    variants = [("per_run", lookup, ""), ("per_step", lookup, ""), ("per_step", lookup_inline, " inline")]
    for persistence, lookup_tool, suffix in variants:
        model = FakeModel()
        store = MemoryStore()
        agent = Agent(model, tools=[lookup_tool], providers=[History(store)],
                      durability=Durability(persistence=persistence))  # type: ignore[arg-type]
        current: dict[str, Session] = {}
        per_call = persistence == "per_step"
        for t in W3_TS:

            async def setup(t: int = t, store: MemoryStore = store, model: FakeModel = model,
                            current: dict[str, Session] = current) -> None:
                global TOOL_INVOCATIONS
                current["s"] = await reset_history(store, [])
                model.script(tool_calls=t, reply_text=FINAL_TOOL_LOOP_TEXT)
                TOOL_INVOCATIONS = 0

            async def op(agent: Agent = agent, current: dict[str, Session] = current) -> None:
                await agent.run(USER_INPUT, session=current["s"])

            async def check(t: int = t, store: MemoryStore = store, model: FakeModel = model) -> dict[str, Any]:
                msgs = await stored(store)
                expect(t == TOOL_INVOCATIONS, f"W3 tool ran {TOOL_INVOCATIONS} != {t}")
                expect(model.run_call_index == t + 1, f"W3 model calls {model.run_call_index}")
                expect(len(msgs) == 2 * t + 2, f"W3 stored {len(msgs)} != {2 * t + 2}")
                expect(msgs[-1].text == FINAL_TOOL_LOOP_TEXT, "W3 final text")
                return {"model_calls_per_run": model.run_call_index, "stored_after_run": len(msgs)}

            await measure("W3", f"T={t} per_service_call={per_call}{suffix}", op, setup=setup, check=check,
                          params={"T": t, "persistence": persistence, "tool_thread": not suffix}, min_iters=20)


async def w4_serialization() -> None:
    """Encode / decode N messages with the codec (JSON lines), the form every durable store keeps."""
    for n in W4_NS:
        messages = make_history(n)
        holder: dict[str, Any] = {}

        async def ser(messages: list[Message] = messages, holder: dict[str, Any] = holder) -> None:
            holder["p"] = "\n".join([dumps(m) for m in messages])

        slow = n >= 10000
        await measure("W4", f"N={n} serialize", ser, params={"N": n, "op": "codec dumps, JSON lines"},
                      min_iters=10 if slow else 20, min_warmup=2)
        payload = holder["p"]

        async def deser(payload: str = payload, holder: dict[str, Any] = holder) -> None:
            holder["m"] = [loads(line) for line in payload.split("\n")]

        async def check(payload: str = payload, messages: list[Message] = messages,
                        holder: dict[str, Any] = holder) -> dict[str, Any]:
            expect(holder["m"] == messages, "W4 round trip")
            return {"payload_bytes": len(payload.encode("utf-8"))}

        await measure("W4", f"N={n} deserialize", deser, check=check, params={"N": n, "op": "codec loads"},
                      min_iters=10 if slow else 20, min_warmup=2)


async def w5_compaction() -> None:
    """TokenBudget at 50% of the estimated tokens of N history messages (the baseline's W5)."""
    from contextpipe.compaction import TokenBudget, compact
    from contextpipe.tokens import EstimateTokenizer, TokenCounter

    tokenizer = EstimateTokenizer()
    for n in W5_NS:
        probe = await compact(make_history(n), TokenBudget(10**12), TokenCounter(tokenizer))
        budget = int(probe.tokens_before * 0.5)
        strategy = TokenBudget(budget)
        holder: dict[str, Any] = {}

        async def setup_cold(n: int = n, holder: dict[str, Any] = holder) -> None:
            holder["msgs"] = make_history(n)
            holder["counter"] = TokenCounter(tokenizer)

        async def cold(strategy: TokenBudget = strategy, holder: dict[str, Any] = holder) -> None:
            holder["out"] = await compact(holder["msgs"], strategy, holder["counter"])

        async def check(n: int = n, budget: int = budget, holder: dict[str, Any] = holder) -> dict[str, Any]:
            out = holder["out"]
            expect(0 < len(out.messages) < n, "W5 did not compact")
            expect(out.tokens_after <= budget, "W5 over budget")
            return {"kept_messages": len(out.messages), "kept_tokens": out.tokens_after}

        huge = n >= 10000
        params = {"N": n, "strategy": "TokenBudget", "max_n": budget, "tokenizer": "EstimateTokenizer (chars/4)",
                  "total_estimated_tokens": probe.tokens_before}
        await measure("W5", f"N={n} cold (fresh list)", cold, setup=setup_cold, check=check,
                      params={**params, "variant": "cold"}, min_iters=3 if huge else 20, target_s=2.0)

        async def setup_warm(holder: dict[str, Any] = holder) -> None:
            holder["msgs"] = holder["out"].messages

        await measure("W5", f"N={n} warm (re-apply, no-op)", cold, setup=setup_warm, check=check,
                      params={**params, "variant": "warm"}, min_iters=10 if huge else 20)


async def w5_sliding() -> None:
    """SlidingWindow keeping the newest half of N messages (``W5-sliding``, against MAF's SlidingWindowStrategy)."""
    from contextpipe.compaction import SlidingWindow, compact
    from contextpipe.tokens import EstimateTokenizer, TokenCounter

    tokenizer = EstimateTokenizer()
    for n in W5_NS[:3]:
        strategy = SlidingWindow(max_messages=n // 2)
        holder: dict[str, Any] = {}

        async def setup(n: int = n, holder: dict[str, Any] = holder) -> None:
            holder["msgs"] = make_history(n)
            holder["counter"] = TokenCounter(tokenizer)

        async def op(strategy: SlidingWindow = strategy, holder: dict[str, Any] = holder) -> None:
            holder["out"] = await compact(holder["msgs"], strategy, holder["counter"])

        async def check(n: int = n, holder: dict[str, Any] = holder) -> dict[str, Any]:
            expect(len(holder["out"].messages) == n - n // 2, "W5-sliding kept the wrong number of messages")
            return {"kept_messages": len(holder["out"].messages)}

        await measure("W5-sliding", f"N={n} cold (fresh list)", op, setup=setup, check=check,
                      params={"N": n, "strategy": "SlidingWindow", "max_messages": n // 2},
                      min_iters=3 if n >= 10000 else 20, target_s=2.0)


async def w6_streaming() -> None:
    model = FakeModel()
    store = MemoryStore()
    agent = Agent(model, providers=[History(store)])
    current: dict[str, Session] = {}
    expected_text = "".join(STREAM_CHUNKS)
    counter: dict[str, Any] = {"updates": 0, "text": ""}

    async def setup() -> None:
        current["s"] = await reset_history(store, [])
        model.script()

    async def op() -> None:
        count = 0
        stream = agent.stream(USER_INPUT, session=current["s"])
        async for event in stream:
            if isinstance(event, TextDelta):
                count += 1
        counter["updates"] = count
        counter["text"] = stream.result.text if stream.result else ""

    async def check() -> dict[str, Any]:
        msgs = await stored(store)
        expect(counter["updates"] == len(STREAM_CHUNKS), f"W6 updates {counter['updates']}")
        expect(counter["text"] == expected_text, "W6 final text")
        expect(len(msgs) == 2 and msgs[-1].text == expected_text, "W6 history")
        return {"updates_consumed": counter["updates"], "stored_after_run": len(msgs)}

    await measure("W6", "stream 50 chunks, N=0", op, setup=setup, check=check, params={"chunks": 50, "N": 0})

    async def setup_ref() -> None:
        current["s"] = await reset_history(store, [])
        model.script(reply_text=expected_text)

    async def op_ref() -> None:
        await agent.run(USER_INPUT, session=current["s"])

    await measure("W6", "non-stream same text (reference)", op_ref, setup=setup_ref,
                  params={"chunks": 1, "N": 0, "reply_chars": len(expected_text)})


def derived_metrics(results: list[dict[str, Any]]) -> dict[str, Any]:
    by = {(r["workload"], r["case"]): r["median_us"] for r in results}
    d: dict[str, Any] = {}
    w1_0, w1_10k = by.get(("W1", "N=0")), by.get(("W1", "N=10000"))
    if w1_0 is not None and w1_10k is not None:
        d["w1_us_per_history_message_0_to_10000"] = round((w1_10k - w1_0) / 10000, 3)
    k0, k20 = by.get(("W2", f"N={W2_N} K=0")), by.get(("W2", f"N={W2_N} K=20"))
    if k0 is not None and k20 is not None:
        d["w2_us_per_context_provider"] = round((k20 - k0) / 20, 2)
    for per_call in (False, True):
        t1 = by.get(("W3", f"T=1 per_service_call={per_call}"))
        t20 = by.get(("W3", f"T=20 per_service_call={per_call}"))
        if t1 is not None and t20 is not None:
            d[f"w3_us_per_extra_tool_round_trip_T1_to_T20_per_service_call_{per_call}"] = round((t20 - t1) / 19, 1)
    stream, ref = by.get(("W6", "stream 50 chunks, N=0")), by.get(("W6", "non-stream same text (reference)"))
    raw_text = by.get(("W0", "fake client text reply"))
    raw_stream = by.get(("W0", "fake client 50 stream chunks (raw gen)"))
    if stream is not None and ref is not None:
        fake = (raw_stream - raw_text) if raw_text is not None and raw_stream is not None else 0.0
        d["w6_framework_us_per_stream_chunk"] = round((stream - ref - fake) / len(STREAM_CHUNKS), 2)
    return d


async def main_async(selected: set[str]) -> dict[str, Any]:
    memory = None
    t0 = time.perf_counter()
    if "W0" in selected:
        log("W0 fake-model floor")
        await w0_fake_floor()
    if "W1" in selected:
        log("W1 plain run (prefilled history)")
        await w1_plain(W1_NS, "W1")
        log("W1 memory (tracemalloc)")
        memory = await w1_memory()
    if "W2" in selected:
        log("W2 provider chain")
        await w2_providers()
    if "W3" in selected:
        log("W3 tool loop")
        await w3_tool_loop()
    if "W4" in selected:
        log("W4 message codec")
        await w4_serialization()
    if "W5" in selected:
        log("W5 compaction")
        await w5_compaction()
    if "W5-SLIDING" in selected:
        log("W5-sliding compaction")
        await w5_sliding()
    if "W6" in selected:
        log("W6 streaming")
        await w6_streaming()
    return {"memory": memory, "elapsed_s": round(time.perf_counter() - t0, 1)}


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="W0,W1,W2,W3,W4,W5,W6", help="comma-separated workloads")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply per-case time targets")
    ARGS = parser.parse_args()
    selected = {w.strip().upper() for w in ARGS.only.split(",") if w.strip()}
    from contextpipe import __version__

    log(f"contextpipe {__version__} | Python {sys.version.split()[0]} | nproc {os.cpu_count()} | "
        f"{platform.machine()}")
    outcome = asyncio.run(main_async(selected))
    for key, value in derived_metrics(RESULTS).items():
        log(f"derived   {key} = {value}")
    log(f"total elapsed: {outcome['elapsed_s']} s")
    out = {
        "framework": "contextpipe", "framework_version": __version__,
        "machine": {"nproc": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
        "results": RESULTS, "memory_w1_n10000": outcome["memory"], "derived": derived_metrics(RESULTS),
        "elapsed_s": outcome["elapsed_s"],
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
