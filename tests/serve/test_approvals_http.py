"""Approvals over HTTP: a run stops at a call that needs approval, lists it, and a decision resumes it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2 as httpx
import pytest

from contextpipe import Agent
from contextpipe.approvals import arguments_digest
from contextpipe.models import ModelRequest
from contextpipe.providers import History
from contextpipe.serve import ServeSettings, create_app
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, Turn, tool_call
from helpers import PAID, balance, pay

from .conftest import auth, client, keys
from .test_http import sse

ARGUMENTS = '{"invoice": "INV-7", "amount": 120}'
DIGEST = arguments_digest("pay", ARGUMENTS)


@pytest.fixture(autouse=True)
def _no_payments() -> None:
    PAID.clear()


def payments(*replies: Any, store: MemoryStore | None = None) -> tuple[Any, ScriptedModel]:
    """Return a server whose model first asks to pay INV-7, then gives `replies`; and the model."""
    model = ScriptedModel([tool_call("pay", invoice="INV-7", amount=120), *replies])
    agent = Agent(model, tools=[pay, balance], providers=[History(store or MemoryStore())], name="payments")
    return create_app(agent, keys=keys()), model


async def stopped(c: httpx.AsyncClient, session: str = "s1") -> dict[str, Any]:
    """Create `session`, ask to pay, and return the run's result (stopped for approval)."""
    await c.post("/v1/sessions", json={"id": session}, headers=auth())
    response = await c.post(f"/v1/sessions/{session}/runs", json={"input": "Pay INV-7."}, headers=auth())
    assert response.status_code == 200, response.text
    return dict(response.json())


async def listed(c: httpx.AsyncClient, session: str = "s1") -> list[dict[str, Any]]:
    response = await c.get(f"/v1/sessions/{session}/approvals", headers=auth())
    assert response.status_code == 200, response.text
    return list(response.json()["pending_approvals"])


async def decide(c: httpx.AsyncClient, decisions: dict[str, Any], session: str = "s1",
                 **body: Any) -> httpx.Response:
    return await c.post(f"/v1/sessions/{session}/approvals", json={"decisions": decisions, **body}, headers=auth())


def told(request: ModelRequest) -> list[tuple[str, str, bool]]:
    return [(r.call_id, r.result, r.is_error) for m in request.messages for r in m.function_results]


