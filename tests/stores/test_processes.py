"""Several OS processes on the same sessions, and processes killed with SIGKILL mid-run."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

from contextpipe.stores import SessionStore

from .backends import DURABLE, open_spec, store_spec
from .proc_worker import broken_exchange

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


KILLS = int(os.environ.get("CONTEXTPIPE_CRASH_KILLS", "20"))
STEPS = 400


@pytest.mark.parametrize("backend", DURABLE)
def test_sigkill_at_random_points_then_resume(backend: str, tmp_path: Path) -> None:
    spec, tenant = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}"
    effects, violations = tmp_path / "effects.txt", tmp_path / "violations.txt"
    rng = random.Random(20261129)
    args = ("crash", spec, tenant, "job", str(STEPS), str(effects), str(violations))
    kills = 0
    for _ in range(KILLS):
        proc = spawn(*args)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"worker did not start: {line!r}\n{err[-3000:]}")
        # The killed predecessor's lease (0.5 s) must lapse before this worker can run: kill after that.
        delay = 0.5 + rng.uniform(0.0, 0.25)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.communicate()
    final = spawn(*args)
    finish(final)
    assert kills >= KILLS * 0.8, f"only {kills} of {KILLS} runs were killed mid-run"

    assert not violations.exists(), "a model was sent a broken tool exchange:\n" + violations.read_text()
    log = asyncio.run(load_all(spec, tenant, "job"))
    assert broken_exchange(log) is None  # type: ignore[arg-type]
    assert len({m.id for m in log}) == len(log)  # type: ignore[attr-defined]
    assert log[0].text == "start" and log[-1].text == "done"  # type: ignore[attr-defined]
    successes = [r.result for m in log for r in m.function_results if not r.is_error]  # type: ignore[attr-defined]
    assert successes == [f"{'record' if n % 2 == 0 else 'lookup'} {n} ok" for n in range(STEPS)], \
        "every completed step must be in the history exactly once, in order"
    calls = {c.call_id: c for m in log for c in m.function_calls}  # type: ignore[attr-defined]
    assert len(calls) == sum(len(m.function_calls) for m in log)  # type: ignore[attr-defined]
    record_runs = Counter(line.split()[2] for line in effects.read_text().splitlines() if line.startswith("record"))
    assert record_runs and max(record_runs.values()) == 1, "a non-idempotent call was run twice"
    lookup_runs = Counter(line.split()[2] for line in effects.read_text().splitlines() if line.startswith("lookup"))
    interrupted = sum(1 for m in log for r in m.function_results if r.is_error)  # type: ignore[attr-defined]
    print(f"\n{backend}: {kills} kills survived, {len(log)} messages checked, {interrupted} interrupted calls "
          f"recorded, {sum(1 for n in lookup_runs.values() if n > 1)} idempotent calls re-run on resume")
