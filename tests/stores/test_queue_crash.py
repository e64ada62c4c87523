"""Queued messages survive a real SIGKILL: between enqueue and delivery, during the delivering step, during a
drained run. Afterwards each queued message is in the session's log, and in what the model is sent, exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from contextpipe import Agent
from contextpipe.exchanges import exchange_problem
from contextpipe.queue import pending
from contextpipe.session import SessionKey
from contextpipe.testing import ScriptedModel

from .backends import DURABLE, open_spec, store_spec

WORKER = str(Path(__file__).with_name("queue_worker.py"))


def killed_at(line: str, *args: str) -> None:
    """Start the worker, wait until it reports `line`, then SIGKILL it."""
    proc = subprocess.Popen([sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        got = proc.stdout.readline().strip()
        assert got == f"p {line}", proc.stderr.read() if proc.stderr else got
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


async def enqueue_all(spec: str, tenant: str, texts: list[str], when: str = "asap") -> list[str]:
    store = open_spec(spec)
    try:
        agent = Agent(ScriptedModel(), store=store)
        return [(await agent.enqueue("s", t, when=when, tenant=tenant)).id for t in texts]  # type: ignore[arg-type]
    finally:
        await store.close()


async def resume_and_check(spec: str, tenant: str, ids: list[str], *, drain: bool = False) -> list[str]:
    """Run the session again (waiting for the killed worker's lease); check each id is in the log once."""
    store = open_spec(spec)
    try:
        model = ScriptedModel(["after the crash"])
        agent = Agent(model, store=store)
        if drain:
            await agent.drain_queue("s", tenant=tenant, lease_wait=60)
        else:
            await agent.run("after", session=await agent.session("s", tenant=tenant), lease_wait=60)
        log = (await store.load(tenant, "s")).messages
        counts = Counter(m.id for m in log)
        assert [counts[i] for i in ids] == [1] * len(ids)
        sent = Counter(m.id for m in model.requests[0].messages)
        assert [sent[i] for i in ids] == [1] * len(ids)
        assert exchange_problem(log) is None
        assert await pending(store, SessionKey(tenant, "s")) == []
        return [m.text for m in log]
    finally:
        await store.close()


@pytest.mark.parametrize("backend", DURABLE)
def test_killed_between_enqueue_and_delivery(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    proc = subprocess.Popen([sys.executable, WORKER, "in_tool", spec, tenant, "s"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "p in tool", proc.stderr.read() if proc.stderr else ""
        ids = asyncio.run(enqueue_all(spec, tenant, ["q1", "q2", "q3"]))  # while the worker is in its tool
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    log = asyncio.run(resume_and_check(spec, tenant, ids))
    assert log[-5:] == ["q1", "q2", "q3", "after", "after the crash"]  # in order, after the repaired exchange


@pytest.mark.parametrize("backend", DURABLE)
def test_killed_during_the_delivering_step(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    ids = asyncio.run(enqueue_all(spec, tenant, ["q1", "q2"]))
    killed_at("appended", "delivering", spec, tenant, "s")
    log = asyncio.run(resume_and_check(spec, tenant, ids))
    assert log == ["q1", "q2", "after", "after the crash"]  # the killed run's input was never saved


@pytest.mark.parametrize("backend", DURABLE)
def test_killed_during_a_drained_run(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    ids = asyncio.run(enqueue_all(spec, tenant, ["next one"], when="next"))
    killed_at("model", "draining", spec, tenant, "s")
    log = asyncio.run(resume_and_check(spec, tenant, ids, drain=True))
    assert log == ["next one", "after the crash"]
