"""The crash storm: worker processes on shared sessions, SIGKILLed at points chosen from a seed and their
own progress reports, then a check of every session's log. Used by the test suite (small) and by
``crash_storm.py`` beside it (full size: ``python -m tests.stores.crash_storm``).

No decision here depends on wall-clock time: a worker is killed when it has printed its n-th progress
line (n drawn from the seed), never after a sleep. A killed worker's lease lapses through a short
lease TTL (server backends, real time) or, with one worker at a time on SQLite, through the clock of
the next worker running ahead (no waiting at all).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextpipe import Message

from .backends import open_spec
from .proc_worker import broken_exchange

WORKER = str(Path(__file__).with_name("proc_worker.py"))
LIVENESS = 600.0  # seconds without any line from any worker: a hang, not slowness
KINDS = ("started", "returned", "midway", "saved", "run")


@dataclass
class StormReport:
    """What a storm did and what the check found (`problems` must be empty)."""

    kills: int = 0
    processes: int = 0
    sessions: int = 0
    messages: int = 0
    calls: int = 0
    completed_records: int = 0
    interrupted: int = 0
    idempotent_reruns: int = 0
    unsaved_siblings: int = 0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.kills} SIGKILLs over {self.processes} worker processes on {self.sessions} sessions: "
                f"{self.messages} messages and {self.calls} tool calls checked, {self.completed_records} completed "
                f"non-idempotent calls, {self.interrupted} calls answered 'interrupted', {self.idempotent_reruns} "
                f"idempotent calls re-run on resume, {self.unsaved_siblings} steps where a finished call was not "
                f"yet saved while its sibling ran; {len(self.problems)} problems")


@dataclass
class _Proc:
    slot: int
    popen: subprocess.Popen[str]
    kill_at: tuple[str, int] | None
    """Kill at the n-th progress line of this kind (``started``, ``returned``, ``midway``, ``saved``, ``run``)."""
    seen: Counter[str] = field(default_factory=Counter)
    killed: bool = False


def _reader(proc: _Proc, out: queue.Queue[tuple[_Proc, str | None]]) -> None:
    assert proc.popen.stdout is not None
    for line in proc.popen.stdout:
        if line.endswith("\n"):  # a killed worker's torn last line is no progress signal
            out.put((proc, line[:-1]))
    out.put((proc, None))


def run_storm(spec: str, tenant: str, workdir: Path, *, slots: int, sessions: int, kills: int, steps: int,
              runs: int, seed: int, lease_ttl: float, save_wait: float = 1.0, max_kill_line: int = 4,
              clock_ahead: bool = False, log: Any = None) -> StormReport:
    """Run the storm until `kills` workers were SIGKILLed, let clean workers finish, then check the logs."""
    rng = random.Random(seed)
    effects, violations = workdir / "effects.txt", workdir / "violations.txt"
    lines: queue.Queue[tuple[_Proc, str | None]] = queue.Queue()
    report = StormReport(sessions=sessions)
    generation = 0
    running: set[int] = set()
    errors: list[str] = []

    def spawn(slot: int, *, kill: bool, runs_now: int) -> None:
        nonlocal generation
        generation += 1
        env = {**os.environ, "CP_LEASE_TTL": str(lease_ttl), "CP_SAVE_WAIT": str(save_wait),
               "CP_GENERATION": str(generation), "PYTHONUNBUFFERED": "1"}
        if clock_ahead:
            env["CP_CLOCK_OFFSET"] = str(generation * 10 * (lease_ttl + 1))
        popen = subprocess.Popen(
            [sys.executable, WORKER, "storm", spec, tenant, f"w{slot}", f"s{slot % sessions}", str(runs_now),
             str(steps), str(effects), str(violations)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        # Every third worker dies right after a step's slow call reported that its sibling had finished
        # (the moment a late save would lose a completed call); the others at a progress line of a
        # kind and rank drawn from the seed.
        kind = "midway" if report.processes % 3 == 0 else rng.choice(KINDS)
        proc = _Proc(slot, popen, (kind, rng.randint(1, max_kill_line)) if kill else None)
        report.processes += 1
        running.add(id(proc))
        threading.Thread(target=_reader, args=(proc, lines), daemon=True).start()

    for slot in range(slots):
        spawn(slot, kill=True, runs_now=runs)
    progress: dict[str, list[str]] = defaultdict(list)  # per process: its progress lines
    while running:
        try:
            proc, line = lines.get(timeout=LIVENESS)
        except queue.Empty:
            raise AssertionError(f"no worker said anything for {LIVENESS:.0f} s: a hang") from None
        key = f"{proc.slot}:{proc.popen.pid}"
        if line is not None:
            if line.startswith("p "):
                progress[key].append(line[2:])
                kind = line.split()[1]
                proc.seen[kind] += 1
                if proc.kill_at is not None and proc.seen[kind] == proc.kill_at[1] and kind == proc.kill_at[0] \
                        and not proc.killed:
                    os.kill(proc.popen.pid, signal.SIGKILL)
                    proc.killed = True
                    report.kills += 1
                    if log is not None and report.kills % 25 == 0:
                        print(f"  {report.kills} kills", file=log, flush=True)
            continue
        running.discard(id(proc))
        _, err = proc.popen.communicate()
        if not proc.killed and proc.popen.returncode != 0:
            errors.append(f"worker {key} failed ({proc.popen.returncode}): {err[-1500:]}")
        if report.kills < kills:
            spawn(proc.slot, kill=True, runs_now=runs)
        elif proc.killed or proc.popen.returncode != 0:
            spawn(proc.slot, kill=False, runs_now=1)  # a clean last run repairs what the kill left
    report.problems += errors
    _check(spec, tenant, sessions, progress, effects, violations, report)
    return report


def _check(spec: str, tenant: str, sessions: int, progress: dict[str, list[str]], effects: Path,
           violations: Path, report: StormReport) -> None:
    problems = report.problems
    if violations.exists():
        problems.append("a model was sent a broken tool exchange:\n" + violations.read_text()[:2000])
    logs = asyncio.run(_load_all(spec, tenant, sessions))
    acked = {mid for lines in progress.values() for line in lines if line.startswith("saved ")
             for mid in line.split()[1:]}
    finished = {line.split()[1] for lines in progress.values() for line in lines if line.startswith("finished ")}
    completed = {line.split()[1] for lines in progress.values() for line in lines if line.startswith("midway ")
                 and f"returned record {line.split()[1]}" in lines}
    report.unsaved_siblings = sum(1 for lines in progress.values() for line in lines
                                  if line.startswith("midway ") and line.endswith(" unsaved"))
    effect_lines = effects.read_text().splitlines() if effects.exists() else []
    record_runs = Counter(line.split()[1] for line in effect_lines if line.startswith("record "))
    lookup_runs = Counter(line.split()[1] for line in effect_lines if line.startswith("lookup "))
    report.idempotent_reruns = sum(n - 1 for n in lookup_runs.values())
    twice = [pair for pair, n in record_runs.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} non-idempotent calls ran twice, e.g. {twice[:3]}")
    all_ids: set[str] = set()
    results: dict[str, list[Any]] = defaultdict(list)
    for sid, log in logs.items():
        report.messages += len(log)
        problem = broken_exchange(log)
        if problem is not None:
            problems.append(f"session {sid}: {problem}")
        ids = [m.id for m in log]
        if len(set(ids)) != len(ids):
            problems.append(f"session {sid}: a message is stored twice")
        all_ids.update(ids)
        inputs = [m.text for m in log if m.role == "user"]
        if len(set(inputs)) != len(inputs):
            problems.append(f"session {sid}: an input is stored twice")
        calls = [c.call_id for m in log for c in m.function_calls]
        if len(set(calls)) != len(calls):
            problems.append(f"session {sid}: a call is stored twice")
        report.calls += len(calls)
        for m in log:
            for r in m.function_results:
                results[r.call_id].append(r)
        for call in calls:
            if len(results[call]) != 1:
                problems.append(f"session {sid}: call {call} answered {len(results[call])} times")
        done = {m.text[len("done "):] for m in log if m.role == "assistant" and m.text.startswith("done ")}
        finished_here = {f for f in finished if f.split(":")[0] in _slots_of(sid, log)}
        missing_done = finished_here - done
        if missing_done:
            problems.append(f"session {sid}: finished runs without their answer: {sorted(missing_done)[:3]}")
    lost = acked - all_ids
    if lost:
        problems.append(f"{len(lost)} acknowledged messages are missing, e.g. {sorted(lost)[:3]}")
    report.interrupted = sum(1 for rs in results.values() for r in rs if r.is_error and "interrupted" in r.result)
    report.completed_records = len(completed)
    falsely = [pair for pair in completed if any(r.is_error for r in results.get(f"call_r_{pair}", []))]
    if falsely:
        problems.append(f"{len(falsely)} completed calls were reported as interrupted (their result was not "
                        f"saved when it was produced), e.g. {sorted(falsely)[:3]}")


def _slots_of(session_id: str, log: list[Message]) -> set[str]:
    return {m.text.split(":")[0] for m in log if m.role == "user"}


async def _load_all(spec: str, tenant: str, sessions: int) -> dict[str, list[Message]]:
    store = open_spec(spec)
    try:
        return {f"s{s}": list((await store.load(tenant, f"s{s}")).messages) for s in range(sessions)}
    finally:
        await store.close()


def main_json(report: StormReport) -> str:
    return json.dumps(report.__dict__)
