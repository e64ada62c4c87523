"""Several OS processes on the same sessions, and processes killed with SIGKILL mid-run."""

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

from contextpipe.stores import SessionStore
from crash_storm import StormConfig, StormReport, run_storm
from storm_worker import broken_exchange

from .backends import DURABLE, open_spec, store_spec

WORKER = str(Path(__file__).with_name("proc_worker.py"))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-3000:]}"


async def load_all(spec: str, tenant: str, session_id: str) -> list[object]:
    store: SessionStore = open_spec(spec)
    try:
        return list((await store.load(tenant, session_id)).messages)
    finally:
        await store.close()


@pytest.mark.parametrize("backend", DURABLE)
def test_concurrent_appends_from_processes_lose_and_duplicate_nothing(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    workers, sessions, batches = 4, 3, 25
    procs = [spawn("append", spec, tenant, str(w), str(sessions), str(batches)) for w in range(workers)]
    for p in procs:
        finish(p)
    for s in range(sessions):
        log = asyncio.run(load_all(spec, tenant, f"s{s}"))
        texts = [m.text for m in log]  # type: ignore[attr-defined]
        assert len(texts) == workers * batches * 2, f"s{s}: {len(texts)} messages"
        assert len(set(texts)) == len(texts), "a message was stored twice"
        assert len({m.id for m in log}) == len(log)  # type: ignore[attr-defined]
        for w in range(workers):
            mine = [t for t in texts if t.startswith(f"w{w}:")]
            assert mine == [f"w{w}:b{b}:m{j}" for b in range(batches) for j in range(2)], "order not preserved"
        for i, t in enumerate(texts):  # each batch is contiguous: appends are atomic
            if t.endswith(":m0"):
                assert texts[i + 1] == t[:-1] + "1"


@pytest.mark.parametrize("backend", DURABLE)
def test_concurrent_runs_from_processes_never_interleave(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    workers, runs = 4, 8
    procs = [spawn("run", spec, tenant, str(w), "shared", str(runs)) for w in range(workers)]
    for p in procs:
        finish(p)
    log = asyncio.run(load_all(spec, tenant, "shared"))
    assert len(log) == workers * runs * 4
    for k in range(0, len(log), 4):
        user, call, result, answer = log[k:k + 4]
        tag = user.text  # type: ignore[attr-defined]
        assert user.role == "user"  # type: ignore[attr-defined]
        assert call.function_calls[0].arguments == f'{{"text": "{tag}"}}'  # type: ignore[attr-defined]
        assert result.function_results[0].result == f"noted {tag}"  # type: ignore[attr-defined]
        assert answer.text == f"{tag}:done"  # type: ignore[attr-defined]
    order = Counter(m.text.split(":")[0] for m in log[::4])  # type: ignore[attr-defined]
    assert order == {f"w{w}": runs for w in range(workers)}
    assert broken_exchange(log) is None  # type: ignore[arg-type]


KILLS = int(os.environ.get("CONTEXTPIPE_CRASH_KILLS", "8"))


def check(report: StormReport) -> None:
    print(f"\n{report.summary()}")
    assert not report.problems, "\n".join(report.problems)
    assert (report.lost, report.duplicated, report.run_twice, report.falsely_interrupted, report.stuck) == (0,) * 5


@pytest.mark.parametrize("backend", DURABLE)
def test_sigkill_at_progress_points_then_resume(backend: str, tmp_path: Path) -> None:
    """One worker at a time, killed at its n-th progress report (n from the seed), resumed by the next;
    its runs are cancelled (task.cancel(), some twice) at points from the seed too."""
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    config = StormConfig(slots=1, sessions=1, kills=KILLS, steps=3, runs=4, seed=20261129,
                         lease_ttl=60.0 if backend == "sqlite" else 0.3, save_wait=0.2, max_kill_line=4,
                         clock_ahead=backend == "sqlite", cancels=0.5, stuck_after=30, liveness=120)
    report = run_storm(spec, tenant, tmp_path, config)
    assert report.kills == KILLS
    check(report)
    assert report.cancels > 0 and report.cancelled_runs > 0


@pytest.mark.parametrize("backend", DURABLE)
def test_crash_storm_on_shared_sessions(backend: str, tmp_path: Path) -> None:
    """Three workers, two of them sharing a session, parallel calls with non-idempotent tools, SIGKILLs,
    cancellations (some repeated), sync tools that outlive their timeout, and a session TTL shorter than
    those calls: nothing lost, duplicated, run twice or reported interrupted after it completed, and every
    session free after the storm."""
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    config = StormConfig(slots=3, sessions=2, kills=KILLS, steps=2, runs=3, seed=7, lease_ttl=0.5, save_wait=0.2,
                         max_kill_line=4, cancels=0.5, slow=0.3, slow_seconds=1.8, session_ttl=1.5, stuck_after=30,
                         liveness=120)
    report = run_storm(spec, tenant, tmp_path, config)
    assert report.kills >= KILLS
    check(report)
    assert report.cancels > 0 and report.late_results > 0 and report.outlived_ttl > 0


@pytest.mark.parametrize("backend", DURABLE)
def test_ctrl_c_before_the_first_answer_keeps_the_input(backend: str, tmp_path: Path) -> None:
    """A real process interrupted (SIGINT) while its model has not answered keeps the user's input, once."""
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    proc = subprocess.Popen([sys.executable, WORKER, "waiting", spec, tenant, "s", "Where is my parcel?"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "p model called"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    log = asyncio.run(load_all(spec, tenant, "s"))
    assert [(m.role, m.text) for m in log] == [("user", "Where is my parcel?")]  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", DURABLE)
def test_retry_after_sigkill_mid_run_resumes_the_run_once(backend: str, tmp_path: Path) -> None:
    """Seed 001, the run lifecycle (``agent.run(messages)`` → ``session.touch_request_hash(messages)``
    first): a client retrying after its worker was SIGKILLed mid-run (the model's call stored, its
    tool running) gets the run resumed and completed, one answer and one copy of the input stored;
    a second retry is answered from the log (MAF, agent-framework#3657, would answer each again)."""
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    question, message_id = "What should I wear in Suzhou today?", f"msg-retry-{uuid.uuid4().hex[:8]}"
    proc = spawn("retried", spec, tenant, "s", message_id, question)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "p tool started", proc.stderr.read() if proc.stderr else ""
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    asyncio.run(_retry_twice(spec, tenant, message_id, question))


async def _retry_twice(spec: str, tenant: str, message_id: str, question: str) -> None:
    from contextpipe import Agent, Message, tool
    from contextpipe.providers import History
    from contextpipe.testing import ScriptedModel

    @tool(idempotent=True)
    def lookup_location_code(city: str) -> str:
        """Return the location code for a city name."""
        return "SZ"

    store = open_spec(spec)
    try:
        model = ScriptedModel(["Suzhou (SZ): sunny, wear linen."])
        agent = Agent(model, tools=[lookup_location_code], providers=[History(store)])
        session = await agent.session("s", tenant=tenant)
        retry = Message.user(question, id=message_id)
        result = await agent.run(retry, session=session, lease_wait=60)  # the killed worker's lease expires
        again = await agent.run(retry, session=session)
        log = await agent.history(session)
    finally:
        await store.close()
    assert not result.replayed and result.text == "Suzhou (SZ): sunny, wear linen."
    assert [(m.role, m.text) for m in result.messages] == [
        ("assistant", ""), ("tool", ""), ("assistant", "Suzhou (SZ): sunny, wear linen.")]
    assert result.messages[1].function_results[0].result == "SZ"  # the idempotent tool was run again
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"]
    assert broken_exchange(log) is None
    assert len(model.requests) == 1 and again.replayed
    assert (again.text, again.messages, again.input) == (result.text, result.messages, result.input)
