"""A streamed run's status line waits for the run's admission: a busy session is a 409 on every streaming route.

Several streamed requests at once on one session (over a real uvicorn server, so a 200 arrives
before its stream ends), all at the session's lease together (`AllAtOnce`): the run that takes it
streams, held by a gated model until the test releases it; every other request is answered 409
`SessionBusy` as JSON. (A server that checked the lease before its run took it let them all pass.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx2 as httpx
import pytest

from contextpipe.models import ModelRequest
from contextpipe.stores import Lease, MemoryStore
from helpers import PAID

from .conftest import GateModel, auth, make_app, serving
from .test_approvals_http import DIGEST, payments, stopped

Request = tuple[str, dict[str, Any], dict[str, str]]


class AllAtOnce(MemoryStore):
    """A memory store whose next `arm(n)` lease attempts wait for each other: `n` requests at the lease at once."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0
        self.here = asyncio.Event()
        self.here.set()

    def arm(self, n: int) -> None:
        self.waiting, self.here = n, asyncio.Event()

    async def try_acquire_lease(self, tenant: str, session_id: str, owner: str, ttl: float) -> Lease | None:
        if self.waiting > 0:
            self.waiting -= 1
            if self.waiting == 0:
                self.here.set()
        await self.here.wait()
        return await super().try_acquire_lease(tenant, session_id, owner, ttl)


def runs(i: int) -> Request:
    return "/v1/sessions/s1/runs", {"input": f"one {i}", "stream": True, "wait": 0}, {}


def agui(i: int) -> Request:
    return "/v1/ag-ui", {"threadId": "s1", "runId": f"r{i}", "state": {}, "tools": [], "context": [],
                         "forwardedProps": {}, "messages": [{"id": f"u{i}", "role": "user", "content": f"one {i}"}]}, {}


def chat(i: int) -> Request:
    return ("/v1/chat/completions", {"model": "test", "stream": True,
                                     "messages": [{"role": "user", "content": f"one {i}"}]}, {"X-Session-Id": "s1"})


def responses(i: int) -> Request:
    return "/v1/responses", {"model": "test", "stream": True, "input": f"one {i}", "conversation": "s1"}, {}


ENDS = {"runs": ("event: done", "event: error"), "agui": ("RUN_FINISHED", "RUN_ERROR"),
        "chat": ("data: [DONE]", '"error":{'), "responses": ("response.completed", "event: error")}
"""What ends each route's stream when the run succeeded, and what it sends when the run fails."""


async def race(c: httpx.AsyncClient, requests: list[Request], release: Callable[[], None]) -> list[tuple[int, Any]]:
    """Send `requests` at once; once all but one are answered, `release` the run; return each (status, body)."""

    async def send(path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
        async with c.stream("POST", path, json=body, headers={**auth(), **headers}) as response:
            text = (await response.aread()).decode()
            if response.status_code != 200:
                assert response.headers["content-type"] == "application/json"
                return response.status_code, (json.loads(text), response.headers.get("retry-after"))
            assert response.headers["content-type"].startswith("text/event-stream")
            return 200, text

    tasks = [asyncio.ensure_future(send(*r)) for r in requests]
    pending = set(tasks)
    while len(pending) > 1:  # the progress signal: answers coming back (the one admitted is held by the model)
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    release()
    return [await t for t in tasks]


@pytest.mark.parametrize("n", [2, 5])
@pytest.mark.parametrize("route", [runs, agui, chat, responses], ids=lambda r: r.__name__)
async def test_concurrent_streamed_runs_on_one_session_one_streams_the_others_get_409(
        route: Callable[[int], Request], n: int) -> None:
    model = GateModel(gated=True)
    store = AllAtOnce()
    async with serving(make_app(store, model)) as url, httpx.AsyncClient(base_url=url, timeout=60) as c:
        assert (await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())).status_code == 201
        store.arm(n)
        answers = await race(c, [route(i) for i in range(n)], model.release.set)
    streamed = [body for status, body in answers if status == 200]
    refused = [body for status, body in answers if status != 200]
    assert len(streamed) == 1, answers
    assert [(status, body[0]["error"]["type"], body[1]) for status, body in answers if status != 200] == \
        [(409, "SessionBusy", "1")] * (n - 1)
    assert all("busy" in body["error"]["message"] for body, _ in refused)
    done, failed = ENDS[route.__name__]
    assert done in streamed[0] and failed not in streamed[0]  # the run's events, in the route's own form
    assert model.calls == 1
    [winner] = [i for i, (status, _) in enumerate(answers) if status == 200]
    log = [m.text for m in (await store.load("acme", "s1")).messages]
    assert log == [f"one {winner}", f"reply 1 to one {winner}"]


async def test_concurrent_streamed_decisions_one_resumes_the_others_get_409() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_answer(request: ModelRequest) -> str:
        entered.set()
        await release.wait()
        return "Paid INV-7."

    store = AllAtOnce()
    app, _ = payments(slow_answer, store=store)
    PAID.clear()
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as c:
        await stopped(c)
        store.arm(3)
        decision = {"decisions": {"call_1": {"decision": "approve", "digest": DIGEST}}, "stream": True}
        answers = await race(c, [("/v1/sessions/s1/approvals", decision, {})] * 3, release.set)
    assert sorted(status for status, _ in answers) == [200, 409, 409]
    assert [body[0]["error"]["type"] for status, body in answers if status == 409] == ["SessionBusy"] * 2
    [streamed] = [body for status, body in answers if status == 200]
    assert "event: done" in streamed and "Paid INV-7." in streamed
    assert PAID == ["INV-7"]


@pytest.mark.parametrize("path", ["/v1/sessions/s1/approvals", "/v1/sessions/s1/runs"])
async def test_a_streamed_resume_whose_decisions_do_not_fit_is_a_409_not_a_stream(path: str) -> None:
    app, model = payments("Paid INV-7.")
    PAID.clear()
    async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as c:
        await stopped(c)
        field = "decisions" if path.endswith("approvals") else "approvals"
        for decisions, why in (({"call_1": {"decision": "approve", "digest": "0" * 64}}, "other arguments"),
                               ({"call_9": {"decision": "approve"}}, "is not awaiting approval")):
            body = {field: decisions, "stream": True, **({} if field == "decisions" else {"input": None})}
            response = await c.post(path, json=body, headers=auth())
            assert (response.status_code, response.headers["content-type"]) == (409, "application/json")
            assert response.json()["error"]["type"] == "ApprovalError" and why in response.json()["error"]["message"]
        # The decision that fits streams; after it, the same decision is answered already: a 409 again.
        decision = {field: {"call_1": {"decision": "approve", "digest": DIGEST}}, "stream": True}
        if field == "approvals":
            decision["input"] = None
        assert (await c.post(path, json=decision, headers=auth())).status_code == 200
        late = await c.post(path, json=decision, headers=auth())
        assert (late.status_code, late.json()["error"]["type"]) == (409, "ApprovalError")
        assert "answered already" in late.json()["error"]["message"]
    assert PAID == ["INV-7"] and len(model.requests) == 2
