"""The queue under a crash storm: two worker processes share two sessions, a third party (this test) queues
messages, and workers are SIGKILLed while a run holds queued messages not delivered yet and while a delivery
is being settled. Afterwards every queued message is in its session's log exactly once, in the order queued.

The kills follow the workers' own progress lines (`queue_storm_worker.py`), never a sleep; the only clock is
an overall deadline on waiting for the next line.
"""

from __future__ import annotations

import asyncio
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import IO

import pytest

from contextpipe import Agent
from contextpipe.exchanges import exchange_problem
from contextpipe.queue import pending
from contextpipe.session import SessionKey
from contextpipe.stores import SessionStore
from contextpipe.testing import ScriptedModel

from .backends import open_spec, store_spec

WORKER = str(Path(__file__).with_name("queue_storm_worker.py"))
SESSIONS = ("a", "b")
DEADLINE = 50.0  # seconds for the whole storm of one backend (it takes about 10-20)


class Worker:
    """A worker process and the thread that passes its progress lines to the storm's queue."""

    def __init__(self, spec: str, tenant: str, lines: queue.Queue[tuple[Worker, str]], log: Path) -> None:
        self.stderr = log.open("a")
        self.proc = subprocess.Popen([sys.executable, WORKER, spec, tenant, *SESSIONS], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, bufsize=1)
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout, lines), daemon=True)
        self.reader.start()

    def _read(self, stdout: IO[str], lines: queue.Queue[tuple[Worker, str]]) -> None:
        with stdout:
            for line in stdout:
                lines.put((self, line.strip()))

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        assert self.proc.returncode == -signal.SIGKILL
        self.reader.join(timeout=60)  # it closes the output at its end
        for file in (self.proc.stdin, self.stderr):
            if file is not None:
                file.close()


class Storm:
    """The third party: queues messages for the sessions (each id remembered, in order) from this process."""

    def __init__(self, runner: asyncio.Runner, store: SessionStore, tenant: str) -> None:
        self.runner, self.agent, self.tenant = runner, Agent(ScriptedModel(), store=store), tenant
        self.queued: dict[str, list[str]] = {s: [] for s in SESSIONS}

    def enqueue(self, session_id: str, count: int) -> None:
        for _ in range(count):
            text = f"queued {session_id} {len(self.queued[session_id]) + 1}"
            entry = self.runner.run(self.agent.enqueue(session_id, text, tenant=self.tenant))
            self.queued[session_id].append(entry.id)


def storm(spec: str, tenant: str, runner: asyncio.Runner, store: SessionStore, tmp_path: Path) -> tuple[Storm,
                                                                                                     Counter[str]]:
    """Run the storm until each kind of kill happened 3 times; return what was queued and the kills made."""
    lines: queue.Queue[tuple[Worker, str]] = queue.Queue()
    log = tmp_path / "workers.log"
    workers = [Worker(spec, tenant, lines, log), Worker(spec, tenant, lines, log)]
    third, kills, holders = Storm(runner, store, tenant), Counter[str](), {s: set[int]() for s in SESSIONS}
    chance, end = random.Random(35), time.monotonic() + DEADLINE
    try:
        while min(kills["tool"], kills["settling"]) < 3 or any(len(h) < 2 for h in holders.values()):
            try:
                worker, line = lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the storm made {dict(kills)} kills in {DEADLINE} s; workers' errors: {log.read_text()}")
            if worker not in workers:
                continue  # a line written just before its worker was killed
            where, session_id = line.removeprefix("p ").split()
            holders[session_id].add(worker.proc.pid)
            if where == "tool":  # the run holds the session: what is queued now waits for its next boundary
                third.enqueue(session_id, chance.randint(1, 3))
            if chance.random() < 0.4:
                worker.kill()
                kills[where] += 1
                third.enqueue(chance.choice(SESSIONS), 1)  # queued while no worker may hold its session
                workers[workers.index(worker)] = Worker(spec, tenant, lines, log)
            else:
                worker.go()
    finally:
        for worker in workers:
            worker.kill()
    return third, kills


async def check(store: SessionStore, tenant: str, queued: dict[str, list[str]]) -> None:
    """Run each session once more (delivering what is left); each queued id is then in its log once, in order."""
    for session_id, ids in queued.items():
        agent = Agent(ScriptedModel(["last answer"]), store=store)
        await agent.run("last input", session=await agent.session(session_id, tenant=tenant), lease_wait=30)
        log = (await store.load(tenant, session_id)).messages
        counts = Counter(m.id for m in log)
        assert {i: counts[i] for i in ids} == dict.fromkeys(ids, 1), session_id  # none lost, none twice
        assert [m.id for m in log if m.id in set(ids)] == ids  # in the order queued
        assert exchange_problem(log) is None
        assert await pending(store, SessionKey(tenant, session_id)) == []


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_queued_messages_are_delivered_once_under_a_crash_storm_of_two_workers(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    with asyncio.Runner() as runner:
        store = open_spec(spec)
        try:
            third, kills = storm(spec, tenant, runner, store, tmp_path)
            assert sum(len(ids) for ids in third.queued.values()) >= 10 and kills["tool"] >= 3
            runner.run(check(store, tenant, third.queued))
        finally:
            runner.run(store.close())
