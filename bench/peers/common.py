"""Shared by every peer's worker (standard library only): the fixture text, timing (``bench/_harness.py``) and
the worker protocol.

A worker is run as ``python peer_NAME.py WORKLOAD N SAMPLES WORKDIR`` in its peer's virtualenv and
prints one JSON object: ``{"samples_ms": [...], "check": {...}}``. Workloads:

- ``run``: a run over N stored messages on a durable session, the same process running it again
  (the first run is not timed); the store is the peer's durable SQLite/file store;
- ``loop``: a run of 20 tool calls (21 model calls) on a fresh durable session, every step persisted
  as the peer allows, then the final answer;
- ``cold``: a new process imports the framework, opens the store and runs once over N stored messages
  (the orchestrator times the whole process, from its start to its exit).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP_STEPS = 20
WORDS = (  # noqa: SIM905 - the fixture text, as first measured
    "the order shipped from the warehouse in Suzhou on Monday and the customer asked whether the invoice "
    "includes tax because their accounting team needs a breakdown by line item before they approve the "
    "payment for the next quarter weather forecast itinerary flight hotel meeting deadline budget").split()
STARTED = time.perf_counter()


def history_texts(n: int, seed: int = 7) -> list[tuple[str, str]]:
    """`n` (role, text) pairs: user questions and longer assistant answers, alternating, deterministic."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = rng.randint(6, 50) if i % 2 == 0 else rng.randint(20, 120)
        text = " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."
        out.append(("user" if i % 2 == 0 else "assistant", text))
    return out


def lookup_value(key: str) -> str:
    return f"value-{key}"


async def time_runs(op: Callable[[], Awaitable[Any]], samples: int) -> list[float]:
    """Run `op` once untimed (first-use costs), then `samples` times: wall ms of each."""
    # Imported here, not at the top: a cold start (timed from process start) should not pay for it.
    sys.path.insert(0, BENCH)
    import _harness

    return [s.wall * 1000 for s in await _harness.ameasure(lambda _: op(), samples)]


def args() -> tuple[str, int, int, str]:
    workload, n, samples, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    return workload, n, samples, workdir


def emit(samples_ms: list[float], **check: Any) -> None:
    print(json.dumps({"samples_ms": samples_ms, "check": check}))
