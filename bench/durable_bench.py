#!/usr/bin/env python3
"""Durable runs at any session length: contextpipe on SQLiteStore (synchronous=FULL), no LLM.

A fake model answers at once, so the time measured is contextpipe's own work on a durable session:
lease, load, decode, compaction, model request, per-step append, state save. Sessions hold
realistic-shaped conversations (user questions, assistant answers of varied length, and a tool
exchange every fourth turn with a JSON result), built once per size into ``--workdir`` and copied
for each case, so every case starts from the same file.

Cases (each runs in its own process, so memory figures do not mix):

- ``history-cold N``: a new store and agent per run (the first run of a process on the session);
- ``history-warm N``: the same agent, run again on the same session (the common server case);
- ``compaction N``: ``History`` + ``Compaction`` (summarise the old part, then a token budget), the
  same agent run again and again; reports the first run, later runs, a cold run, the summariser's
  calls and the peak memory of a run (tracemalloc) — from 1,000 to 1,000,000 messages;
- ``bounded N``: later runs of ``History`` alone (its default bound; ``max_tokens=None``, the whole log)
  and of ``History`` + ``Compaction(TokenBudget(8_000))`` with no summary checkpoint, from 1,000 to
  1,000,000 messages (``--only bounded``; ``--configs`` chooses; on a tree before the bound, the
  default is the whole log and ``max_tokens=None`` is skipped);
- ``tokens N``: `TokenCounter` over N distinct messages with the default cache, then again;
- ``import``: ``import contextpipe`` in a fresh interpreter (median of 15, and ``-X importtime``'s
  top entries).

    python bench/durable_bench.py                          # everything (several minutes at 1,000,000)
    python bench/durable_bench.py --only history --sizes 1000,10000
    python bench/durable_bench.py --only compaction --sizes 1000,1000000 --out bench/results/durable-compaction.json

Before and after: ``--before DIR`` runs the history cases on the contextpipe source tree in ``DIR`` too
(for example ``git archive af1a54e | tar -x -C /tmp/cp-before``; its ``src`` goes first on the
``PYTHONPATH``, with its own fixture files), interleaved with this tree case by case, the side going
first alternating, ``--rounds`` times:

    python bench/durable_bench.py --only history --sizes 1000,10000 --before /tmp/cp-before --rounds 3 \
        --out bench/results/durable-history.json

``--only instructions`` counts the CPU instructions of a cold run instead (valgrind's callgrind, about a
minute per size and side), before and after with ``--before``: a figure that load on a shared machine
does not move:

    python bench/durable_bench.py --only instructions --sizes 1000,10000 --before /tmp/cp-before

Output: Markdown tables on stdout, and the results file with ``--out`` (``bench/_harness.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _harness as h

HERE = Path(__file__).resolve().parent
SESSION = "bench-long"
TENANT = "default"
WORDS = (  # noqa: SIM905 - the fixture text, as first measured
    "the order shipped from the warehouse in Suzhou on Monday and the customer asked whether the invoice "
    "includes tax because their accounting team needs a breakdown by line item before they approve the "
    "payment for the next quarter so please check the contract terms and the delivery schedule again "
    "weather forecast temperature rain wind humidity itinerary flight hotel meeting deadline budget").split()


def sentence(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def conversation(n: int, seed: int = 7) -> list[Any]:
    """`n` messages shaped like a real support/assistant session (deterministic)."""
    from contextpipe import Message
    from contextpipe.messages import FunctionCall, FunctionResult

    rng = random.Random(seed)
    out: list[Any] = []
    t = 1_700_000_000.0
    turn = 0
    while len(out) < n:
        t += rng.uniform(5, 120)
        out.append(Message.user(sentence(rng, rng.randint(6, 50)), created_at=t))
        if turn % 4 == 3 and len(out) + 3 <= n:
            cid = f"call_{turn}"
            args = json.dumps({"order_id": f"A-{rng.randint(10000, 99999)}", "include": ["lines", "tax"]})
            out.append(Message("assistant", (FunctionCall(cid, "get_order", args),), created_at=t + 1))
            result = json.dumps({"status": rng.choice(["shipped", "pending", "delivered"]),
                                 "lines": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 9),
                                            "note": sentence(rng, rng.randint(3, 12))}
                                           for _ in range(rng.randint(1, 6))]})
            out.append(Message("tool", (FunctionResult(cid, result),), created_at=t + 2))
        out.append(Message.assistant(" ".join(sentence(rng, rng.randint(8, 25))
                                              for _ in range(rng.randint(1, 6))), created_at=t + 3))
        turn += 1
    return out[:n]


def fixture(workdir: Path, n: int) -> Path:
    """Return the path of a SQLite file holding session SESSION with `n` messages (built once).

    One file per stored form (the SQLite schema version of the contextpipe running): a file built by
    another release would hold its rows in that release's form.
    """
    from contextpipe.stores import SQLiteStore
    from contextpipe.stores import sqlite as sqlite_store

    schema = getattr(sqlite_store, "SQLITE_SCHEMA_VERSION", 2)
    name = f"session-{n}" if schema == 2 else f"session-{n}-schema{schema}"
    path = workdir / f"{name}.db"
    if path.exists():
        return path
    tmp = workdir / f"{name}.building.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(tmp) + suffix).unlink(missing_ok=True)

    async def build() -> None:
        store = SQLiteStore(tmp)
        messages = conversation(n)
        for i in range(0, n, 5000):
            await store.append(TENANT, SESSION, messages[i:i + 5000])
        await store.close()

    print(f"building fixture of {n:,} messages ...", file=sys.stderr, flush=True)
    asyncio.run(build())
    con = __import__("sqlite3").connect(tmp)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    tmp.rename(path)
    return path


class FakeModel:
    """Answers every call at once with a short text."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0
        self.last_len = 0

    async def complete(self, request: Any) -> Any:
        from contextpipe import Message
        from contextpipe.models import ModelResponse

        self.calls += 1
        self.last_len = len(request.messages)
        return ModelResponse([Message.assistant("Noted, I will check the order and come back to you.")],
                             finish_reason="stop")

    async def stream(self, request: Any) -> Any:  # pragma: no cover - not used
        raise NotImplementedError
        yield


