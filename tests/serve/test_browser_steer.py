"""Steering a conversation in the inspector, in a real browser (Debian's headless Chromium, driven by Playwright):
rewind, fork and regenerate buttons, rewound messages, the queue, and the prompt-cache badge of a model call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from contextpipe import Agent, Durability
from contextpipe.exchanges import late_result
from contextpipe.messages import FunctionCall, FunctionResult, Message
from contextpipe.models import ModelRequest, ModelResponse
from contextpipe.models.base import Usage
from contextpipe.pipeline import RunContext
from contextpipe.providers import ContextProvider, History
from contextpipe.rewind import MARKER_KEY, is_marker
from contextpipe.serve import create_app
from contextpipe.stores import SQLiteStore
from contextpipe.testing import ScriptedModel, tool_call
from contextpipe.testing.scripted import Turn
from helpers import lookup_location_code

from .conftest import KEYS, GateModel, auth, keys, make_app, serving
from .test_browser_views import browser_page
from .test_session_tools import Gate

pytestmark = pytest.mark.extra("browser")  # CONTEXTPIPE_TEST_EXTRAS=browser bash scripts/test.sh


async def texts(store: SQLiteStore, session: str) -> list[str]:
    return [m.text for m in (await store.load("acme", session)).messages]


async def test_rewind_regenerate_and_fork_buttons_steer_the_log_and_rewound_messages_stay_shown(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel(["Paris.", "Rome.", "Lyon, then."])
    app = create_app(Agent(model, providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page:
        async with httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": "s1"})
            for text in ("A city?", "Another?"):
                await c.post("/v1/sessions/s1/runs", json={"input": text})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        transcript = page.locator("#transcript")
        await transcript.locator("li.msg").nth(3).wait_for()
        assert await transcript.locator("button.rewind:enabled").count() == 3  # not on the view's last message
        assert await transcript.locator("li.msg[data-seq='4'] button.rewind").is_disabled()
        assert await transcript.locator("li.msg[data-seq='4'] button.regenerate").count() == 1
        assert await transcript.locator("button.regenerate").count() == 1

        await transcript.locator("li.msg[data-seq='2'] button.rewind").click()
        await transcript.locator(".marker.rewind").wait_for()
        log = (await store.load("acme", "s1")).messages
        assert len(log) == 5 and is_marker(log[-1]) and log[-1].metadata[MARKER_KEY]["to"] == 2
        assert await transcript.locator("li.msg").count() == 4  # rewound, never hidden
        for seq in ("3", "4"):
            rewound = transcript.locator(f"li.msg[data-seq='{seq}']")
            assert await rewound.get_attribute("class") == f"msg {'user' if seq == '3' else 'assistant'} rewound"
            assert await rewound.locator(".badge.rewound").inner_text() == "rewound"
            assert await rewound.is_visible() and await rewound.locator("button").count() == 0
            style = await rewound.locator(".text").evaluate("n => getComputedStyle(n).textDecorationLine")
            assert "line-through" in style
        assert "after #2" in await transcript.locator(".marker.rewind").inner_text()

        await transcript.locator("li.msg[data-seq='2'] button.regenerate").click()  # "Paris." is the last reply now
        await transcript.locator("li.msg[data-seq='7']", has_text="Lyon, then.").wait_for()
        log = (await store.load("acme", "s1")).messages
        assert [m.metadata[MARKER_KEY]["to"] for m in log if is_marker(m)] == [2, 1]
        assert [m.text for m in model.requests[-1].messages] == ["A city?"]  # run again from the user message
        assert "rewound" in (await transcript.locator("li.msg[data-seq='2']").get_attribute("class") or "")

        await transcript.locator("li.msg[data-seq='7'] button.fork").click()
        await page.wait_for_function("document.querySelector('#session-title').textContent.startsWith('s-')")
        forked = await page.locator("#session-title").inner_text()
        assert await texts(store, forked) == ["A city?", "Lyon, then."]  # the view up to #7, nothing rewound
        assert await texts(store, "s1") == [m.text for m in log]  # the source is left as it was
        await transcript.locator("li.msg").nth(1).wait_for()
        assert await transcript.locator("li.msg").count() == 2 and await transcript.locator(".rewound").count() == 0
        assert f"session={forked}" in page.url
        await page.locator(f"#sessions li[data-session='{forked}']").wait_for()
    await store.close()


async def test_a_double_click_steers_once_and_the_buttons_keep_their_places(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel(["Paris.", "Rome.", "Lyon, then.", "Once more."])
    app = create_app(Agent(model, providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        for text in ("A city?", "Another?"):
            await c.post("/v1/sessions/s1/runs", json={"input": text})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        posted: list[str] = []  # the steering requests the page sent
        page.on("request", lambda r: r.method == "POST" and posted.append(r.url.rsplit("/", 1)[-1]))
        transcript = page.locator("#transcript")
        idle = page.locator("#transcript:not(.steering)")  # no action in flight, no run streaming

        async def markers() -> list[int]:
            return [m.metadata[MARKER_KEY]["to"] for m in (await store.load("acme", "s1")).messages if is_marker(m)]

        await transcript.locator("li.msg[data-seq='4'] button.regenerate").dblclick()
        await transcript.locator("li.msg:not(.streaming)", has_text="Lyon, then.").wait_for()
        await idle.wait_for()
        assert posted == ["rewind", "runs"]
        assert await markers() == [3] and len(model.requests) == 3  # one rewind, one model call more

        rewind = transcript.locator("li.msg[data-seq='1'] button.rewind")
        box = await rewind.bounding_box()
        assert box is not None
        await rewind.dblclick()
        await transcript.locator(".marker.rewind").nth(1).wait_for()
        await idle.wait_for()
        assert await rewind.is_disabled()  # #1 is the view's last now: its Rewind stays in its place, disabled
        await page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)  # a late third click
        await idle.wait_for()
        assert posted == ["rewind", "runs", "rewind"] and await markers() == [3, 1]
        assert [s["id"] for s in (await c.get("/v1/sessions")).json()["sessions"]] == ["s1"]  # no fork
        assert await page.locator("#session-error").inner_text() == ""
    await store.close()


async def test_nothing_is_sent_while_a_regenerate_waits_for_its_rewind_and_its_run_takes_queued_messages(
        tmp_path: Path) -> None:
    """Enter in the chat between Regenerate's rewind and its run starts no run of its own (the text stays typed);
    once Regenerate's run streams, Enter queues, as during any run."""
    store = SQLiteStore(tmp_path / "ui.db")
    model = HeldModel("Paris.", "Lyon, then.", "Nice.")  # (the second call, Regenerate's, is held)
    app = create_app(Agent(model, providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        await c.post("/v1/sessions/s1/runs", json={"input": "A city?"})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        posted: list[str] = []
        page.on("request", lambda r: r.method == "POST" and posted.append(r.url.rsplit("/", 1)[-1]))
        reached, release = asyncio.Event(), asyncio.Event()

        async def hold(route: Any) -> None:  # the rewind waits here until the chat has been tried
            reached.set()
            await release.wait()
            await route.continue_()

        await page.route("**/rewind", hold)
        transcript = page.locator("#transcript")
        try:
            await transcript.locator("li.msg[data-seq='2'] button.regenerate").click()
            await reached.wait()
            await page.locator("#chat-input").fill("Another city?")
            await page.locator("#chat-input").press("Enter")
            await page.evaluate("() => new Promise((done) => setTimeout(done, 0))")  # (the submit handler has run)
            assert posted == ["rewind"] and await page.locator("#chat-input").input_value() == "Another city?"
            notice = await page.locator("#chat-error").inner_text()
            assert notice.startswith("Not sent: a rewind, fork or regenerate is in progress.")
            release.set()
            await model.entered.wait()  # Regenerate's run streams, its model call held
            await page.locator("#chat-send", has_text="Queue").wait_for()
            await page.select_option("#chat-queue", "next")
            await page.locator("#chat-input").press("Enter")
            await page.locator("#queued li[data-when='next']", has_text="Another city?").wait_for()
            model.release.set()
            await transcript.locator("li.msg:not(.streaming)", has_text="Lyon, then.").wait_for()
            await asyncio.gather(*app.state.api.runs.background)  # the server's run of the queued message
        finally:  # a failed check must not leave the rewind or the run held
            release.set()
            model.release.set()
        assert posted == ["rewind", "runs", "runs"] and len(model.requests) == 3  # Regenerate's run, the queued one
        assert [m.text for m in (await store.load("acme", "s1")).messages if m.text][-3:] == [
            "Lyon, then.", "Another city?", "Nice."]
        assert await page.locator("#chat-error").inner_text() == ""
    await store.close()


async def test_regenerate_answers_the_users_message_not_a_late_tool_result(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel(["Paris.", "Lyon, then."])
    app = create_app(Agent(model, providers=[History(store)]), keys=keys())
    async with serving(app) as base, browser_page() as page:
        async with httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": "s1"})
            await c.post("/v1/sessions/s1/runs", json={"input": "A city?"})
        late = late_result(FunctionCall("c1", "build_report", "{}"), FunctionResult("c1", "report ready"))
        await store.append("acme", "s1", [late, Message.assistant("Noted: the report is ready.")])
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        regenerate = page.locator("#transcript li.msg[data-seq='4'] button.regenerate")
        assert await regenerate.get_attribute("title") == "Rewind to #1 and run again"  # #3 is the tool's output
        await regenerate.click()
        await page.locator("#transcript li.msg:not(.streaming)", has_text="Lyon, then.").wait_for()
        log = (await store.load("acme", "s1")).messages
        assert [m.metadata[MARKER_KEY]["to"] for m in log if is_marker(m)] == [1]
        assert [m.text for m in model.requests[-1].messages] == ["A city?"]
    await store.close()


async def test_a_refused_rewind_shows_the_servers_message_and_writes_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    model = GateModel()
    app = make_app(store, model)
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        await c.post("/v1/sessions/s1/runs", json={"input": "Hello"})
        model.gated = True
        running = asyncio.create_task(c.post("/v1/sessions/s1/runs", json={"input": "Take your time."}, timeout=120))
        try:
            await model.entered.wait()  # another client's run holds the session
            await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
            await page.locator("#transcript li.msg[data-seq='1'] button.rewind").click()
            refused = await c.post("/v1/sessions/s1/rewind", json={"to": 1})
            assert refused.status_code == 409
            shown = page.locator("#session-error", has_text=refused.json()["error"]["message"])
            await shown.wait_for()
            assert (await shown.inner_text()).startswith("Could not rewind: ")
            assert not any(is_marker(m) for m in (await store.load("acme", "s1")).messages)
        finally:
            model.release.set()
        assert (await running).status_code == 200
    await store.close()


class HeldModel(ScriptedModel):
    """A scripted model whose second call waits for `release` (the test's progress signal), `entered` set first."""

    def __init__(self, *script: Any) -> None:
        super().__init__(script)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def _hold(self) -> None:
        if len(self.requests) == 1:
            self.entered.set()
            await self.release.wait()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        await self._hold()
        return await super().complete(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        await self._hold()
        async for event in super().stream(request):
            yield event


async def test_messages_sent_during_a_run_are_listed_as_queued_until_the_stream_says_delivered(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ui.db")
    gate = Gate()
    model = HeldModel(tool_call("slow_lookup", city="Suzhou", call_id="c1"), "Suzhou is 0512, in metric units.",
                      "Sent by e-mail.")
    agent = Agent(model, tools=[gate.tool], providers=[History(store)], durability=Durability(store_traces=True))
    app = create_app(agent, keys=keys())
    async with serving(app) as base, browser_page() as page, httpx.AsyncClient(base_url=base, headers=auth()) as c:
        await c.post("/v1/sessions", json={"id": "s1"})
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        await page.wait_for_selector("#chat", state="visible")
        assert not await page.locator("#chat-queue").is_visible()
        await page.fill("#chat-input", "Code of Suzhou?")
        await page.press("#chat-input", "Enter")
        try:
            await gate.entered.wait()  # the inspector's run holds the session, inside its tool call
            for when, text in (("asap", "Use metric units."), ("next", "E-mail it to me.")):
                await page.select_option("#chat-queue", when)
                await page.fill("#chat-input", text)
                await page.press("#chat-input", "Enter")
                await page.locator(f"#queued li[data-when='{when}']", has_text=text).wait_for()
            assert await page.locator("#queued .badge.when").all_inner_texts() == ["asap", "next"]
            listed = (await c.get("/v1/sessions/s1/queue")).json()["queued"]
            assert [(q["when"], q["text"]) for q in listed] == [("asap", "Use metric units."),
                                                                ("next", "E-mail it to me.")]
            assert {"Use metric units.", "E-mail it to me."}.isdisjoint(await texts(store, "s1"))  # not in the log yet

            gate.release.set()
            await model.entered.wait()  # the asap message went in; the run's next model call is held, the stream open
            await page.locator("#queued li[data-when='asap']").wait_for(state="detached")
            assert await page.locator("#queued li[data-when='next']").count() == 1
            model.release.set()
            await page.locator("#transcript li.msg.assistant", has_text="in metric units").wait_for()
            await asyncio.gather(*app.state.api.runs.background)  # the server's run of the next message
            assert await texts(store, "s1") == [
                "Code of Suzhou?", "", "", "Use metric units.",  # (a call, its result)
                "Suzhou is 0512, in metric units.", "E-mail it to me.", "Sent by e-mail."]
            await page.locator("#transcript li.msg", has_text="Sent by e-mail.").wait_for()  # its poll saw the new run
        finally:  # a failed check must not leave the run held
            gate.release.set()
            model.release.set()
        await page.wait_for_selector("#queue", state="hidden")
    await store.close()


class PerRun(ContextProvider):
    """Instructions that change every run: the prompt cache of each run's first call collapses."""

    def __init__(self) -> None:
        super().__init__("facts")
        self.runs = 0

    async def before_run(self, ctx: RunContext) -> None:
        self.runs += 1
        ctx.add_instructions(f"Run {self.runs}. " + "Known fact. " * 400)


async def test_a_model_call_whose_prompt_cache_collapsed_gets_a_badge_naming_the_cause(tmp_path: Path) -> None:
    cached = Usage(3000, 10, cache_read_tokens=2000)
    store = SQLiteStore(tmp_path / "ui.db")
    model = ScriptedModel([Turn("one", usage=cached),
                           tool_call("lookup_location_code", city="Suzhou") + Turn(usage=cached),
                           Turn("two", usage=cached)])
    agent = Agent(model, tools=[lookup_location_code], providers=[History(store), PerRun()],
                  durability=Durability(store_traces=True))
    async with serving(create_app(agent, keys=keys())) as base, browser_page() as page:
        async with httpx.AsyncClient(base_url=base, headers=auth()) as c:
            await c.post("/v1/sessions", json={"id": "s1"})
            for text in ("hello", "again"):
                await c.post("/v1/sessions/s1/runs", json={"input": text})
            traces = (await c.get("/v1/sessions/s1/traces")).json()["traces"]
        # Call 2 (run 2's first) lost the prefix of run 1; call 3 repeats call 2's; call 1 has nothing to compare.
        assert [t["cache"] and t["cache"]["collapsed"] for t in traces] == [None, True, False]
        lost = traces[1]["cache"]["lost_tokens"]
        await page.goto(f"{base}/ui/?session=s1#key={KEYS['acme']}")
        await page.locator("#chart g.call").nth(2).wait_for()
        marks = page.locator("#transcript .marker.callmark")
        assert [await m.locator(".badge.cache").count() for m in await marks.all()] == [0, 1, 0]
        badge = f"cache collapsed: instructions changed, {lost:,} prefix tokens lost"
        assert await marks.nth(1).locator(".badge.cache").inner_text() == badge
        for call, shown in ((0, False), (1, True), (2, False)):
            await page.locator("#chart g.call").nth(call).click()
            await page.locator("#call-detail h3", has_text=f"Model call {call + 1}").wait_for()
            assert await page.locator("#cache-note").count() == (1 if shown else 0), call
        await page.locator("#chart g.call").nth(1).click()
        note = await page.locator("#cache-note").inner_text()
        assert badge in note and "instructions of 'facts' changed" in note and "2,000 cached tokens" in note
    await store.close()
