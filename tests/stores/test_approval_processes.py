"""Approvals across OS processes: a run stopped for approval, its worker SIGKILLed, decided from new processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Message
from contextpipe.approvals import AWAITING_KEY, DECISIONS_KEY, arguments_digest
from storm_worker import broken_exchange

from .backends import DURABLE, store_spec
from .test_processes import load_all

WORKER = str(Path(__file__).with_name("approval_worker.py"))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def killed_at(proc: subprocess.Popen[str], line: str) -> list[str]:
    """Wait for the worker to print a line starting with `line`, SIGKILL it, and return that line's words."""
    assert proc.stdout is not None
    try:
        words = proc.stdout.readline().split()
        assert words[:len(line.split())] == line.split(), proc.stderr.read() if proc.stderr else ""
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return words


def stopped_for_approval(spec: str, tenant: str, effects: Path) -> tuple[str, str]:
    """Run until the payment awaits approval, SIGKILL the worker; return the call id and digest it printed."""
    _, _, call_id, digest = killed_at(spawn("stop", spec, tenant, "s", str(effects)), "p pending")
    return call_id, digest


def decided(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Wait for a `decide` worker and return what it printed."""
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    answer: dict[str, Any] = json.loads(out.splitlines()[-1])
    return answer


def decide(spec: str, tenant: str, effects: Path, call_id: str, decision: str, digest: str) -> subprocess.Popen[str]:
    return spawn("decide", spec, tenant, "s", str(effects), call_id, decision, digest)


def log_of(spec: str, tenant: str) -> list[Message]:
    return [m for m in asyncio.run(load_all(spec, tenant, "s")) if isinstance(m, Message)]


def payments(effects: Path) -> list[str]:
    return [line.rsplit(" ", 1)[0] for line in effects.read_text().splitlines()] if effects.exists() else []


@pytest.mark.parametrize("backend", DURABLE)
def test_an_approval_survives_a_sigkill_and_is_decided_from_a_new_process(backend: str, tmp_path: Path) -> None:
    spec, tenant, effects = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}", tmp_path / "paid.txt"
    call_id, digest = stopped_for_approval(spec, tenant, effects)
    stored = log_of(spec, tenant)
    assert [m.role for m in stored] == ["user", "assistant"]  # the pending call is in the log, nothing else
    assert stored[1].metadata[AWAITING_KEY] == {call_id: "pays 120 EUR"}
    assert digest == arguments_digest("pay", stored[1].function_calls[0].arguments)

    other = arguments_digest("pay", '{"invoice": "INV-7", "amount": 12000}')
    refused = decided(decide(spec, tenant, effects, call_id, "approve", other))
    assert refused["error"] == "ApprovalError" and "other arguments" in refused["message"], refused
    assert log_of(spec, tenant) == stored and payments(effects) == []  # refused before anything ran or was stored

    done = decided(decide(spec, tenant, effects, call_id, "approve", digest))
    assert done == {"stop_reason": "completed", "text": "done (paid INV-7)"}
    log = log_of(spec, tenant)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"] and broken_exchange(log) is None
    assert log[2].metadata[DECISIONS_KEY] == {call_id: {"decision": "approved", "digest": digest}}
    assert payments(effects) == ["paid INV-7 120"]


@pytest.mark.parametrize("backend", DURABLE)
def test_two_workers_deciding_at_once_one_wins_and_the_other_is_told(backend: str, tmp_path: Path) -> None:
    spec, tenant, effects = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}", tmp_path / "paid.txt"
    call_id, digest = stopped_for_approval(spec, tenant, effects)
    workers = {"approve": decide(spec, tenant, effects, call_id, "approve", digest),
               "reject": decide(spec, tenant, effects, call_id, "reject", digest)}
    answers = {decision: decided(proc) for decision, proc in workers.items()}
    won = [d for d, a in answers.items() if "stop_reason" in a]
    lost = [d for d, a in answers.items() if "error" in a]
    assert len(won) == 1 and len(lost) == 1, answers
    loser = answers[lost[0]]
    assert loser["error"] == "ApprovalError" and "has been answered already" in loser["message"], loser
    log = log_of(spec, tenant)
    answers_to_call = [r for m in log for r in m.function_results if r.call_id == call_id]
    assert len(answers_to_call) == 1 and broken_exchange(log) is None
    if won == ["approve"]:
        assert answers["approve"]["text"] == "done (paid INV-7)" and payments(effects) == ["paid INV-7 120"]
    else:
        assert answers["reject"]["text"].startswith(
            "done (Error: the call to 'pay' was not run: the user rejected it (not this month)")
        assert answers_to_call[0].is_error and payments(effects) == []


@pytest.mark.parametrize("backend", DURABLE)
def test_a_worker_killed_while_an_approved_call_runs_leaves_it_answered_interrupted(backend: str,
                                                                                    tmp_path: Path) -> None:
    """The approval is kept before the call starts: the next worker (the client sending its approval again)
    neither asks again nor pays again; the call, not idempotent, is answered as interrupted."""
    spec, tenant, effects = store_spec(backend, tmp_path), f"t{uuid.uuid4().hex[:12]}", tmp_path / "paid.txt"
    call_id, digest = stopped_for_approval(spec, tenant, effects)
    killed_at(decide(spec, tenant, effects, call_id, "approve-hang", digest), "p tool started")
    assert payments(effects) == ["paid INV-7 120"]
    again = decided(decide(spec, tenant, effects, call_id, "approve", digest))  # waits out the killed lease
    assert again["stop_reason"] == "completed"
    assert again["text"].startswith("done (Error: the call to 'pay' was interrupted before it finished")
    assert payments(effects) == ["paid INV-7 120"]
    log = log_of(spec, tenant)
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant"] and broken_exchange(log) is None