class Summariser(FakeModel):
    """The summariser: counts its calls and the input it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.input_chars = 0

    async def complete(self, request: Any) -> Any:
        from contextpipe import Message
        from contextpipe.models import ModelResponse

        self.calls += 1
        self.input_chars += sum(len(m.text) for m in request.messages)
        return ModelResponse([Message.assistant("Summary: the customer asked about orders, invoices and tax; "
                                                "the assistant checked each order and answered.")],
                             finish_reason="stop")


def make_agent(store: Any, compaction: bool, summariser: Summariser | None = None) -> Any:
    from contextpipe import Agent
    from contextpipe.providers import History

    providers: list[Any] = [History(store)]
    if compaction:
        from contextpipe.compaction import CompactionPipeline, Summarize, TokenBudget, Trigger
        from contextpipe.providers import Compaction
        from contextpipe.tokens import EstimateTokenizer

        assert summariser is not None
        providers.append(Compaction(CompactionPipeline([
            Summarize(summariser, keep_last_turns=4, max_input_tokens=8_000, trigger=Trigger(tokens=6_000)),
            TokenBudget(8_000, output_reserve=1_000),
        ]), tokenizer=EstimateTokenizer()))
    return Agent(FakeModel(), providers=providers, store=store)


CONFIGS = ("default", "unbounded", "budget")
"""``bounded`` cases: History's default bound, ``History(max_tokens=None)``, and TokenBudget without a checkpoint."""


def bounded_agent(store: Any, config: str) -> Any:
    from contextpipe import Agent
    from contextpipe.providers import History

    history = History(store, max_tokens=None) if config == "unbounded" else History(store)  # type: ignore[call-arg]
    providers: list[Any] = [history]
    if config == "budget":
        from contextpipe.compaction import TokenBudget
        from contextpipe.providers import Compaction
        from contextpipe.tokens import EstimateTokenizer

        providers.append(Compaction(TokenBudget(8_000, output_reserve=1_000), tokenizer=EstimateTokenizer()))
    return Agent(FakeModel(), providers=providers, store=store)


