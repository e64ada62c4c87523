"""A worker killed while a slow parallel tool runs keeps the fast sibling's result (SIGKILL, real process)."""

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
from parallel_worker import tools

WORKER = str(Path(__file__).with_name("parallel_worker.py"))


def kill_once_the_charge_is_saved(db: Path, effects: Path) -> None:
    """Start the worker and SIGKILL it as soon as it reports the charge's result saved."""
    proc = subprocess.Popen([sys.executable, WORKER, str(db), str(effects)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # The worker's own progress report, not a sleep. Only a safety net bounds the wait: if the
        # charge were saved only with its slow sibling, the report would never come.
        with ThreadPoolExecutor(1) as pool:
            line = pool.submit(proc.stdout.readline).result(timeout=120).strip()
        assert line == "saved-charge"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)  # reaps the process and closes its pipes


async def test_kill_after_a_fast_parallel_call_finished_keeps_its_result(tmp_path: Path) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.txt"
    kill_once_the_charge_is_saved(db, effects)
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
