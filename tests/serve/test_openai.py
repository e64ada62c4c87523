"""The official ``openai`` SDK talks to a served agent: Chat Completions and Responses, streamed and not.

Each test runs a real uvicorn server on 127.0.0.1 and drives it with ``openai.AsyncOpenAI``, as an
application (or Open WebUI, LibreChat) would; the session log is then read back from the store to
check that every turn was kept once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import openai
import pytest

from contextpipe import Agent, tool
from contextpipe.providers import History
from contextpipe.serve import ApiKeys, create_app
from contextpipe.stores import MemoryStore
from contextpipe.testing import ScriptedModel, tool_call

from .conftest import KEYS, GateModel, keys, make_app, serving


@contextlib.asynccontextmanager
async def openai_clients(app: Any) -> AsyncIterator[Callable[..., openai.AsyncOpenAI]]:
    """Serve `app`; yield a maker of SDK clients for it (``sdk(tenant)``, ``sdk(api_key=...)``), closed at the end."""
    made: list[openai.AsyncOpenAI] = []

    def sdk(tenant: str = "acme", *, api_key: str | None = None) -> openai.AsyncOpenAI:
        made.append(openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=api_key or KEYS[tenant], max_retries=0))
        return made[-1]

    async with serving(app) as base:
        try:
            yield sdk
        finally:
            for client in made:
                await client.close()


async def log(store: MemoryStore, session: str, tenant: str = "acme") -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in (await store.load(tenant, session)).messages]


async def test_the_agent_is_listed_as_the_model_and_no_other_model_is_served() -> None:
    async with openai_clients(make_app(MemoryStore(), GateModel())) as sdk:
        client = sdk()
        assert [m.id for m in (await client.models.list()).data] == ["test"]
        assert (await client.models.retrieve("test")).id == "test"
        with pytest.raises(openai.NotFoundError, match="send model='test'"):
            await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("gpt-4o")


async def test_chat_completions_keep_a_multi_turn_conversation_in_one_session_once() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        client = sdk()
        history: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        for turn in ("how are you", "bye"):
            answer = await client.chat.completions.create(model="test", messages=history,
                                                          extra_headers={"X-Session-Id": "chat-1"})
            history += [{"role": "assistant", "content": answer.choices[0].message.content},
                        {"role": "user", "content": turn}]
        last = await client.chat.completions.create(model="test", messages=history,
                                                    extra_headers={"X-Session-Id": "chat-1"})
    assert last.object == "chat.completion" and last.model == "test"
    assert last.choices[0].finish_reason == "stop"
    assert last.choices[0].message.content == "reply 3 to bye"
    assert last.usage is not None and (last.usage.prompt_tokens, last.usage.completion_tokens) == (10, 4)
    # The client sent the whole conversation each turn; the session holds each message once.
    assert await log(store, "chat-1") == [
        ("system", "Be brief."), ("user", "hi"), ("assistant", "reply 1 to hi"),
        ("user", "how are you"), ("assistant", "reply 2 to how are you"), ("user", "bye"),
        ("assistant", "reply 3 to bye")]


async def test_a_chat_without_a_session_header_starts_a_session_holding_its_conversation() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        raw = await sdk().chat.completions.with_raw_response.create(model="test", messages=[
            {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "salut"}, {"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}])
        answer = raw.parse()
    session = raw.headers["x-session-id"]
    assert answer.choices[0].message.content == "reply 1 to what is this?"
    assert answer.model_extra is not None and answer.model_extra["contextpipe"]["session_id"] == session
    assert await log(store, session) == [("system", "Answer in French."), ("user", "hi"), ("assistant", "salut"),
                                         ("user", "what is this?"), ("assistant", "reply 1 to what is this?")]
    image = (await store.load("acme", session)).messages[3].parts[1]
    assert (image.kind, getattr(image, "uri", None), getattr(image, "media_type", None)) == (
        "uri", "https://example.com/cat.png", "image/png")


async def test_a_streamed_chat_sends_the_same_answer_and_its_usage() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        client = sdk()
        chunks = [c async for c in await client.chat.completions.create(
            model="test", messages=[{"role": "user", "content": "stream me"}], stream=True,
            stream_options={"include_usage": True}, extra_headers={"X-Session-Id": "s"})]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "reply 1 to stream me"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 2  # word by word
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 14
    assert len({c.id for c in chunks}) == 1
    assert await log(store, "s") == [("user", "stream me"), ("assistant", "reply 1 to stream me")]


async def test_responses_continue_from_the_previous_response_and_refuse_a_branch() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        client = sdk()
        first = await client.responses.create(model="test", input="hi", instructions="Be brief.")
        second = await client.responses.create(model="test", input="more", previous_response_id=first.id,
                                               instructions="Be brief.")
        third = await client.responses.create(model="test", previous_response_id=second.id, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "and then"}]}])
        with pytest.raises(openai.ConflictError, match="not the latest"):
            await client.responses.create(model="test", input="branch", previous_response_id=first.id)
    assert (first.object, first.status, first.output_text) == ("response", "completed", "reply 1 to hi")
    assert third.output_text == "reply 3 to and then" and third.previous_response_id == second.id
    assert third.usage is not None and third.usage.total_tokens == 14
    session = third.model_extra["contextpipe"]["session_id"] if third.model_extra else None
    assert session is not None and session == first.model_extra["contextpipe"]["session_id"]  # type: ignore[index]
    # The same instructions are kept once; the refused branch stored nothing.
    assert await log(store, session) == [
        ("system", "Be brief."), ("user", "hi"), ("assistant", "reply 1 to hi"), ("user", "more"),
        ("assistant", "reply 2 to more"), ("user", "and then"), ("assistant", "reply 3 to and then")]


async def test_a_conversation_id_names_the_session() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        client = sdk()
        await client.responses.create(model="test", input="one", conversation="conv-1")
        answer = await client.responses.create(model="test", input="two", conversation={"id": "conv-1"})
        with pytest.raises(openai.ConflictError, match="name it once"):
            await client.responses.create(model="test", input="x", conversation="conv-1",
                                          extra_headers={"X-Session-Id": "other"})
    assert answer.output_text == "reply 2 to two"
    assert await log(store, "conv-1") == [("user", "one"), ("assistant", "reply 1 to one"), ("user", "two"),
                                          ("assistant", "reply 2 to two")]


async def test_streamed_responses_work_with_the_sdk_s_stream_helper_and_raw_events() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        client = sdk()
        events = [e async for e in await client.responses.create(model="test", input="raw", stream=True)]
        async with client.responses.stream(model="test", input="helper",
                                           previous_response_id=events[-1].response.id) as stream:
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text.strip() == "reply 1 to raw"
    assert "".join(deltas) == final.output_text and final.output_text.strip() == "reply 2 to helper"
    assert final.id != events[-1].response.id and final.previous_response_id == events[-1].response.id


@tool
def get_weather(city: str) -> str:
    """Return the weather in a city."""
    return f"sunny in {city}"


def weather_app(store: MemoryStore) -> Any:
    model = ScriptedModel([tool_call("get_weather", city="Oslo"), "It is sunny in Oslo."] * 2)
    agent = Agent(model, tools=[get_weather], providers=[History(store)], name="weather")
    return create_app(agent, keys=keys())


@pytest.mark.parametrize("stream", [False, True])
async def test_tools_run_on_the_server_and_the_client_gets_the_answer(stream: bool) -> None:
    store = MemoryStore()
    async with openai_clients(weather_app(store)) as sdk:
        client = sdk()
        messages: Any = [{"role": "user", "content": "Weather in Oslo?"}]
        headers = {"X-Session-Id": "w"}
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model="weather", messages=messages, stream=True, extra_headers=headers)]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            answer = await client.chat.completions.create(model="weather", messages=messages, extra_headers=headers)
            text = answer.choices[0].message.content or ""
            assert answer.choices[0].message.tool_calls is None  # the client is not asked to run anything
        response = await client.responses.create(model="weather", input="And now?", conversation="w2")
    assert text == "It is sunny in Oslo." and response.output_text == "It is sunny in Oslo."
    assert [m.role for m in (await store.load("acme", "w")).messages] == ["user", "assistant", "tool", "assistant"]


async def test_what_cannot_mean_anything_here_is_refused_saying_why() -> None:
    async with openai_clients(make_app(MemoryStore(), GateModel())) as sdk:
        client = sdk()
        hi: Any = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError, match="tools run on the server"):
            await client.chat.completions.create(model="test", messages=hi, tools=[{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object"}}}])
        with pytest.raises(openai.BadRequestError, match="messages\\[1\\]: tool calls and their results"):
            await client.chat.completions.create(model="test", messages=[
                *hi, {"role": "tool", "tool_call_id": "c1", "content": "x"}])
        with pytest.raises(openai.ConflictError, match="must end with the user's message"):
            await client.chat.completions.create(model="test", messages=[*hi, {"role": "assistant", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match="input\\[0\\]: an input item of type 'function_call_output'"):
            await client.responses.create(model="test", input=[
                {"type": "function_call_output", "call_id": "c1", "output": "x"}])
        with pytest.raises(openai.BadRequestError, match="store"):
            await client.responses.create(model="test", input="hi", store=False)
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await client.responses.create(model="test", input="hi", previous_response_id="abc")
        with pytest.raises(openai.NotFoundError, match=r"no response 'resp_0\.0'"):
            await client.responses.create(model="test", input="hi", previous_response_id="resp_0.0")
        with pytest.raises(openai.NotFoundError, match=r"no response 'resp_5pW5\.RWZ'"):  # its session id is none
            await client.responses.create(model="test", input="hi", previous_response_id="resp_5pW5.RWZ")
        with pytest.raises(openai.AuthenticationError):
            await sdk(api_key="wrong").models.list()



async def test_a_refused_request_makes_no_session() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        client = sdk()
        with pytest.raises(openai.ConflictError, match="must end with the user's message"):
            await client.chat.completions.create(model="test", messages=[{"role": "user", "content": "hi"},
                                                                         {"role": "assistant", "content": "x"}])
        with pytest.raises(openai.ConflictError, match="must end with the user's message"):
            await client.responses.create(model="test", input=[{"role": "system", "content": "x"}],
                                          conversation="never")
        with pytest.raises(openai.BadRequestError, match="Idempotency-Key"):
            await client.responses.create(model="test", input="hi", extra_headers={"Idempotency-Key": "k" * 300})
    assert (await store.list_sessions("acme")).sessions == []

async def test_another_tenant_cannot_continue_a_response() -> None:
    async with openai_clients(make_app(MemoryStore(), GateModel())) as sdk:
        first = await sdk().responses.create(model="test", input="secret")
        with pytest.raises(openai.NotFoundError):
            await sdk("globex").responses.create(model="test", input="x", previous_response_id=first.id)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_busy_session_is_a_409_streamed_or_not(stream: bool) -> None:
    model = GateModel(gated=True)
    store = MemoryStore()
    async with openai_clients(make_app(store, model)) as sdk:
        client = sdk()
        headers = {"X-Session-Id": "busy"}
        hi: Any = [{"role": "user", "content": "hi"}]
        first = asyncio.ensure_future(client.chat.completions.create(model="test", messages=hi,
                                                                     extra_headers=headers))
        await model.entered.wait()
        with pytest.raises(openai.ConflictError, match="busy"):
            await client.chat.completions.create(model="test", messages=[*hi, {"role": "user", "content": "x"}],
                                                 stream=stream, extra_headers=headers)
        with pytest.raises(openai.ConflictError, match="busy"):
            await client.responses.create(model="test", input="x", stream=stream, conversation="busy")
        model.release.set()
        assert (await first).choices[0].message.content == "reply 1 to hi"
    assert await log(store, "busy") == [("user", "hi"), ("assistant", "reply 1 to hi")]


async def test_a_retry_with_the_same_idempotency_key_is_answered_from_the_log() -> None:
    model = GateModel()
    store = MemoryStore()
    async with openai_clients(make_app(store, model)) as sdk:
        client = sdk()
        key = {"Idempotency-Key": "8f7c2e4a-retry"}
        first = await client.responses.create(model="test", input="pay once", conversation="idem", extra_headers=key)
        again = await client.responses.create(model="test", input="pay once", conversation="idem", extra_headers=key)
        chat = await client.chat.completions.create(model="test", messages=[{"role": "user", "content": "pay once"}],
                                                    extra_headers={**key, "X-Session-Id": "idem-chat"})
        chat_again = await client.chat.completions.create(
            model="test", messages=[{"role": "user", "content": "pay once"}],
            extra_headers={**key, "X-Session-Id": "idem-chat"})
    assert (again.id, again.output_text) == (first.id, first.output_text)
    assert chat_again.choices[0].message.content == chat.choices[0].message.content
    assert model.calls == 2
    assert await log(store, "idem") == [("user", "pay once"), ("assistant", "reply 1 to pay once")]



async def test_a_retry_that_continues_from_a_previous_response_is_answered_from_the_log() -> None:
    model = GateModel()
    store = MemoryStore()
    async with openai_clients(make_app(store, model)) as sdk:
        client = sdk()
        first = await client.responses.create(model="test", input="hi")
        key = {"Idempotency-Key": "retry-after-hi"}
        paid = await client.responses.create(model="test", input="pay", previous_response_id=first.id,
                                             extra_headers=key)
        # The first attempt ran, so `first` is no longer the latest response: the retry is still answered.
        again = await client.responses.create(model="test", input="pay", previous_response_id=first.id,
                                              extra_headers=key)
        with pytest.raises(openai.ConflictError, match="not the latest"):  # without the key, it is a branch
            await client.responses.create(model="test", input="pay", previous_response_id=first.id)
    assert (again.id, again.output_text) == (paid.id, paid.output_text) and model.calls == 2
    session = first.model_extra["contextpipe"]["session_id"] if first.model_extra else None
    assert session is not None and await log(store, session) == [
        ("user", "hi"), ("assistant", "reply 1 to hi"), ("user", "pay"), ("assistant", "reply 2 to pay")]

async def test_openai_clients_act_for_users_as_their_keys_allow() -> None:
    store = MemoryStore()
    api_keys = ApiKeys()
    api_keys.add("acme", "cp_backend", names_users=True)
    api_keys.add("acme", "cp_alice", user="alice")
    api_keys.add("acme", "cp_plain")
    app = create_app(Agent(GateModel(), providers=[History(store)], name="test"), keys=api_keys)
    async with openai_clients(app) as sdk:
        backend, alice, plain = sdk(api_key="cp_backend"), sdk(api_key="cp_alice"), sdk(api_key="cp_plain")
        bobs = await backend.responses.create(model="test", input="bob's secret", conversation="bob-1", user="bob")
        # `user` is a hint clients send on their own (LibreChat: on every request): a key that may not
        # name users decides, and the field changes nothing.
        await plain.responses.create(model="test", input="x", user="bob", conversation="plain-1")
        await alice.chat.completions.create(model="test", messages=[{"role": "user", "content": "x"}],
                                            user="bob", extra_headers={"X-Session-Id": "alice-1"})
        # A key bound to alice reaches none of bob's sessions, however it names them.
        with pytest.raises(openai.NotFoundError):
            await alice.responses.create(model="test", input="x", previous_response_id=bobs.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.create(model="test", input="x", conversation="bob-1")
        with pytest.raises(openai.NotFoundError):
            await alice.chat.completions.create(model="test", messages=[{"role": "user", "content": "x"}],
                                                extra_headers={"X-Session-Id": "bob-1"})
        mine = await alice.chat.completions.with_raw_response.create(
            model="test", messages=[{"role": "user", "content": "mine"}])
    assert [text for _, text in await log(store, "bob-1")] == ["bob's secret", "reply 1 to bob's secret"]
    sessions = {s.session_id: s for s in (await store.list_sessions("acme")).sessions}
    assert set(sessions) == {"bob-1", "plain-1", "alice-1", mine.headers["x-session-id"]}
    for session_id, user in (("bob-1", "bob"), ("plain-1", None), ("alice-1", "alice"),
                             (mine.headers["x-session-id"], "alice")):
        stored = await store.get_session("acme", session_id)
        assert stored is not None and stored.state.get("user_id") == user, session_id


async def test_the_format_a_request_asks_for_reaches_the_model_in_chat_s_shape() -> None:
    model = ScriptedModel(['{"city": "Oslo"}', '{"city": "Rome"}', "Plain."])
    app = create_app(Agent(model, providers=[History(MemoryStore())], name="test"), keys=keys())
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    async with openai_clients(app) as sdk:
        client = sdk()
        await client.responses.create(model="test", input="Where?", text={
            "format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}})
        await client.chat.completions.create(model="test", messages=[{"role": "user", "content": "Where?"}],
                                             response_format={"type": "json_schema", "json_schema": {
                                                 "name": "place", "schema": schema, "strict": True}})
        await client.responses.create(model="test", input="Say it.", text={"format": {"type": "text"}})
    responses, chat, plain = (r.settings.get("response_format") for r in model.requests)
    assert responses == chat == {"type": "json_schema", "json_schema": {"name": "place", "schema": schema,
                                                                        "strict": True}}
    assert plain is None


async def test_a_json_object_format_reaches_the_model_and_an_unnamed_schema_is_a_400() -> None:
    model = ScriptedModel(['{"city": "Oslo"}'])
    app = create_app(Agent(model, providers=[History(MemoryStore())], name="test"), keys=keys())
    async with openai_clients(app) as sdk:
        client = sdk()
        await client.responses.create(model="test", input="Where? JSON.", text={"format": {"type": "json_object"}})
        with pytest.raises(openai.BadRequestError, match=r"text\.format\.name: Field required"):
            await client.responses.create(model="test", input="Where?", text={
                "format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert [r.settings.get("response_format") for r in model.requests] == [{"type": "json_object"}]


async def test_a_chat_json_schema_format_needs_a_name() -> None:
    model = ScriptedModel(['{"city": "Oslo"}'])
    app = create_app(Agent(model, providers=[History(MemoryStore())], name="test"), keys=keys())
    hi: Any = [{"role": "user", "content": "Where? JSON."}]
    async with openai_clients(app) as sdk:
        client = sdk()
        with pytest.raises(openai.BadRequestError, match=r"response_format\.json_schema\.name: Field required"):
            await client.chat.completions.create(model="test", messages=hi, response_format={
                "type": "json_schema", "json_schema": {"schema": {"type": "object"}}})  # type: ignore[typeddict-item]
        await client.chat.completions.create(model="test", messages=hi, response_format={"type": "json_object"})
    assert [r.settings.get("response_format") for r in model.requests] == [{"type": "json_object"}]


async def refusal(call: Awaitable[Any]) -> tuple[int, Any]:
    """Return the status and the error (``{"type", "message"}``) the server refused `call` with."""
    with pytest.raises(openai.APIStatusError) as refused:
        await call
    return refused.value.status_code, refused.value.body


def bad_request(message: str) -> tuple[int, Any]:
    return 400, {"type": "BadRequest", "message": "invalid request: " + message}


async def test_a_blank_or_empty_responses_input_is_one_400_naming_the_field_and_what_to_send() -> None:
    store, model = MemoryStore(), GateModel()
    async with openai_clients(make_app(store, model)) as sdk:
        create = sdk().responses.create
        assert await refusal(create(model="test", input=" \n")) == bad_request(
            "input: must be the user's text (not blank), or a list of messages (at least one)")
        assert await refusal(create(model="test", input=[])) == bad_request(
            "input: must be the user's text (not blank), or a list of messages (at least one)")
        assert await refusal(create(model="test", input=[{"role": "user", "content": "\t"}])) == bad_request(
            "input[0].content: must be the user's text (not blank), or a list of input_text and input_image "
            "parts (at least one)")
        assert await refusal(create(model="test", input=[{"role": "system", "content": ""},
                                                         {"role": "user", "content": "Hi."}])) == bad_request(
            "input[0].content: must be text (not blank), or a list of input_text and output_text parts (at least "
            "one)")
    assert model.calls == 0 and not (await store.list_sessions("acme")).sessions


async def test_a_blank_new_chat_message_is_a_409_naming_it() -> None:
    store, model = MemoryStore(), GateModel()
    async with openai_clients(make_app(store, model)) as sdk:
        create = sdk().chat.completions.create
        assert await refusal(create(model="test", messages=[{"role": "user", "content": []}])) == bad_request(
            "messages[0].content: must be text, or a list of text and image_url parts (at least one)")
        new = "is one of the turn's new user messages (those after the last non-user message): send the user's " \
              "text, or an image, to answer"
        assert await refusal(create(model="test", messages=[{"role": "user", "content": " \n"}])) == (
            409, {"type": "NothingToRun", "message": f"messages[0].content is blank, and it {new}"})
        assert await refusal(create(model="test", messages=[
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": [{"type": "text", "text": " "}]}, {"role": "user", "content": "More."}],
            extra_headers={"X-Session-Id": "chat-blank"})) == (
            409, {"type": "NothingToRun", "message": f"messages[2].content is blank, and it {new}"})
    assert model.calls == 0 and not (await store.list_sessions("acme")).sessions  # nothing made, nothing run


async def test_a_blank_chat_message_an_earlier_turn_was_answered_with_stays_accepted() -> None:
    store = MemoryStore()
    async with openai_clients(make_app(store, GateModel())) as sdk:
        create = sdk().chat.completions.create
        # Clients resend the whole conversation every turn, this blank message with it.
        history: list[Any] = [{"role": "user", "content": " "}, {"role": "assistant", "content": "Yes?"},
                              {"role": "user", "content": "Hi."}]
        first = await create(model="test", messages=history, extra_headers={"X-Session-Id": "chat-blank"})
        history += [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "Bye."}]
        await create(model="test", messages=history, extra_headers={"X-Session-Id": "chat-blank"})
    assert await log(store, "chat-blank") == [  # stored as sent, each message once
        ("user", " "), ("assistant", "Yes?"), ("user", "Hi."), ("assistant", "reply 1 to Hi."), ("user", "Bye."),
        ("assistant", "reply 2 to Bye.")]


async def test_a_model_id_holding_a_slash_is_retrieved_as_the_sdk_sends_it() -> None:
    app = create_app(Agent(ScriptedModel(["Hi."]), providers=[History(MemoryStore())], name="team/helper"),
                     keys=keys())
    async with openai_clients(app) as sdk:
        client = sdk()  # the SDK sends the id as one path segment: team%2Fhelper
        assert (await client.models.retrieve("team/helper")).id == "team/helper"
        answer = await client.chat.completions.create(model="team/helper", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.NotFoundError, match="send model='team/helper'"):
            await client.models.retrieve("team")
    assert answer.choices[0].message.content == "Hi."


async def test_a_streamed_run_that_stops_short_ends_with_response_incomplete_which_the_helper_holds() -> None:
    @tool(needs_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    model = ScriptedModel([tool_call("refund", order="A-1")])
    app = create_app(Agent(model, tools=[refund], providers=[History(MemoryStore())], name="test"), keys=keys())
    async with openai_clients(app) as sdk, sdk().responses.stream(model="test", input="Refund A-1.") as stream:
        events = [event async for event in stream]
        with pytest.raises(RuntimeError, match=r"response\.completed"):  # what the docs tell users to expect
            await stream.get_final_response()
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    about = (last.response.model_extra or {})["contextpipe"]
    assert about["stop_reason"] == "approval_required"
    assert [p["tool_name"] for p in about["pending_approvals"]] == ["refund"]
