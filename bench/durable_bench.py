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
- ``tokens N``: `TokenCounter` over N distinct messages with the default cache, then again;
- ``import``: ``import contextpipe`` in a fresh interpreter (median of 15, and ``-X importtime``'s
  top entries).

    python bench/durable_bench.py                          # everything (several minutes at 1,000,000)
    python bench/durable_bench.py --only history --sizes 1000,10000
    python bench/durable_bench.py --only compaction --sizes 1000,1000000 --json out.json

Before and after: ``--before DIR`` runs the history cases on the contextpipe source tree in ``DIR`` too
(for example ``git archive af1a54e | tar -x -C /tmp/cp-before``; its ``src`` goes first on the
``PYTHONPATH``, with its own fixture files), interleaved with this tree case by case, the side going
first alternating, ``--rounds`` times:

    python bench/durable_bench.py --only history --sizes 1000,10000 --before /tmp/cp-before --rounds 3

``--only instructions`` counts the CPU instructions of a cold run instead (valgrind's callgrind, about a
minute per size and side), before and after with ``--before``: a figure that load on a shared machine
does not move:

    python bench/durable_bench.py --only instructions --sizes 1000,10000 --before /tmp/cp-before

Output: a Markdown table on stdout (and JSON with ``--json``).
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
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

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


def open_store(path: Path) -> Any:
    from contextpipe.stores import SQLiteStore

    return SQLiteStore(path, synchronous="FULL")


CPU: list[float] = []
"""Process CPU seconds of each timed run (all threads), next to the wall times: less sensitive to a busy machine."""