async def test_a_run_stops_at_a_call_that_needs_approval_and_an_approval_resumes_it() -> None:
    app, model = payments("Paid INV-7.")
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "fresh"}, headers=auth())
        assert await listed(c, "fresh") == []
        result = await stopped(c)
        pending = {"call_id": "call_1", "tool_name": "pay", "arguments": ARGUMENTS,
                   "why": "tool 'pay' needs approval for every call", "digest": DIGEST,
                   "message_id": result["messages"][0]["id"], "client": False}
        assert (result["stop_reason"], result["pending_approvals"], PAID) == ("approval_required", [pending], [])
        assert await listed(c) == [pending]
        assert (await c.get("/v1/sessions/nobody/approvals", headers=auth())).status_code == 404
        assert (await c.get("/v1/sessions/s1/approvals", headers=auth("globex"))).status_code == 404

        resumed = await decide(c, {"call_1": {"decision": "approve", "digest": DIGEST}})
        assert resumed.status_code == 200, resumed.text
        body = resumed.json()
        assert (body["stop_reason"], body["text"], body["pending_approvals"]) == ("completed", "Paid INV-7.", [])
        assert [m["role"] for m in body["messages"]] == ["tool", "assistant"]
        assert body["messages"][0]["metadata"]["approvals"] == {"call_1": {"decision": "approved", "digest": DIGEST}}
        assert PAID == ["INV-7"] and len(model.requests) == 2
        assert told(model.requests[1]) == [("call_1", "paid INV-7", False)]
        assert await listed(c) == []
        log = (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"]
        assert [m["role"] for m in log] == ["user", "assistant", "tool", "assistant"]


async def test_approving_always_allows_the_tool_for_the_rest_of_the_session() -> None:
    app, model = payments(tool_call("pay", invoice="INV-8", amount=80), "Paid INV-7 and INV-8.")
    async with client(app) as c:
        await stopped(c)
        resumed = await decide(c, {"call_1": {"decision": "approve", "digest": DIGEST, "always": True}})
        assert (resumed.json()["stop_reason"], resumed.json()["text"]) == ("completed", "Paid INV-7 and INV-8.")
        assert PAID == ["INV-7", "INV-8"] and len(model.requests) == 3  # the second call was not asked about
        assert await listed(c) == []
        state = (await c.get("/v1/sessions/s1", headers=auth())).json()["state"]
        assert state["approvals"]["always"] == ["pay"]


async def test_deciding_some_of_the_waiting_calls_answers_those_and_stops_again_with_the_others() -> None:
    both = Turn(calls=(tool_call("pay", invoice="INV-7", amount=120).calls[0],
                       tool_call("pay", invoice="INV-8", amount=80).calls[0]))
    model = ScriptedModel([both, "Paid INV-7; INV-8 is not paid."])
    app = create_app(Agent(model, tools=[pay], providers=[History(MemoryStore())]), keys=keys())
    async with client(app) as c:
        first, second = (await stopped(c))["pending_approvals"]
        partly = (await decide(c, {first["call_id"]: {"decision": "approve", "digest": first["digest"]}})).json()
        assert (partly["stop_reason"], partly["pending_approvals"], PAID) == ("approval_required", [second], ["INV-7"])
        assert await listed(c) == [second] and len(model.requests) == 1
        done = (await decide(c, {second["call_id"]: {"decision": "reject", "digest": second["digest"]}})).json()
        assert (done["stop_reason"], done["text"], PAID) == ("completed", "Paid INV-7; INV-8 is not paid.", ["INV-7"])


async def test_a_rejection_is_answered_with_its_reason_and_the_model_reads_it() -> None:
    app, model = payments("I did not pay INV-7.")
    async with client(app) as c:
        await stopped(c)
        resumed = await decide(c, {"call_1": {"decision": "reject", "reason": "not this month", "digest": DIGEST}})
        assert resumed.status_code == 200, resumed.text
        assert (resumed.json()["text"], PAID) == ("I did not pay INV-7.", [])
        [(call_id, result, is_error)] = told(model.requests[-1])
        assert (call_id, is_error) == ("call_1", True)
        assert result.startswith("Error: the call to 'pay' was not run: the user rejected it (not this month).")
        assert resumed.json()["messages"][0]["metadata"]["approvals"]["call_1"] == {
            "decision": "rejected", "digest": DIGEST, "reason": "not this month"}
        assert await listed(c) == []


async def test_a_decision_for_other_arguments_is_a_409_and_nothing_runs() -> None:
    app, model = payments("Paid.")
    async with client(app) as c:
        result = await stopped(c)
        before = (await c.get("/v1/sessions/s1/messages", headers=auth())).json()
        other = arguments_digest("pay", '{"invoice": "INV-7", "amount": 12000}')
        for stream in (False, True):
            refused = await decide(c, {"call_1": {"decision": "approve", "digest": other}}, stream=stream)
            assert refused.status_code == 409, refused.text
            assert refused.headers["content-type"].startswith("application/json")
            error = refused.json()["error"]
            assert error["type"] == "ApprovalError"
            assert "made for other arguments than those of the call awaiting approval" in error["message"]
        assert PAID == [] and len(model.requests) == 1
        assert (await c.get("/v1/sessions/s1/messages", headers=auth())).json() == before
        assert await listed(c) == result["pending_approvals"]


async def test_a_decision_on_a_call_answered_already_is_a_409() -> None:
    app, _ = payments("Paid.")
    async with client(app) as c:
        await stopped(c)
        assert (await decide(c, {"call_1": {"decision": "approve"}})).status_code == 200
        for decision in ({"decision": "approve"}, {"decision": "reject", "reason": "no"}):
            again = await decide(c, {"call_1": decision})
            assert again.status_code == 409, again.text
            assert again.json()["error"]["type"] == "ApprovalError"
            assert "has been answered already" in again.json()["error"]["message"]
        unknown = await decide(c, {"call_9": {"decision": "approve"}})
        assert (unknown.status_code, unknown.json()["error"]["type"]) == (409, "ApprovalError")
        assert "is not awaiting approval" in unknown.json()["error"]["message"]
        assert PAID == ["INV-7"]


async def test_two_deciders_at_once_one_wins_and_the_other_gets_409() -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_answer(request: ModelRequest) -> str:
        entered.set()  # the first decider's run holds the session from here on
        await release.wait()
        return "Paid INV-7."

    app, _ = payments(slow_answer)
    async with client(app) as c:
        await stopped(c)
        first = asyncio.create_task(decide(c, {"call_1": {"decision": "approve", "digest": DIGEST}}))
        await entered.wait()
        busy = await decide(c, {"call_1": {"decision": "reject", "reason": "no", "digest": DIGEST}})
        assert (busy.status_code, busy.json()["error"]["type"]) == (409, "SessionBusy")
        patient = asyncio.create_task(decide(c, {"call_1": {"decision": "reject", "digest": DIGEST}}, wait=30))
        release.set()
        assert (await first).json()["text"] == "Paid INV-7."
        late = await patient
        assert (late.status_code, late.json()["error"]["type"]) == (409, "ApprovalError")
        assert "has been answered already" in late.json()["error"]["message"]
        assert PAID == ["INV-7"]


async def test_a_streamed_run_sends_approval_required_and_a_streamed_decision_resumes_it() -> None:
    app, _ = payments("Paid INV-7.")
    async with client(app) as c:
        await c.post("/v1/sessions", json={"id": "s1"}, headers=auth())
        response = await c.post("/v1/sessions/s1/runs", json={"input": "Pay INV-7.", "stream": True}, headers=auth())
        events = sse(response.text)
        assert [name for name, _ in events] == ["step_persisted", "approval_required", "done"]
        [pending] = events[1][1]["pending_approvals"]
        assert (pending["call_id"], pending["tool_name"], pending["digest"]) == ("call_1", "pay", DIGEST)
        assert events[2][1]["stop_reason"] == "approval_required"
        assert events[2][1]["pending_approvals"] == [pending]

        response = await c.post("/v1/sessions/s1/approvals", headers={**auth(), "Accept": "text/event-stream"},
                                json={"decisions": {"call_1": {"decision": "approve", "digest": pending["digest"]}}})
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse(response.text)
        names = [name for name, _ in events]
        assert names[:3] == ["tool_call_started", "tool_call_finished", "step_persisted"]
        assert "approval_required" not in names and names[-1] == "done"
        assert (events[-1][1]["stop_reason"], events[-1][1]["text"], PAID) == ("completed", "Paid INV-7.", ["INV-7"])


async def test_runs_take_decisions_too_and_refuse_input_while_calls_wait() -> None:
    app, model = payments("Not paid; your balance is 1200 EUR.")
    async with client(app) as c:
        await stopped(c)
        refused = await c.post("/v1/sessions/s1/runs", json={"input": "What is my balance?"}, headers=auth())
        assert (refused.status_code, refused.json()["error"]["type"]) == (409, "ApprovalError")
        assert "await approval, and new input may not come before they are answered" in \
            refused.json()["error"]["message"]
        response = await c.post("/v1/sessions/s1/runs", headers=auth(), json={
            "input": "No, and what is my balance?", "approvals": {"call_1": {"decision": "reject", "reason": "no"}}})
        assert response.status_code == 200, response.text
        assert response.json()["text"] == "Not paid; your balance is 1200 EUR." and PAID == []
        log = (await c.get("/v1/sessions/s1/messages", headers=auth())).json()["messages"]
        assert [m["role"] for m in log] == ["user", "assistant", "tool", "user", "assistant"]
        assert model.requests[-1].messages[-1].text == "No, and what is my balance?"


@pytest.mark.parametrize(("body", "needle"), [
    ({}, "decisions: Field required"),
    ({"decisions": {}}, "decisions: Dictionary should have at least 1 item"),
    ({"decisions": {"call_1": {"decision": "maybe"}}}, "decisions.call_1"),
    ({"decisions": {"call_1": {}}}, "decisions.call_1"),
    ({"decisions": {"call_1": {"decision": "approve", "reason": "ok"}}}, "decisions.call_1.reason: unknown field"),
    ({"decisions": {"call_1": {"decision": "reject", "always": True}}}, "decisions.call_1.always: unknown field"),
    ({"decisions": {"call_1": {"decision": "approve", "digest": "abc"}}}, "must be the digest of the pending"),
    ({"decisions": {"call_1": "approve"}}, "decisions.call_1"),
    ({"decisions": {"call_1": {"decision": "approve"}}, "input": "hi"}, "input: unknown field"),
])
async def test_malformed_decisions_are_a_400(body: dict[str, Any], needle: str) -> None:
    app, model = payments()
    async with client(app) as c:
        await stopped(c)
        response = await c.post("/v1/sessions/s1/approvals", json=body, headers=auth())
        assert (response.status_code, response.json()["error"]["type"]) == (400, "BadRequest"), response.text
        assert needle in response.json()["error"]["message"]
        bad_run = await c.post("/v1/sessions/s1/runs", headers=auth(), json={
            "input": None, "approvals": {"call_1": {"decision": "approve", "always": "yes"}}})
        assert bad_run.status_code == 400, bad_run.text
        assert PAID == [] and len(model.requests) == 1


async def test_a_read_only_server_lists_calls_awaiting_approval_but_takes_no_decision() -> None:
    store = MemoryStore()
    app, _ = payments(store=store)
    async with client(app) as c:
        pending = (await stopped(c))["pending_approvals"]
    viewer = create_app(None, keys=keys(), store=store, settings=ServeSettings(read_only=True))
    async with client(viewer) as c:
        assert await listed(c) == pending
        refused = await decide(c, {"call_1": {"decision": "approve"}})
        assert (refused.status_code, refused.json()["error"]["type"]) == (405, "ReadOnly")
        assert refused.headers["allow"] == "GET"
    assert PAID == []


# --- AG-UI: calls awaiting approval are the protocol's interrupts, a resume answers them ------------


def agui_events(response: httpx.Response) -> list[Any]:
    """Return the AG-UI events of a response, each validated by the protocol's own models."""
    import pydantic
    from ag_ui import core

    assert response.status_code == 200, response.text
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(core.Event)
    return [adapter.validate_json(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def agui_run(run: str, messages: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"threadId": "t1", "runId": run, "state": {}, "tools": [], "context": [], "forwardedProps": {},
            "messages": messages, **more}


ASK = {"id": "u1", "role": "user", "content": "Pay INV-7."}


async def interrupted(c: httpx.AsyncClient) -> Any:
    """Ask to pay over AG-UI; return the run's RUN_FINISHED event, which carries the interrupt."""
    finished = agui_events(await c.post("/v1/ag-ui", json=agui_run("r1", [ASK]), headers=auth()))[-1]
    assert finished.type.value == "RUN_FINISHED"
    return finished


async def test_an_agui_run_ends_with_an_interrupt_per_call_awaiting_approval() -> None:
    app, _ = payments("Paid INV-7.")
    async with client(app) as c:
        finished = await interrupted(c)
        [pending] = await listed(c, "t1")
    [interrupt] = finished.outcome.interrupts
    assert finished.outcome.type == "interrupt"
    assert (interrupt.reason, interrupt.tool_call_id, interrupt.id) == ("tool_approval", pending["call_id"],
                                                                         pending["call_id"])
    assert interrupt.metadata == {"tool_name": "pay", "arguments": ARGUMENTS, "digest": DIGEST}
    assert interrupt.message and interrupt.response_schema["required"] == ["approved"]
    assert finished.result["stop_reason"] == "approval_required"
    assert PAID == []


@pytest.mark.parametrize("always", [False, True])
async def test_an_agui_resume_that_approves_runs_the_call_and_the_run_goes_on(always: bool) -> None:
    app, model = payments("Paid INV-7.")
    async with client(app) as c:
        call = (await interrupted(c)).outcome.interrupts[0].id
        history = [ASK, {"id": "a1", "role": "assistant", "toolCalls": [{"id": call, "type": "function", "function": {
            "name": "pay", "arguments": ARGUMENTS}}]}]  # the whole history, as AG-UI clients send it
        resume = [{"interruptId": call, "status": "resolved",
                   "payload": {"approved": True, "digest": DIGEST, "always": always}}]
        events = agui_events(await c.post("/v1/ag-ui", json=agui_run("r2", history, resume=resume), headers=auth()))
        state = (await c.get("/v1/sessions/t1", headers=auth())).json()["state"]
    types = [e.type.value for e in events]
    assert "TOOL_CALL_RESULT" in types and types[-1] == "RUN_FINISHED"
    assert events[-1].outcome is None and events[-1].result["text"] == "Paid INV-7."
    assert PAID == ["INV-7"]
    assert ("pay" in state.get("approvals", {}).get("always", [])) is always  # "always" is kept in the session
    assert told(model.requests[-1]) == [(call, "paid INV-7", False)]


async def test_an_agui_resume_that_rejects_or_cancels_answers_the_call_with_the_reason() -> None:
    for entry, reason in (({"status": "resolved", "payload": {"approved": False, "reason": "wrong amount"}},
                           "wrong amount"), ({"status": "cancelled"}, "the user cancelled the call")):
        PAID.clear()
        app, model = payments("I did not pay.")
        async with client(app) as c:
            call = (await interrupted(c)).outcome.interrupts[0].id
            events = agui_events(await c.post("/v1/ag-ui", json=agui_run("r2", [], resume=[
                {"interruptId": call, **entry}]), headers=auth()))
        assert events[-1].result["text"] == "I did not pay."
        assert PAID == []
        [(call_id, result, is_error)] = told(model.requests[-1])
        assert call_id == call and reason in result and is_error


async def test_an_agui_resume_that_cannot_apply_is_refused_before_its_stream() -> None:
    app, _ = payments("Paid INV-7.")
    async with client(app) as c:
        call = (await interrupted(c)).outcome.interrupts[0].id
        unread = await c.post("/v1/ag-ui", json=agui_run("r2", [], resume=[
            {"interruptId": call, "status": "resolved", "payload": {"ok": True}}]), headers=auth())
        assert (unread.status_code, unread.json()["error"]["type"]) == (409, "ApprovalError")
        assert "resume[0].payload: answer a tool approval with" in unread.json()["error"]["message"]
        unknown = await c.post("/v1/ag-ui", json=agui_run("r2", [], resume=[
            {"interruptId": "call_nope", "status": "resolved", "payload": {"approved": True}}]), headers=auth())
        assert (unknown.status_code, unknown.json()["error"]["type"]) == (409, "ApprovalError")
        twice = await c.post("/v1/ag-ui", json=agui_run("r2", [], resume=[
            {"interruptId": call, "status": "resolved", "payload": {"approved": False}},
            {"interruptId": call, "status": "resolved", "payload": {"approved": True}}]), headers=auth())
        assert (twice.status_code, twice.json()["error"]["type"]) == (409, "ApprovalError")
        assert "answered twice" in twice.json()["error"]["message"]
        for payload, field in (({"approved": True, "always": "yes"}, "always"),
                               ({"approved": False, "reason": 7}, "reason"),
                               ({"approved": True, "digest": "abc"}, "digest")):
            bad = await c.post("/v1/ag-ui", json=agui_run("r2", [], resume=[
                {"interruptId": call, "status": "resolved", "payload": payload}]), headers=auth())
            assert bad.status_code == 409 and f"payload.{field}" in bad.json()["error"]["message"], payload
        nowhere = await c.post("/v1/ag-ui", json={**agui_run("r2", [], resume=[
            {"interruptId": call, "status": "resolved", "payload": {"approved": True}}]), "threadId": "nope"},
            headers=auth())
        assert nowhere.status_code == 404
        assert (await c.get("/v1/sessions/nope", headers=auth())).status_code == 404  # nothing was made
        other = "0" * 64
        wrong = await c.post("/v1/ag-ui", json=agui_run("r2", [], resume=[
            {"interruptId": call, "status": "resolved", "payload": {"approved": True, "digest": other}}]),
            headers=auth())
        assert (wrong.status_code, wrong.json()["error"]["type"]) == (409, "ApprovalError")
    assert PAID == []
