"""The inspector in a real browser (Debian's headless Chromium, driven by Playwright): chat, charts, approvals."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx2 as httpx
import pytest

from contextpipe import Agent, Durability, FunctionCall, Message
from contextpipe.providers import History
from contextpipe.serve import ServeSettings, create_app
from contextpipe.stores import Checkpoint, SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from helpers import PAID, get_weather_forecast, lookup_location_code, pay

from .conftest import KEYS, auth, keys, serving


@pytest.mark.extra("browser")  # Playwright and Debian's chromium: CONTEXTPIPE_TEST_EXTRAS=browser bash scripts/test.sh
async def test_inspector_runs_a_chat_and_shows_transcript_and_chart(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    executable = shutil.which("chromium")
    assert executable is not None
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel(["Noted: you are going to Suzhou.",
                           tool_call("lookup_location_code", city="Suzhou"),
                           tool_call("get_weather_forecast", location_code="SZ"),
                           "Sunny and 25 C in Suzhou: a T-shirt and a light jacket."])
    agent = Agent(model, instructions="You are a weather assistant.", providers=[History(store)],
                  tools=[lookup_location_code, get_weather_forecast], durability=Durability(store_traces=True),
                  name="weather")
    app = create_app(agent, keys=keys())
    async with serving(app) as base:
        async with httpx.AsyncClient(base_url=base) as c:
            await c.post("/v1/sessions", json={"id": "alice/trip"}, headers=auth())
            await c.post("/v1/sessions", json={"id": "bob/other"}, headers=auth())
            await c.post("/v1/sessions/alice%2Ftrip/runs", json={"input": "I am going to Suzhou."}, headers=auth())
        # A session a crashed run left with an unanswered call, a summary checkpoint, then repaired.
        crashed = await store.load_or_create("acme", "carol/crash")
        await store.append("acme", "carol/crash", [
            Message.user("Tell me a story."), Message.assistant("Once upon a time..."),
            Message.user("Weather in Suzhou?"),
            Message("assistant", (FunctionCall("c1", "lookup_location_code", '{"city": "Suzhou"}'),))])
        await store.save_checkpoint("acme", "carol/crash", Checkpoint(2, Message.assistant(
            "Summary: carol asked for a story and got one."), 0.0))
        repairer = Agent(ScriptedModel(["Suzhou is SZ."]), providers=[History(store)],
                         durability=Durability(store_traces=True), tools=[lookup_location_code, get_weather_forecast])
        await repairer.run(None, session=crashed)
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1400, "height": 860})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{base}/ui/#key={KEYS['acme']}")
            await page.wait_for_selector("#sessions li")
            assert await page.locator("#sessions li").count() == 3
            await page.fill("#search", "alice")
            await page.wait_for_function("document.querySelectorAll('#sessions li').length === 1")
            await page.click("#sessions li")
            await page.wait_for_selector("#transcript .msg")
            assert await page.locator("#chart g.call").count() == 1

            await page.fill("#chat-input", "What should I wear there today?")
            await page.press("#chat-input", "Enter")
            answer = page.locator("#transcript li.msg.assistant", has_text="a light jacket")
            await answer.wait_for()
            await page.wait_for_function("document.querySelectorAll('#chart g.call').length === 4")

            transcript = page.locator("#transcript")
            roles = await transcript.locator("li.msg .role").all_inner_texts()
            assert [r.lower() for r in roles] == ["user", "assistant", "user", "assistant", "tool", "assistant",
                                                  "tool", "assistant"]
            call = transcript.locator(".call", has_text="lookup_location_code")
            assert '"city": "Suzhou"' in await call.inner_text()
            assert "SZ" in await transcript.locator(".result").first.inner_text()
            badges = await transcript.locator(".badge.src").all_inner_texts()
            assert "input" in badges
            assert "tool:lookup_location_code" in badges
            assert await transcript.locator(".marker.callmark").count() == 4

            # The chart's segments are the stored trace's tokens by source, bar by bar.
            async with httpx.AsyncClient(base_url=base) as c:
                traces = (await c.get("/v1/sessions/alice%2Ftrip/traces", headers=auth())).json()["traces"]
            last = page.locator("#chart g.call").nth(3)
            drawn = {await seg.get_attribute("data-source"): int(await seg.get_attribute("data-tokens") or 0)
                     for seg in await last.locator("rect.seg").all()}
            assert drawn == {k: v for k, v in traces[3]["tokens_by_source"].items() if v}
            assert {"history:history", "instructions:agent", "tools:agent"} <= set(drawn)
            assert "Model call 4" in await page.locator("#call-detail").inner_text()
            await page.locator("#chart g.call").nth(0).click()
            assert "Model call 1" in await page.locator("#call-detail").inner_text()
            await page.screenshot(path=str(tmp_path / "inspector.png"))

            await page.fill("#search", "crash")
            await page.wait_for_function("document.querySelectorAll('#sessions li').length === 1 && "
                                         "document.querySelector('#sessions li').dataset.session === 'carol/crash'")
            await page.click("#sessions li")
            await page.wait_for_selector("#transcript .badge.repair")
            repaired = transcript.locator("li.msg", has=page.locator(".badge.repair"))
            assert await repaired.count() == 1
            assert "result of c1" in await repaired.inner_text()
            checkpoint = transcript.locator(".marker.checkpoint")
            assert "carol asked for a story" in await checkpoint.inner_text()
            assert "up to #2" in await checkpoint.inner_text()
            assert errors == []
            await browser.close()
    await store.close()


@pytest.mark.extra("browser")  # Playwright and Debian's chromium: CONTEXTPIPE_TEST_EXTRAS=browser bash scripts/test.sh
async def test_inspector_shows_calls_awaiting_approval_and_approves_or_rejects_them(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright

    executable = shutil.which("chromium")
    assert executable is not None
    PAID.clear()
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel([tool_call("pay", invoice="INV-7", amount=120), tool_call("pay", invoice="INV-8", amount=80),
                           "Paid INV-7.", "I did not pay INV-8."])
    app = create_app(Agent(model, tools=[pay], providers=[History(store)], name="payments"), keys=keys())
    viewer = create_app(None, keys=keys(), store=store, settings=ServeSettings(read_only=True))
    async with serving(app) as base, serving(viewer) as read_only:
        async with httpx.AsyncClient(base_url=base) as c:
            for session, text in (("alice", "Pay INV-7."), ("bob", "Pay INV-8.")):
                await c.post("/v1/sessions", json={"id": session}, headers=auth())
                result = (await c.post(f"/v1/sessions/{session}/runs", json={"input": text}, headers=auth())).json()
                assert result["stop_reason"] == "approval_required"
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1400, "height": 860})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # A read-only inspector shows what waits, with nothing to click.
            await page.goto(f"{read_only}/ui/?session=alice#key={KEYS['acme']}")
            waiting = page.locator("#approvals #pending li[data-call-id='call_1']")
            await waiting.wait_for()
            shown = await waiting.inner_text()
            assert "pay" in shown and '"invoice": "INV-7"' in shown and "needs approval for every call" in shown
            assert await page.locator("#approvals button").count() == 0
            assert "Read-only" in shown
            assert await page.locator("#transcript .badge.awaiting").count() == 1

            await page.goto(f"{base}/ui/?session=alice#key={KEYS['acme']}")
            await waiting.wait_for()
            assert await page.locator("#chat").is_visible()
            await waiting.locator("button.approve").click()
            await page.locator("#run-result", has_text="The run completed: Paid INV-7.").wait_for()
            await page.wait_for_selector("#approvals", state="hidden")
            assert PAID == ["INV-7"]
            transcript = page.locator("#transcript")
            await transcript.locator(".result", has_text="paid INV-7").wait_for()
            assert await transcript.locator(".badge.awaiting").count() == 0

            await page.click("#sessions li[data-session='bob']")
            rejected = page.locator("#approvals #pending li[data-call-id='call_2']")
            await rejected.wait_for()
            await rejected.locator("input.reason").fill("not this month")
            await rejected.locator("button.reject").click()
            await page.locator("#run-result", has_text="The run completed: I did not pay INV-8.").wait_for()
            await transcript.locator(".result.is-error", has_text="rejected it (not this month)").wait_for()
            assert PAID == ["INV-7"]
            assert errors == []
            await page.screenshot(path=str(tmp_path / "approvals.png"))
            await browser.close()
    await store.close()