async def case_bounded(path: Path, config: str, runs: int, budget: float) -> dict[str, Any]:
    """First run, later runs (the same agent), peak memory of a later run, and a cold run, of one config."""
    store = open_store(path)
    agent = bounded_agent(store, config)
    session = await agent.session(SESSION)
    gc.collect()
    with h.Stopwatch() as first:
        await agent.run("Where is my order?", session=session)
    samples = await timed_runs(lambda _: agent.run("And the invoice?", session=session), runs, budget)
    sent = agent.model.last_len
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    await agent.run("Thanks, one more question.", session=session)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    await store.close()
    store = open_store(path)
    agent = bounded_agent(store, config)
    gc.collect()
    with h.Stopwatch() as cold:
        session = await agent.session(SESSION)
        await agent.run("Hello again.", session=session)
    await store.close()
    return {"first_ms": first.wall * 1000, **as_ms(samples), "cold_ms": cold.wall * 1000, "sent": sent,
            "peak_run_bytes": peak}


def open_store(path: Path) -> Any:
    from contextpipe.stores import SQLiteStore

    return SQLiteStore(path, synchronous="FULL")


async def timed_runs(run: Callable[[Any], Awaitable[object]], runs: int, budget_s: float,
                     setup: Callable[[], Awaitable[Any]] | None = None) -> list[h.Sample]:
    """``run(await setup())`` up to `runs` times within the budget (at least 3), each timed: wall and
    process CPU (all threads; less sensitive to a busy machine). `setup` is untimed."""
    samples: list[h.Sample] = []
    while len(samples) < runs and (len(samples) < 3 or sum(s.wall for s in samples) < budget_s):
        gc.collect()
        samples += await h.ameasure(run, 1, warmup=0, setup=setup)
    return samples


def as_ms(samples: list[h.Sample]) -> dict[str, list[float]]:
    return {"samples_ms": [s.wall * 1000 for s in samples], "cpu_ms": [s.cpu * 1000 for s in samples]}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def case_history(path: Path, n: int, warm: bool, runs: int, budget: float) -> dict[str, Any]:
    if warm:
        store = open_store(path)
        agent = make_agent(store, compaction=False)
        session = await agent.session(SESSION)
        await agent.run("Where is my order?", session=session)  # the first run of this process: cold
        samples = await timed_runs(lambda _: agent.run("And the invoice?", session=session), runs, budget)
        sent = agent.model.last_len
        await store.close()
    else:
        sent = 0
        stores: list[Any] = []

        async def new_agent() -> Any:  # untimed: the previous run's store is closed here
            if stores:
                await stores.pop().close()
            stores.append(open_store(path))
            agent = make_agent(stores[-1], compaction=False)
            gc.collect()  # the closed store's garbage, so the timed run does not collect it
            return agent

        async def cold(agent: Any) -> None:
            nonlocal sent
            session = await agent.session(SESSION)
            await agent.run("Where is my order?", session=session)
            sent = agent.model.last_len

        samples = await timed_runs(cold, runs, budget, setup=new_agent)
        await stores.pop().close()
    assert sent >= n, f"the model saw {sent} messages, expected all {n}"
    return {**as_ms(samples), "sent": sent}


async def case_cold_runs(path: Path, n: int, runs: int) -> dict[str, Any]:
    """One cold run (imports, first-use work), then `runs` more: counted under valgrind by `instructions`.

    No gc.collect() between runs (it would be counted): the collector runs when it would in a service.
    """
    sent = 0
    for _ in range(runs + 1):
        store = open_store(path)
        agent = make_agent(store, compaction=False)
        session = await agent.session(SESSION)
        await agent.run("Where is my order?", session=session)
        sent = agent.model.last_len
        await store.close()
    assert sent >= n, f"the model saw {sent} messages, expected all {n}"
    return {"runs": runs}


async def case_compaction(path: Path, n: int, runs: int, budget: float) -> dict[str, Any]:
    summariser = Summariser()
    store = open_store(path)
    agent = make_agent(store, compaction=True, summariser=summariser)
    session = await agent.session(SESSION)
    gc.collect()
    with h.Stopwatch() as first:
        await agent.run("Where is my order?", session=session)
    calls_first = summariser.calls
    sent_first = agent.model.last_len
    samples = await timed_runs(lambda _: agent.run("And the invoice?", session=session), runs, budget)
    calls_after = summariser.calls - calls_first
    sent = agent.model.last_len
    # Peak memory of one more warm run (tracemalloc: Python allocations during the run).
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    await agent.run("Thanks, one more question.", session=session)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    await store.close()
    # A cold run: a new store and agent (another process would do the same).
    cold_summariser = Summariser()
    store = open_store(path)
    agent = make_agent(store, compaction=True, summariser=cold_summariser)
    gc.collect()
    with h.Stopwatch() as cold:
        session = await agent.session(SESSION)
        await agent.run("Hello again.", session=session)
    await store.close()
    return {"first_ms": first.wall * 1000, **as_ms(samples), "cold_ms": cold.wall * 1000,
            "summariser_calls_first": calls_first, "summariser_calls_later": calls_after,
            "summariser_calls_cold": cold_summariser.calls, "later_runs": len(samples) + 1,
            "sent_first": sent_first, "sent": sent, "peak_run_bytes": peak}


