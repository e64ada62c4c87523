"""Steering in the inspector across sessions, in a real browser (headless Chromium, driven by Playwright): a
Regenerate's run goes to its own session whatever the page shows meanwhile, the queue box shows what other
clients queue, and while a run streams in another session than the one shown, Stop names it, its errors say
its session and the chat says why it sends nothing until the reason ends. A result or refusal answered once
another session is shown names its session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from contextpipe import Agent
from contextpipe.providers import History
from contextpipe.rewind import is_marker
from contextpipe.serve import create_app
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import PAID, pay

from .conftest import KEYS, GateModel, auth, keys, make_app, serving
from .test_browser_views import browser_page

pytestmark = pytest.mark.extra("browser")  # CONTEXTPIPE_TEST_EXTRAS=browser bash scripts/test.sh


async def texts(store: SQLiteStore, session: str) -> list[str]:
    return [m.text for m in (await store.load("acme", session)).messages if m.text and not is_marker(m)]


async def test_a_regenerate_runs_in_its_session_when_another_is_opened_during_its_rewind(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel(["Paris.", "Rome.", "Lyon, then."])
    app = create_app(Agent(model, providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        for session, question in (("s1", "A city?"), ("s2", "A capital?")):
            await c.post("/v1/sessions", json={"id": session})
            await c.post(f"/v1/sessions/{session}/runs", json={"input": question})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        reached, release = asyncio.Event(), asyncio.Event()

        async def hold(route: Any) -> None:  # s1's rewind waits here until the page shows s2
            reached.set()
            await release.wait()
            await route.continue_()

        await page.route("**/rewind", hold)
        try:
            await page.locator("#transcript li.msg[data-seq='2'] button.regenerate").click()
            async with asyncio.timeout(60):  # (a failure, not a hang, if the rewind never comes)
                await reached.wait()
            await page.locator("[data-session='s2']").click()
            await page.locator("#transcript li.msg", has_text="Rome.").wait_for()
            async with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/runs")) as run:
                release.set()
            response = await run.value  # (the run's lines, if any, were placed before its request went)
            assert response.url.endswith("/sessions/s1/runs")
            shown = page.locator("#transcript")
            assert await shown.locator(".streaming").count() == 0 and "Lyon" not in await shown.inner_text()
            await page.locator("[data-session='s1']").click()
            await shown.locator("li.msg:not(.streaming)", has_text="Lyon, then.").wait_for()  # stored, shown
        finally:  # a failed check must not leave the rewind held
            release.set()
        assert await texts(store, "s1") == ["A city?", "Paris.", "Lyon, then."]  # (Paris. is rewound, kept)
        assert await texts(store, "s2") == ["A capital?", "Rome."]
        assert [m.text for m in model.requests[-1].messages] == ["A city?"]
        assert await page.locator("#chat-error").inner_text() == ""
    await store.close()


async def test_the_queue_box_shows_what_another_client_queues_during_its_run(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = GateModel()
    app = make_app(store, model)
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        model.gated = True
        running = asyncio.create_task(c.post("/v1/sessions/s1/runs", json={"input": "Take your time."}, timeout=120))
        try:
            await model.entered.wait()  # another client's run holds the session
            await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
            await page.wait_for_selector("#chat", state="visible")
            queued = await c.post("/v1/sessions/s1/runs", json={"input": "In French, please.", "queue": "next"})
            assert queued.status_code == 202
            await page.locator("#queued li[data-when='next']", has_text="In French, please.").wait_for()  # its poll
        finally:
            model.release.set()
        assert (await running).status_code == 200
        await asyncio.gather(*app.state.api.runs.background)  # the server's run of the queued message
        await page.locator("#queue").wait_for(state="hidden")  # delivered: off the list
        assert "In French, please." in await texts(store, "s1")
    await store.close()


class FailingGate(GateModel):
    """GateModel whose calls fail, once past the gate, while `failing` is set."""

    failing = False

    async def complete(self, request: Any) -> Any:
        response = await super().complete(request)
        if self.failing:
            raise RuntimeError("the model went away")
        return response


async def test_while_a_run_streams_in_another_session_stop_names_it_and_the_chat_says_why_it_sends_nothing(
        tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = FailingGate(gated=True)
    app = make_app(store, model)
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        for session in ("s1", "s2"):
            await c.post("/v1/sessions", json={"id": session})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        chat, notice, stop = page.locator("#chat-input"), page.locator("#chat-error"), page.locator("#stop")
        for failing in (False, True):
            model.failing, model.entered, model.release = failing, asyncio.Event(), asyncio.Event()
            try:
                await page.locator("[data-session='s1']").click()
                await page.locator("#session-title", has_text="s1").wait_for()
                await chat.fill("Take your time.")
                await chat.press("Enter")
                async with asyncio.timeout(60):  # (a failure, not a hang, if the run never reaches the model)
                    await model.entered.wait()
                await stop.wait_for()
                assert await stop.inner_text() == "Stop"
                await page.locator("[data-session='s2']").click()
                await page.locator("#session-title", has_text="s2").wait_for()
                assert await stop.inner_text() == "Stop the run in s1"
                await chat.fill("And here?")
                await chat.press("Enter")
                assert await notice.inner_text() == ("Not sent: a run streams in s1. Your message stays here; "
                                                     "send it once that ends.")
                assert await chat.input_value() == "And here?"
                if failing:  # a refused Stop says whose run it was
                    await page.route("**/cancel", lambda route: route.fulfill(status=404, json={
                        "error": {"type": "NoRunInFlight", "message": "no run in flight"}}))
                    await stop.click()
                    await page.locator("#session-error", has_text="In s1: no run in flight").wait_for()
            finally:  # a failed check must not leave the run held
                model.release.set()
            await stop.wait_for(state="hidden")  # (hidden in the same step that settles the chat's notice)
            # The notice goes with its reason; the failed run's error, shown over it, stays and names its session.
            assert await notice.inner_text() == ("In s1: The run failed: the run failed; see the server log"
                                                 if failing else "")
            assert await chat.input_value() == "And here?"
        assert await stop.inner_text() == "Stop"
    assert await texts(store, "s2") == []  # nothing went to the session shown
    assert (await texts(store, "s1"))[:2] == ["Take your time.", "reply 1 to Take your time."]
    await store.close()


async def test_a_notice_during_a_regenerate_in_another_session_follows_its_reason_and_goes_at_its_end(
        tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel(["Paris.", "Rome.", "Lyon, then."])
    app = create_app(Agent(model, providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        for session, question in (("s1", "A city?"), ("s2", "A capital?")):
            await c.post("/v1/sessions", json={"id": session})
            await c.post(f"/v1/sessions/{session}/runs", json={"input": question})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        held = {route: (asyncio.Event(), asyncio.Event()) for route in ("rewind", "runs")}  # (reached, release)

        def holding(name: str) -> Any:
            async def hold(route: Any) -> None:  # the request waits here until the test releases it
                reached, release = held[name]
                reached.set()
                await release.wait()
                await route.continue_()
            return hold

        for name in held:
            await page.route(f"**/{name}", holding(name))
        chat, notice = page.locator("#chat-input"), page.locator("#chat-error")
        said = "Not sent: {}. Your message stays here; send it once that ends."
        try:
            await page.locator("#transcript li.msg[data-seq='2'] button.regenerate").click()
            async with asyncio.timeout(60):  # (a failure, not a hang, if the request never comes)
                await held["rewind"][0].wait()
            await page.locator("[data-session='s2']").click()
            await page.locator("#transcript li.msg", has_text="Rome.").wait_for()
            await chat.fill("And here?")
            await chat.press("Enter")
            assert await notice.inner_text() == said.format("a rewind, fork or regenerate is in progress")
            held["rewind"][1].set()
            async with asyncio.timeout(60):
                await held["runs"][0].wait()  # (the page said its run streams before its request went)
            assert await notice.inner_text() == said.format("a run streams in s1")  # the reason changed
            held["runs"][1].set()
            await page.locator("#transcript:not(.steering)").wait_for()  # (the action's end settles the notice)
            assert await notice.inner_text() == ""
            assert await chat.input_value() == "And here?"
        finally:  # a failed check must not leave a request held
            for _, release in held.values():
                release.set()
    assert await texts(store, "s1") == ["A city?", "Paris.", "Lyon, then."]
    assert await texts(store, "s2") == ["A capital?", "Rome."]
    await store.close()


async def test_a_result_or_refusal_that_answers_once_another_session_is_shown_names_its_own(tmp_path: Path) -> None:
    PAID.clear()
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel([tool_call("pay", invoice="INV-7", amount=120), "Noted.", "Paid INV-7."])
    app = create_app(Agent(model, tools=[pay], providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        for session, text in (("alice", "Pay INV-7."), ("bob", "Hello.")):
            await c.post("/v1/sessions", json={"id": session})
            await c.post(f"/v1/sessions/{session}/runs", json={"input": text})
        reached, release = asyncio.Event(), asyncio.Event()
        refuse = False

        async def hold(route: Any) -> None:  # a POST waits here until the page shows another session
            if route.request.method != "POST":  # (the page's own reads of the session go on)
                await route.continue_()
                return
            reached.set()
            await release.wait()
            if refuse:
                await route.fulfill(status=409, json={"error": {"type": "BadSequence", "message": "moved on"}})
            else:
                await route.continue_()

        async def answered_elsewhere(click: Any, other: str) -> None:
            reached.clear()
            release.clear()
            await click()
            async with asyncio.timeout(60):  # (a failure, not a hang, if the request never comes)
                await reached.wait()
            await page.locator(f"[data-session='{other}']").click()
            await page.locator("#session-title", has_text=other).wait_for()
            release.set()

        await page.route("**/approvals", hold)
        await page.route("**/rewind", hold)
        try:
            await page.goto(f"{base}/ui/?session=alice#key={KEYS['acme']}")
            approve = page.locator("#pending li[data-call-id='call_1'] button.approve")
            await answered_elsewhere(approve.click, "bob")
            await page.locator("#run-result", has_text="In alice: The run completed: Paid INV-7.").wait_for()
            rewind = page.locator("#transcript li.msg[data-seq='1'] button.rewind")
            await answered_elsewhere(rewind.click, "alice")
            await page.locator("#run-result", has_text="In bob: Rewound: the messages after #1").wait_for()
            refuse = True
            await answered_elsewhere(rewind.click, "bob")  # (alice's first message: its rewind is refused)
            await page.locator("#session-error", has_text="In alice: Could not rewind: moved on").wait_for()
        finally:  # a failed check must not leave a request held
            release.set()
    assert PAID == ["INV-7"]
    assert await texts(store, "bob") == ["Hello.", "Noted."]  # (its rewind leaves them stored)
    await store.close()