async def timed_runs(make: Any, runs: int, budget_s: float) -> list[float]:
    """Call ``make()`` (returns a coroutine running one agent run) up to `runs` times within the budget."""
    samples: list[float] = []
    spent = 0.0
    while len(samples) < runs and (len(samples) < 3 or spent < budget_s):
        gc.collect()
        c0 = time.process_time()
        t0 = time.perf_counter()
        await make()
        dt = time.perf_counter() - t0
        CPU.append(time.process_time() - c0)
        samples.append(dt)
        spent += dt
    return samples


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def case_history(path: Path, n: int, warm: bool, runs: int, budget: float) -> dict[str, Any]:
    if warm:
        store = open_store(path)
        agent = make_agent(store, compaction=False)
        session = await agent.session(SESSION)
        await agent.run("Where is my order?", session=session)  # the first run of this process: cold
        samples = await timed_runs(lambda: agent.run("And the invoice?", session=session), runs, budget)
        sent = agent.model.last_len
        await store.close()
    else:
        samples = []
        spent = 0.0
        sent = 0
        while len(samples) < runs and (len(samples) < 3 or spent < budget):
            store = open_store(path)
            agent = make_agent(store, compaction=False)
            gc.collect()
            c0 = time.process_time()
            t0 = time.perf_counter()
            session = await agent.session(SESSION)
            await agent.run("Where is my order?", session=session)
            dt = time.perf_counter() - t0
            CPU.append(time.process_time() - c0)
            samples.append(dt)
            spent += dt
            sent = agent.model.last_len
            await store.close()
    assert sent >= n, f"the model saw {sent} messages, expected all {n}"
    return {"samples_ms": [s * 1000 for s in samples], "cpu_ms": [c * 1000 for c in CPU], "sent": sent}


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
    t0 = time.perf_counter()
    await agent.run("Where is my order?", session=session)
    first = time.perf_counter() - t0
    calls_first = summariser.calls
    sent_first = agent.model.last_len
    CPU.clear()
    samples = await timed_runs(lambda: agent.run("And the invoice?", session=session), runs, budget)
    cpu = [c * 1000 for c in CPU]
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
    t0 = time.perf_counter()
    session = await agent.session(SESSION)
    await agent.run("Hello again.", session=session)
    cold = time.perf_counter() - t0
    await store.close()
    return {"first_ms": first * 1000, "samples_ms": [s * 1000 for s in samples], "cpu_ms": cpu, "cold_ms": cold * 1000,
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
        c0, t0 = time.process_time(), time.perf_counter()
        counter.messages(messages)
        out[f"{label}_ms"] = (time.perf_counter() - t0) * 1000
        out[f"{label}_cpu_ms"] = (time.process_time() - c0) * 1000
    # One session's recount of its own 1,000 newest messages after the big pass.
    tail = messages[-1000:]
    t0 = time.perf_counter()
    for _ in range(10):
        counter.messages(tail)
    out["tail_1000_ms"] = (time.perf_counter() - t0) / 10 * 1000
    out["rss_mb"] = rss_mb()
    return out


def case_import(python: str, repeats: int = 15) -> dict[str, Any]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([python, "-c", "import contextpipe"], check=True)
        samples.append(time.perf_counter() - t0)
    base = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([python, "-c", "pass"], check=True)
        base.append(time.perf_counter() - t0)
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
    return {"wall_ms": statistics.median(samples) * 1000, "interpreter_ms": statistics.median(base) * 1000,
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


def wall_cpu(result: dict[str, Any] | None) -> str:
    if result is None:
        return "timeout"
    cpu = result.get("cpu_ms")
    return ms(statistics.median(result["samples_ms"])) + (f" ({ms(statistics.median(cpu))})" if cpu else "")


def before_after(args: argparse.Namespace, sizes: list[int], out: dict[str, Any]) -> list[str]:
    """History cases on the `--before` tree and on this one, interleaved; medians over all rounds' runs."""
    lines = ["", f"History only, SQLiteStore synchronous=FULL, before ({args.before}) and after (this tree), "
             f"{args.rounds} interleaved round(s), median ms per run (CPU ms in brackets):", "",
             "| N stored | cold, before | cold, after | ratio wall / CPU "
             "| warm, before | warm, after | ratio wall / CPU |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    turn = 0
    for n in [s for s in sizes if s <= 100_000]:
        merged: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for kind in ("history-cold", "history-warm"):
                sides: list[tuple[str, Path | None]] = [("before", args.before), ("after", None)]
                if turn % 2:
                    sides.reverse()
                turn += 1
                for side, source in sides:
                    r = run_child(kind, n, args, source)
                    into = merged.setdefault(f"{kind}:{side}", {"samples_ms": [], "cpu_ms": []})
                    if r is not None:
                        into["samples_ms"] += r["samples_ms"]
                        into["cpu_ms"] += r["cpu_ms"]
        out["results"].update({f"{key}:{n}": value for key, value in merged.items()})
        cells = [f"{n:,}"]
        for kind in ("history-cold", "history-warm"):
            before, after = merged[f"{kind}:before"], merged[f"{kind}:after"]
            if not before["samples_ms"] or not after["samples_ms"]:
                cells += [wall_cpu(before if before["samples_ms"] else None),
                          wall_cpu(after if after["samples_ms"] else None), "n/a"]
                continue
            wall = statistics.median(before["samples_ms"]) / statistics.median(after["samples_ms"])
            cpu = statistics.median(before["cpu_ms"]) / statistics.median(after["cpu_ms"])
            cells += [wall_cpu(before), wall_cpu(after), f"{wall:.1f}x / {cpu:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="history,compaction,tokens,import")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "contextpipe-durable-bench"))
    parser.add_argument("--runs", type=int, default=15, help="timed runs per case (at most)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed runs per case (at least 3)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give a case up after this many seconds")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--before", type=Path, default=None,
                        help="a contextpipe source tree to run the history cases on too, interleaved")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds with --before")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    if args.child:
        child(args)
        return
    only = set(args.only.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict[str, Any] = {"python": sys.version.split()[0], "nproc": os.cpu_count(), "results": {}}
    import contextpipe

    out["contextpipe"] = getattr(contextpipe, "__version__", "?")
    lines: list[str] = []
    if "history" in only and args.before is not None:
        lines += before_after(args, sizes, out)
    elif "history" in only:
        lines += ["", "History only (no compaction), SQLiteStore synchronous=FULL, ms per run (median):", "",
                  "| N stored | cold run (CPU) | warm run (CPU) | RSS MB (warm) |", "|---:|---:|---:|---:|"]
        for n in [s for s in sizes if s <= 100_000]:
            cold = run_child("history-cold", n, args)
            warm = run_child("history-warm", n, args)
            out["results"][f"history-cold:{n}"] = cold
            out["results"][f"history-warm:{n}"] = warm
            lines.append(f"| {n:,} | {wall_cpu(cold)} | {wall_cpu(warm)} | {warm['rss_mb'] if warm else 0:,.0f} |")
    if "instructions" in only:
        lines += ["", "CPU instructions per cold run (valgrind; millions):", "",
                  "| N stored | before | after | ratio |" if args.before else "| N stored | instructions |",
                  "|---:|---:|---:|---:|" if args.before else "|---:|---:|"]
        for n in [s for s in sizes if s <= 100_000]:
            after = instructions(n, args)
            out["results"][f"instructions:{n}"] = after
            if args.before is None:
                lines.append(f"| {n:,} | {after:,.0f} |" if after else f"| {n:,} | failed |")
                continue
            before = instructions(n, args, args.before)
            out["results"][f"instructions-before:{n}"] = before
            ratio = f"{before / after:.2f}x" if before and after else "n/a"
            lines.append(f"| {n:,} | {before or 0:,.0f} | {after or 0:,.0f} | {ratio} |")
    if "compaction" in only:
        lines += ["", "History + Compaction (Summarize, then TokenBudget 8,000), SQLiteStore synchronous=FULL:", "",
                  "| N stored | first run ms | later runs ms, median (CPU) | cold run ms | summariser calls "
                  "(first / later runs / cold) | peak alloc per run MB | RSS MB |",
                  "|---:|---:|---:|---:|---|---:|---:|"]
        rows = {}
        for n in sizes:
            r = run_child("compaction", n, args)
            out["results"][f"compaction:{n}"] = r
            if r is None:
                lines.append(f"| {n:,} | timeout | | | | | |")
                continue
            rows[n] = r
            lines.append(f"| {n:,} | {ms(r['first_ms'])} | {wall_cpu(r)} | "
                         f"{ms(r['cold_ms'])} | {r['summariser_calls_first']} / {r['summariser_calls_later']} in "
                         f"{r['later_runs']} / {r['summariser_calls_cold']} | {r['peak_run_bytes'] / 1e6:,.2f} | "
                         f"{r['rss_mb']:,.0f} |")
        if len(rows) >= 2:
            lo, hi = min(rows), max(rows)
            ratio = statistics.median(rows[hi]["samples_ms"]) / statistics.median(rows[lo]["samples_ms"])
            mem = rows[hi]["peak_run_bytes"] / max(1, rows[lo]["peak_run_bytes"])
            lines.append(f"\nper-run time N={hi:,} / N={lo:,}: {ratio:.2f}x; peak allocation per run: {mem:.2f}x")
    if "tokens" in only:
        lines += ["", "TokenCounter (estimate tokenizer, default cache) over N distinct messages:", "",
                  "| N | first pass ms (CPU) | second pass ms (CPU) | recount of 1,000 newest ms | RSS MB |",
                  "|---:|---:|---:|---:|---:|"]
        for n in [100_000, 300_000, 1_000_000]:
            r = run_child("tokens", n, args)
            out["results"][f"tokens:{n}"] = r
            lines.append(f"| {n:,} | {ms(r['fill_ms'])} ({ms(r['fill_cpu_ms'])}) | {ms(r['again_ms'])} "
                         f"({ms(r['again_cpu_ms'])}) | {r['tail_1000_ms']:.2f} | "
                         f"{r['rss_mb']:,.0f} |" if r else f"| {n:,} | timeout | | | |")
    if "import" in only:
        r = case_import(sys.executable)
        out["results"]["import"] = r
        lines += ["", f"import contextpipe: {r['wall_ms']:.0f} ms wall "
                  f"(interpreter alone {r['interpreter_ms']:.0f} ms), "
                  f"-X importtime {r['importtime_us'] / 1000:.0f} ms; "
                  + ", ".join(f"{t['module']} {t['cumulative_us'] / 1000:.0f} ms" for t in r["top"])]
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