def case_tokens(n: int) -> dict[str, Any]:
    from contextpipe import Message
    from contextpipe.tokens import EstimateTokenizer, TokenCounter

    messages = [Message.user(f"message {i} of a long session") for i in range(n)]
    counter = TokenCounter(EstimateTokenizer())
    out: dict[str, Any] = {}
    for label in ("fill", "again"):
        with h.Stopwatch() as watch:
            counter.messages(messages)
        out[f"{label}_ms"] = watch.wall * 1000
        out[f"{label}_cpu_ms"] = watch.cpu * 1000
    # One session's recount of its own 1,000 newest messages after the big pass.
    tail = messages[-1000:]
    recount = h.measure(lambda: counter.messages(tail), 10, warmup=0)
    out["tail_1000_ms"] = sum(s.wall for s in recount) / 10 * 1000
    out["rss_mb"] = rss_mb()
    return out


def case_import(python: str, repeats: int = 15) -> dict[str, Any]:
    samples = [h.child_cost([python, "-c", "import contextpipe"])[0].wall for _ in range(repeats)]
    base = [h.child_cost([python, "-c", "pass"])[0].wall for _ in range(repeats)]
    proc = subprocess.run([python, "-X", "importtime", "-c", "import contextpipe"], capture_output=True,
                          text=True, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if parts[0].isdigit():
            rows.append((int(parts[1]), parts[2]))
    total = next((us for us, name in rows if name == "contextpipe"), 0)
    top = sorted(((us, name) for us, name in rows if name.strip() in ("pydantic", "numpy", "typer", "rich",
                                                                      "yaml", "contextpipe.tools", "asyncio")),
                 reverse=True)
    return {"wall_ms": h.stats(samples)["median"] * 1000, "interpreter_ms": h.stats(base)["median"] * 1000,
            "importtime_us": total, "top": [{"module": n.strip(), "cumulative_us": us} for us, n in top]}


def child(args: argparse.Namespace) -> None:
    kind, n = args.child.split(":")
    size = int(n)
    result: dict[str, Any]
    if kind == "tokens":
        result = case_tokens(size)
    else:
        src = fixture(Path(args.workdir), size)
        work = Path(tempfile.mkdtemp(dir=args.workdir))
        path = work / "run.db"
        shutil.copyfile(src, path)
        try:
            if kind == "history-cold":
                result = asyncio.run(case_history(path, size, False, args.runs, args.budget))
            elif kind == "history-warm":
                result = asyncio.run(case_history(path, size, True, args.runs, args.budget))
            elif kind == "compaction":
                result = asyncio.run(case_compaction(path, size, args.runs, args.budget))
            elif kind.startswith("bounded-"):
                result = asyncio.run(case_bounded(path, kind.removeprefix("bounded-"), args.runs, args.budget))
            elif kind == "cold-runs":
                result = asyncio.run(case_cold_runs(path, size, args.runs))
            else:
                raise SystemExit(f"unknown case {kind}")
        finally:
            shutil.rmtree(work)
        result["rss_mb"] = rss_mb()
    print(json.dumps(result))


def run_child(kind: str, n: int, args: argparse.Namespace, source: Path | None = None) -> dict[str, Any] | None:
    """Run one case in a new process: on this tree, or on the source tree `source` (its own fixtures)."""
    workdir = Path(args.workdir) if source is None else Path(args.workdir) / "before"
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "--child", f"{kind}:{n}", "--workdir", str(workdir),
           "--runs", str(args.runs), "--budget", str(args.budget)]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source / "src"), *filter(None, [env.get("PYTHONPATH")])])
    print(f"{kind} N={n:,}{' (before)' if source is not None else ''} ...", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  gave up after {args.timeout} s", file=sys.stderr)
        return None
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def instructions(n: int, args: argparse.Namespace, source: Path | None = None) -> float | None:
    """Million CPU instructions per cold run at `n` (valgrind, which machine load does not move).

    A process making 1 + 4 cold runs minus one making 1 + 1, divided by 3: imports, fixture and
    first-use work cancel out. Both threads of the run are counted (the event loop and the store's).
    """
    workdir = Path(args.workdir) if source is None else Path(args.workdir) / "before"
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source / "src"), *filter(None, [env.get("PYTHONPATH")])])
    base = [sys.executable, __file__, "--child", f"cold-runs:{n}", "--workdir", str(workdir)]
    print(f"instructions N={n:,}{' (before)' if source is not None else ''} ...", file=sys.stderr, flush=True)
    subprocess.run([*base, "--runs", "0"], env=env, check=True, stdout=subprocess.DEVNULL)  # the fixture, uncounted
    totals = []
    for runs in (1, 4):
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *base, "--runs", str(runs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, check=False)
        found = [line for line in proc.stderr.splitlines() if "Collected :" in line]
        if proc.returncode != 0 or not found:
            print(f"  valgrind failed: {proc.stderr[-500:]}", file=sys.stderr)
            return None
        totals.append(int(found[-1].split(":")[-1]))
    return (totals[1] - totals[0]) / 3 / 1e6


