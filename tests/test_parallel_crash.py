"""Workers killed mid-run (SIGKILL, real processes): a finished parallel call keeps its result, and a call
run again after the kill gets the same idempotency key."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from contextpipe import Agent
from contextpipe.exchanges import exchange_problem
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel
from contextpipe.tool_context import idempotency_key
from idempotency_worker import charge_tool
from parallel_worker import tools

WORKER = str(Path(__file__).with_name("parallel_worker.py"))
IDEMPOTENCY_WORKER = str(Path(__file__).with_name("idempotency_worker.py"))


def kill_once_it_reports(argv: list[str], report: str) -> None:
    """Start the worker script `argv` and SIGKILL it as soon as it prints `report`."""
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # The worker's own progress report, not a sleep. Only a safety net bounds the wait: if what
        # it reports never happened (the charge saved only with its slow sibling), the report never comes.
        with ThreadPoolExecutor(1) as pool:
            line = pool.submit(proc.stdout.readline).result(timeout=120).strip()
        assert line == report
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)  # reaps the process and closes its pipes


async def test_kill_after_a_fast_parallel_call_finished_keeps_its_result(tmp_path: Path) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.txt"
    kill_once_it_reports([WORKER, str(db), str(effects)], "saved-charge")  # the charge's result is saved
    async with SQLiteStore(db) as store:
        agent = Agent(ScriptedModel(["Charged; the audit did not finish."]), tools=tools(effects),
                      providers=[History(store)])
        session = await agent.session("pay")
        result = await agent.run(None, session=session, lease_wait=60)  # the dead worker's lease expires
        log = await agent.history(session)

    assert result.text == "Charged; the audit did not finish."
    assert exchange_problem(log) is None
    calls = {c.name: c.call_id for c in log[1].function_calls}
    results = {r.call_id: r for m in log if m.role == "tool" for r in m.function_results}
    assert len(results) == 2 and sum(len(m.function_results) for m in log) == 2  # each call answered once
    charged = results[calls["charge"]]
    assert (charged.result, charged.is_error) == ("charged 5", False)  # not reported as interrupted
    assert "interrupted before it finished" in results[calls["audit"]].result
    assert effects.read_text().splitlines() == ["charged 5"]  # the charge ran exactly once


async def test_a_call_run_again_after_a_kill_gets_the_same_idempotency_key(tmp_path: Path) -> None:
    db, keys = tmp_path / "agent.db", tmp_path / "keys.txt"
    kill_once_it_reports([IDEMPOTENCY_WORKER, str(db), str(keys)], "charging")
    async with SQLiteStore(db) as store:  # another process: only what the log holds is shared
        agent = Agent(ScriptedModel(["Charged."]), tools=[charge_tool(keys, hang=False)], providers=[History(store)])
        session = await agent.session("pay", tenant="acme")
        result = await agent.run(None, session=session, lease_wait=60)  # the dead worker's lease expires
        log = await agent.history(session)

    assert result.text == "Charged."
    (call,) = log[1].function_calls
    assert log[2].function_results[0].result == "charged 5"
    expected = f"{call.call_id} {idempotency_key('acme', 'pay', log[1].id, call.call_id)}"
    assert keys.read_text().splitlines() == [expected, expected]  # killed once, run again with the same key
