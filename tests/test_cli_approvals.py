"""The chat asks y/n before a call that needs approval, and holds back a message while calls await a decision."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from contextpipe import Agent, ModelServerError, tool
from contextpipe.exchanges import exchange_problem as broken_exchange
from contextpipe.providers import History
from contextpipe.stores import MemoryStore
from contextpipe.testing import FakeOpenAIServer, FakeReply, ScriptedModel, tool_call
from helpers import chat

PAID: list[str] = []


@tool(needs_approval=True)
def pay(invoice: str) -> str:
    """Pay an invoice."""
    PAID.append(invoice)
    return f"paid {invoice}"


def test_the_chat_asks_before_a_call_that_needs_approval_and_goes_on_with_the_answer() -> None:
    PAID.clear()
    store = MemoryStore()
    agent = Agent(ScriptedModel([tool_call("pay", invoice="A") + tool_call("pay", invoice="B"), "Paid A only."]),
                  tools=[pay], providers=[History(store)], store=store)
    shown, errors, _ = chat(agent, ["Pay A and B.", "maybe", "y", "n"])
    assert shown == [
        "you> Pay A and B.", "assistant>",
        "run pay({\"invoice\": \"A\"})? tool 'pay' needs approval for every call",
        "approve? [y]es, [n]o, [a]lways> maybe", "approve? [y]es, [n]o, [a]lways> y",
        "run pay({\"invoice\": \"B\"})? tool 'pay' needs approval for every call",
        "approve? [y]es, [n]o, [a]lways> n",
        "assistant>", "  calling pay({\"invoice\": \"A\"})", "  -> paid A", "Paid A only."], errors
    assert PAID == ["A"]


def test_a_message_waits_while_calls_of_the_session_await_a_decision_then_is_sent() -> None:
    PAID.clear()
    store = MemoryStore()
    earlier = Agent(ScriptedModel([tool_call("pay", invoice="A")]), tools=[pay], providers=[History(store)],
                    store=store)
    asyncio.run(earlier.run("Pay A.", session=asyncio.run(earlier.session("s"))))  # another process stopped here
    agent = Agent(ScriptedModel(["Paid A.", "Hello!"]), tools=[pay], providers=[History(store)], store=store)
    shown, errors, _ = chat(agent, ["Hi.", "a"])
    assert "await your decision first; your message is sent once they are decided" in errors
    assert shown == ["you> Hi.", "assistant>",
                     "run pay({\"invoice\": \"A\"})? tool 'pay' needs approval for every call",
                     "approve? [y]es, [n]o, [a]lways> a", "assistant>", "  calling pay({\"invoice\": \"A\"})",
                     "  -> paid A", "Paid A.", "assistant> Hello!"]
    assert PAID == ["A"]
    log = asyncio.run(store.load("default", "s")).messages
    assert [(m.role, m.text) for m in log][-2:] == [("user", "Hi."), ("assistant", "Hello!")]
    assert [m.role for m in log] == ["user", "assistant", "tool", "assistant", "user", "assistant"]


def test_a_held_message_is_not_kept_when_the_run_deciding_the_calls_fails() -> None:
    PAID.clear()
    store = MemoryStore()
    earlier = Agent(ScriptedModel([tool_call("pay", invoice="A")]), tools=[pay], providers=[History(store)],
                    store=store)
    asyncio.run(earlier.run("Pay A.", session=asyncio.run(earlier.session("s"))))
    down = ModelServerError("the model server failed; retry later", provider="scripted", status_code=503)
    agent = Agent(ScriptedModel([down, "Hello!"]), tools=[pay], providers=[History(store)], store=store)
    shown, errors, _ = chat(agent, ["Hi.", "y", "Hi again."], code=1)  # a failed run: the chat goes on, exits 1
    assert "the model server failed; retry later; your message was not sent (send it again)" in errors, errors
    assert shown[-1] == "assistant> Hello!" and PAID == ["A"]  # the approved call ran before the model failed
    log = asyncio.run(store.load("default", "s")).messages
    assert [(m.role, m.text) for m in log if m.role == "user"] == [("user", "Pay A."), ("user", "Hi again.")]
    assert broken_exchange(log) is None


def test_at_the_end_of_input_the_calls_still_await_a_decision() -> None:
    PAID.clear()
    store = MemoryStore()
    agent = Agent(ScriptedModel([tool_call("pay", invoice="A")]), tools=[pay], providers=[History(store)], store=store)
    _, errors, _ = chat(agent, ["Pay A."])
    assert "no answer: the calls still await a decision" in errors and PAID == []
    assert [m.role for m in asyncio.run(store.load("default", "s")).messages] == ["user", "assistant"]


def test_chat_ask_before_asks_about_an_mcp_servers_tools(fake_openai: FakeOpenAIServer, tmp_path: Path) -> None:
    fake_openai.enqueue(FakeReply(tool_calls=(("add", '{"a": 2, "b": 3}'),)), FakeReply("I was not allowed to add."))
    server = str(Path(__file__).parent / "fixtures" / "mcp_server.py")
    proc = subprocess.run(
        [sys.executable, "-m", "contextpipe.cli", "chat", "--db", str(tmp_path / "m.db"), "--mcp",
         f"{sys.executable} {server}", "--ask-before", "a*"], input="What is 2 + 3?\nn\n", capture_output=True,
        text=True, timeout=120, env={**os.environ, "COLUMNS": "200", "OPENAI_BASE_URL": fake_openai.base_url,
                                     "OPENAI_API_KEY": "test-key", "OPENAI_MODEL": "fake-model"})
    assert proc.returncode == 0, proc.stderr
    assert "run add({\"a\": 2, \"b\": 3})? the agent's approval policy covers tool 'add' ('a*')" in proc.stdout
    assert "I was not allowed to add." in proc.stdout and "calling add" not in proc.stdout
    told = fake_openai.requests[1]["messages"][-1]
    assert told["role"] == "tool" and told["content"].startswith("Error: the call to 'add' was not run")
