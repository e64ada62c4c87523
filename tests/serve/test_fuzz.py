"""schemathesis holds the server to its own ``/openapi.json``: every check, every phase, a fixed seed.

It runs as a user would run it, ``st run URL --checks all``, against a real uvicorn server on
127.0.0.1: examples, coverage (every boundary and every undocumented method), fuzzing (schema-valid
and schema-violating requests) and the stateful phase (create a session, then run on it, read it,
delete it, read it again, following the document's links). Any 5xx, a schema-valid request refused,
a schema-violating one accepted, a response or status the document does not describe, a 405
without ``Allow``, a route that ignores its key: each is a failure.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

from contextpipe.serve import ServeSettings, create_app
from contextpipe.stores import SQLiteStore

from .conftest import KEYS, GateModel, keys, make_app, serving

SEED = 20260
"""Fixed, so a failure found once is found again (``--seed``); change it to explore other inputs."""


async def schemathesis(base: str, cwd: Path, *, max_examples: int) -> tuple[int, str]:
    """Run the schemathesis command line on `base`'s document; return its exit code and output."""
    key = KEYS["acme"]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json", "--checks", "all",
        "--seed", str(SEED), "--max-examples", str(max_examples), "--workers", "1",
        "--generation-database", "none", "--request-timeout", "30",
        # Both ways of sending the key: the document declares both, and the fuzzer fills in any it is not given.
        "-H", f"Authorization: Bearer {key}", "-H", f"X-API-Key: {key}",
        cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "120"})
    out, _ = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


def assert_passed(code: int, output: str, phases: tuple[str, ...]) -> None:
    assert code == 0, output
    summary = output[output.index("Test Phases:"):]
    for phase in phases:
        assert f"✅ {phase}" in summary, output
    assert re.search(r"\b(\d+) generated, \1 passed\b", summary), output  # every case passed


async def test_the_server_keeps_to_its_openapi_document(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "fuzz.db") as store:
        app = make_app(store, GateModel())
        async with serving(app) as base:
            code, output = await schemathesis(base, tmp_path, max_examples=25)
    assert_passed(code, output, ("Coverage", "Fuzzing", "Stateful"))


async def test_the_read_only_inspector_keeps_to_its_openapi_document(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "fuzz.db") as store:
        app = create_app(None, keys=keys(), store=store, settings=ServeSettings(read_only=True))
        async with serving(app) as base:
            code, output = await schemathesis(base, tmp_path, max_examples=15)
    assert_passed(code, output, ("Coverage", "Fuzzing"))  # no links without writing routes: nothing stateful