def history_before_after(args: argparse.Namespace, sizes: list[int], results: h.Results) -> None:
    """History cases on the `--before` tree and on this one, interleaved; medians over all rounds' runs."""
    sides: list[tuple[str, Path | None]] = [("before", args.before), ("after", None)]
    turn = 0  # the side going first alternates from case to case
    for n in [s for s in sizes if s <= 100_000]:
        merged: dict[tuple[str, str], dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for kind in ("history-cold", "history-warm"):
                for side, source in h.rotated(sides, turn):
                    r = run_child(kind, n, args, source)
                    into = merged.setdefault((kind, side), {"samples_ms": [], "cpu_ms": []})
                    if r is not None:
                        into["samples_ms"] += r["samples_ms"]
                        into["cpu_ms"] += r["cpu_ms"]
                turn += 1
        for kind in ("history-cold", "history-warm"):
            case = f"{kind.removeprefix('history-')} run, {n:,} messages"
            for side, _ in sides:
                got = merged[(kind, side)]
                if got["samples_ms"]:  # a side that timed out has no row
                    results.add(case, side, "wall", "ms", samples=got["samples_ms"])
                    results.add(case, side, "CPU", "ms", samples=got["cpu_ms"])
            if all(merged[(kind, side)]["samples_ms"] for side, _ in sides):
                for metric in ("wall", "CPU"):
                    results.ratio(case, metric, side="before", over="after")


def history(args: argparse.Namespace, sizes: list[int], results: h.Results) -> None:
    for n in [s for s in sizes if s <= 100_000]:
        for kind in ("history-cold", "history-warm"):
            r = run_child(kind, n, args)
            case = f"{kind.removeprefix('history-')} run, {n:,} messages"
            if r is not None:
                results.add(case, "contextpipe", "wall", "ms", samples=r["samples_ms"])
                results.add(case, "contextpipe", "CPU", "ms", samples=r["cpu_ms"])
                results.add(case, "contextpipe", "peak RSS", "MB", value=r["rss_mb"])


def count_instructions(args: argparse.Namespace, sizes: list[int], results: h.Results) -> None:
    sides = [("before", args.before), ("after", None)] if args.before is not None else [("contextpipe", None)]
    for n in [s for s in sizes if s <= 100_000]:
        case = f"cold run, {n:,} messages"
        for side, source in sides:
            counted = instructions(n, args, source)
            if counted is not None:
                results.add(case, side, "instructions", "million", value=counted)
        if args.before is not None and len([r for r in results.doc["results"] if r["case"] == case]) == 2:
            results.ratio(case, "instructions", side="before", over="after")


def compaction(args: argparse.Namespace, sizes: list[int], results: h.Results) -> None:
    for n in sizes:
        r = run_child("compaction", n, args)
        if r is None:
            continue
        case = f"{n:,} messages"
        add = results.add
        add(case, "contextpipe", "first run", "ms", value=r["first_ms"])
        add(case, "contextpipe", "later runs", "ms", samples=r["samples_ms"])
        add(case, "contextpipe", "later runs, CPU", "ms", samples=r["cpu_ms"])
        add(case, "contextpipe", "cold run", "ms", value=r["cold_ms"])
        add(case, "contextpipe", "summariser calls: first run", "", value=r["summariser_calls_first"])
        add(case, "contextpipe", "summariser calls: later runs", "", value=r["summariser_calls_later"],
            later_runs=r["later_runs"])
        add(case, "contextpipe", "summariser calls: cold run", "", value=r["summariser_calls_cold"])
        add(case, "contextpipe", "peak Python memory of a later run", "MB", value=r["peak_run_bytes"] / 1e6)


def bounded(args: argparse.Namespace, sizes: list[int], results: h.Results) -> None:
    """History's bound: each config at each size (a case per size, a row per config)."""
    import inspect

    from contextpipe.providers import History

    bound = "max_tokens" in inspect.signature(History).parameters  # False on a tree before the bound
    labels = {"default": "History (default bound)" if bound else "History (whole log: no bound yet)",
              "unbounded": "History(max_tokens=None)", "budget": "History + TokenBudget(8,000), no checkpoint"}
    for n in sizes:
        for config in [c for c in args.configs.split(",") if bound or c != "unbounded"]:
            r = run_child(f"bounded-{config}", n, args)
            if r is None:
                continue
            case, side, add = f"{n:,} messages", labels[config], results.add
            add(case, side, "later runs", "ms", samples=r["samples_ms"])
            add(case, side, "later runs, CPU", "ms", samples=r["cpu_ms"])
            add(case, side, "first run", "ms", value=r["first_ms"])
            add(case, side, "cold run", "ms", value=r["cold_ms"])
            add(case, side, "messages sent", "", value=r["sent"])
            add(case, side, "peak Python memory of a later run", "MB", value=r["peak_run_bytes"] / 1e6)
            add(case, side, "peak RSS", "MB", value=r["rss_mb"])


def tokens(args: argparse.Namespace, results: h.Results) -> None:
    for n in [100_000, 300_000, 1_000_000]:
        r = run_child("tokens", n, args)
        if r is None:
            continue
        case = f"{n:,} messages"
        for key, metric in (("fill_cpu_ms", "first pass, CPU"), ("again_cpu_ms", "second pass, CPU"),
                            ("tail_1000_ms", "recount of the 1,000 newest")):
            results.add(case, "contextpipe", metric, "ms", value=r[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="history,compaction,tokens,import")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "contextpipe-durable-bench"))
    parser.add_argument("--runs", type=int, default=15, help="timed runs per case (at most)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed runs per case (at least 3)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give a case up after this many seconds")
    h.out_argument(parser, "durable-history")
    parser.add_argument("--before", type=Path, default=None,
                        help="a contextpipe source tree to run the history cases on too, interleaved")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds with --before")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="bounded cases: " + ", ".join(CONFIGS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args)
        return
    only = set(args.only.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    commit = h.git_commit(args.before) if args.before is not None else None
    reference = {"name": f"an earlier tree ({commit or args.before})", "commit": commit, "side": "before"}
    by_metric = not only & {"history", "instructions", "import"}  # compaction, bounded, tokens: a column per figure
    results = h.Results(
        "durable", "Durable runs on SQLiteStore (synchronous=FULL), no LLM: sessions of realistic shape; "
        "a cold run opens a new store and agent, a warm one runs the same agent again",
        reference=reference if args.before is not None else None,
        layout={"rows": ["case", "side"], "columns": "metric"} if by_metric else None)
    if "history" in only:
        (history_before_after if args.before is not None else history)(args, sizes, results)
    if "instructions" in only:
        count_instructions(args, sizes, results)
    if "compaction" in only:
        compaction(args, sizes, results)
    if "bounded" in only:
        bounded(args, sizes, results)
    if "tokens" in only:
        tokens(args, results)
    if "import" in only:
        r = case_import(sys.executable)
        results.add("import contextpipe", "contextpipe", "new interpreter, wall", "ms", value=r["wall_ms"])
        results.add("python -c pass", "contextpipe", "new interpreter, wall", "ms", value=r["interpreter_ms"])
        print("-X importtime: " + ", ".join(f"{t['module']} {t['cumulative_us'] / 1000:.0f} ms" for t in r["top"]))
    print(h.table(results.write(args.out)))


if __name__ == "__main__":
    main()
