"""The exactly-once crash storm, small: real worker processes SIGKILLed at each kind of point, then the check.

The storm is ``bench/exactly_once_bench.py`` (its worker ``bench/exactly_once_worker.py``); its full size,
with ≥ 300 kills on SQLite and ≥ 50 on PostgreSQL, writes ``bench/results/exactly-once.json``. Here
every kind of kill point is hit at least once (``cycle=True``), so each path must hold: a charge cut
before or after the service committed it, an outbox entry added but not committed, a plain call cut
before its effect, a kill after a save, and a relay killed between delivering and marking.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from .backends import store_spec

ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("CONTEXTPIPE_EXACTLY_ONCE_KILLS", "14"))


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("exactly_once_bench", ROOT / "bench" / "exactly_once_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_crash_storm_charges_and_ships_every_order_exactly_once(backend: str, tmp_path: Path) -> None:
    spec = store_spec(backend, tmp_path)  # skips loudly (fails under CI) without a PostgreSQL server
    kills = KILLS if backend == "sqlite" else max(7, KILLS // 2)
    report = bench.run_storm(spec, f"t{uuid.uuid4().hex[:12]}", tmp_path, kills=kills, slots=2, runs=2, seed=11,
                             lease_ttl=60.0 if backend == "sqlite" else 2.0, clock_ahead=backend == "sqlite",
                             cycle=True, max_line=1)
    print(f"\n{report.summary()}")
    assert report.problems == []
    assert report.kills >= kills and set(report.kill_points) == set(bench.KINDS)
    assert (report.double_charges, report.lost_charges, report.double_shipments, report.lost_shipments,
            report.interrupted) == (0, 0, 0, 0, 0)
    # The kills hit what they were aimed at: charges run again (the service deduplicated them), ship calls
    # run again, shipments delivered again, and plain calls answered "interrupted".
    assert report.charges_deduplicated >= 1 and report.ship_reruns >= 1
    assert report.deliveries_deduplicated >= 1 and report.notify_interrupted >= 1
    assert report.charges == report.charge_calls and report.shipments == report.ship_calls
