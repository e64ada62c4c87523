"""The offline demonstration ``contextpipe demo`` runs: no network, no API key.

A weather agent (the seeds' scenario) runs on the deterministic `ScriptedModel`, with its sessions
in SQLite:

1. a tool loop with per-step persistence: what is stored after each step;
2. a real crash: a worker process is killed with SIGKILL in the middle of a tool call, and a new
   run repairs the session and finishes the job;
3. compaction: a long session is cut to a token budget before each model call;
4. the inspect view: where every token of the last prompt came from;
5. memory: something said in one session is recalled in another session of the same user;
6. prompt caching: the weather loop through the real `anthropic` SDK, against a local stand-in for the
   Messages API that simulates its prompt cache, with a per-call table of cached tokens.

Run again on the same file (``contextpipe demo --db FILE``), it starts a fresh set of sessions beside
the earlier ones (ids ending in ``-2``, ``-3`` ...), so every run shows the same story and no earlier
run's data is touched.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..agent import Agent, RunResult
from ..compaction import TokenBudget
from ..config import Durability
from ..events import StepPersisted
from ..messages import Message
from ..providers.compaction import Compaction
from ..providers.history import History
from ..providers.memory import SemanticMemory
from ..session import Session, set_user_id
from ..stores.sqlite import SQLiteStore
from ..testing.scripted import ScriptedModel, tool_call
from ..tokens import EstimateTokenizer
from ..tools import tool
from ..trace import preview
from ..vectors.embedders import HashEmbedder

__all__ = ["run_demo", "usage_table"]

_CODES = {"suzhou": "SZ", "beijing": "BJ"}
_FORECASTS = {"SZ": "Sunny, 25 °C, north-west wind force 4.", "BJ": "Cloudy, 22 °C, east wind force 3."}
_SLOW_FORECAST = "CONTEXTPIPE_DEMO_SLOW_FORECAST"
_SESSIONS = ("demo-weather", "demo-crash", "demo-long", "alice-monday", "alice-friday", "demo-claude")
"""The sessions one run of the demonstration writes (with its run's suffix)."""


@dataclass(frozen=True)
class _Run:
    """One run of the demonstration in its file: the suffix of its sessions' ids and of its user."""

    number: int

    @property
    def suffix(self) -> str:
        """What this run's ids end with: nothing for the first run, ``-2`` for the second ..."""
        return "" if self.number == 1 else f"-{self.number}"

    def session(self, name: str) -> str:
        """Return the id of the session `name` (one of `_SESSIONS`) in this run."""
        return name + self.suffix


async def _next_run(store: SQLiteStore) -> _Run:
    """Return the first run whose sessions are all new in the file (earlier runs' sessions are left as they are)."""
    number = 1
    while any([await store.get_session("default", _Run(number).session(name)) for name in _SESSIONS]):
        number += 1
    return _Run(number)


@tool(idempotent=True)
def lookup_location_code(city: str) -> str:
    """Return the location code for a city name.

    Args:
        city: The city's name, for example "Suzhou".
    """
    try:
        return _CODES[city.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown city {city!r}") from None


@tool(idempotent=True)
def get_weather_forecast(location_code: str) -> str:
    """Return today's weather forecast for a location code.

    Args:
        location_code: A code returned by lookup_location_code.
    """
    if os.environ.get(_SLOW_FORECAST):
        print("forecast-started", flush=True)  # the demo kills this worker here
        time.sleep(60)
    try:
        return _FORECASTS[location_code]
    except KeyError:
        raise ValueError(f"unknown location code {location_code!r}") from None


def _describe(message: Message) -> str:
    return f"{message.role:<9} {preview(message)}"


def _weather_agent(store: SQLiteStore, model: ScriptedModel, **options: object) -> Agent:
    return Agent(model, instructions="You are a helpful assistant. Use the tools to check the weather.",
                 tools=[lookup_location_code, get_weather_forecast], providers=[History(store)],
                 **options)  # type: ignore[arg-type]


async def _run_showing_steps(agent: Agent, text: str | None, session: Session,
                             say: Callable[[str], None], *, lease_wait: float = 0.0) -> RunResult:
    """Stream one run, saying what is stored at each step."""
    async with agent.stream(text, session=session, lease_wait=lease_wait) as events:
        async for event in events:
            if isinstance(event, StepPersisted):
                step = f"step {event.step}" if event.step else "repair"
                for message in event.messages:
                    say(f"      {step} stored  {_describe(message)}")
    assert events.result is not None
    return events.result


async def run_demo(say: Callable[[str], None] = print, *, db: str | None = None) -> None:
    """Run the demonstration, writing its narration through `say`.

    Sessions go to the SQLite file `db` (a temporary one by default). In a file that holds an
    earlier run, the run writes sessions of its own beside it (`_next_run`).
    """
    with tempfile.TemporaryDirectory(prefix="contextpipe-demo-") as tmp:
        path = db or os.path.join(tmp, "demo.db")
        async with SQLiteStore(path) as store:
            run = await _next_run(store)
            say(f"Sessions are stored in SQLite ({path}).")
            if run.number > 1:
                say(f"It holds {run.number - 1} earlier run(s) of this demo, kept as they are; this run's sessions "
                    f"end in {run.suffix} (contextpipe sessions list --db {path}).")
            await _tool_loop(store, run, say)
            await _crash_and_resume(store, run, path, say)
            await _compaction_and_inspect(store, run, say)
            await _memory(store, run, say)
            await _prompt_caching(store, run, say)


async def _tool_loop(store: SQLiteStore, run: _Run, say: Callable[[str], None]) -> None:
    say("")
    say("1. A tool loop with per-step persistence: each step is stored as soon as it happens.")
    model = ScriptedModel([
        tool_call("lookup_location_code", city="Suzhou"),
        tool_call("get_weather_forecast", location_code="SZ"),
        "Sunny and 25 °C with some wind: a T-shirt or light shirt, plus a thin windbreaker.",
    ])
    agent = _weather_agent(store, model)
    session = await agent.session(run.session("demo-weather"))
    say("   user: What should I wear in Suzhou today?")
    result = await _run_showing_steps(agent, "What should I wear in Suzhou today?", session, say)
    say(f"   answer after {result.steps} model calls: {result.text}")


async def _crash_and_resume(store: SQLiteStore, run: _Run, path: str, say: Callable[[str], None]) -> None:
    say("")
    say("2. A crash: a worker process is killed (SIGKILL) while the forecast tool runs; nothing is lost.")
    env = {**os.environ, _SLOW_FORECAST: "1"}
    crashed = run.session("demo-crash")
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "contextpipe.cli._demonstration", "crash-worker", path, crashed, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert worker.stdout is not None
    line = await worker.stdout.readline()
    worker.kill()  # SIGKILL: no cleanup, no final save
    _, stderr = await worker.communicate()
    if line.strip() != b"forecast-started":
        raise RuntimeError(f"the demo worker did not start: {stderr.decode()[-2000:]}")
    session = await store.load_or_create("default", crashed)
    log = (await store.load("default", crashed)).messages
    say(f"   killed the worker (exit {worker.returncode}) mid-call; the log holds {len(log)} messages:")
    for message in log:
        say(f"      {_describe(message)}")
    say("   the last call has no result. A new run takes over the dead worker's lease once it lapses,")
    say("   and repairs the session before calling the model:")
    model = ScriptedModel(["Beijing is cloudy at 22 °C: a long-sleeved shirt and a light jacket."])
    agent = _weather_agent(store, model)
    result = await _run_showing_steps(agent, None, session, say, lease_wait=10)
    say("   the forecast tool is idempotent, so it ran again; a non-idempotent tool would have been")
    say("   recorded as 'interrupted' instead. The model never saw an unanswered call.")
    say(f"   answer: {result.text}")


async def _crash_worker(path: str, session_id: str) -> None:
    async with SQLiteStore(path) as store:
        model = ScriptedModel([tool_call("lookup_location_code", city="Beijing"),
                               tool_call("get_weather_forecast", location_code="BJ"), "unreachable"])
        agent = _weather_agent(store, model, durability=Durability(lease_ttl=0.5))
        session = await agent.session(session_id)
        await agent.run("And what about Beijing?", session=session)


async def _compaction_and_inspect(store: SQLiteStore, run: _Run, say: Callable[[str], None]) -> None:
    say("")
    say("3. Compaction: a 12-turn session is cut to a 400-token budget before each model call.")
    chat = ScriptedModel([f"Noted, point {i}: " + "details " * 12 for i in range(12)])
    writer = Agent(chat, providers=[History(store)])
    session = await writer.session(run.session("demo-long"))
    for i in range(12):
        await writer.run(f"Remember point {i}: " + "context " * 12, session=session)
    budget = Compaction(TokenBudget(400), tokenizer=EstimateTokenizer())
    model = ScriptedModel(["I can see points 6 to 11 here; the earlier ones are stored but not in view."])
    agent = Agent(model, instructions="Answer from the conversation.", providers=[History(store), budget],
                  durability=Durability(store_traces=True))
    result = await agent.run("What did I tell you?", session=session)
    trace = result.traces[0]
    for decision in trace.compaction:
        say(f"   {decision.strategy}: {decision.action} {len(decision.message_ids)} of the oldest messages "
            f"({decision.tokens_before} -> {decision.tokens_after} tokens); the log still holds them all "
            f"({len(await agent.history(session))} messages).")
    say("")
    say("4. The inspect view of that call (also: contextpipe inspect SESSION --db FILE):")
    for line in trace.table().splitlines():
        say("   " + line)


async def _memory(store: SQLiteStore, run: _Run, say: Callable[[str], None]) -> None:
    say("")
    say("5. Memory across sessions: what alice said in one session is recalled in her next one.")
    vectors = store.vectors()
    try:
        # HashEmbedder matches shared words offline; use MPNetEmbedder, LocalEmbedder or OpenAIEmbedder for meaning.
        memory = SemanticMemory(vectors, HashEmbedder(), k=1, min_score=None)
        model = ScriptedModel(["Noted: no meat for you.", "How about a vegetarian mapo tofu tonight?"])
        agent = Agent(model, providers=[History(store), memory])
        alice = "alice" + run.suffix  # an earlier run's alice said the same: her memories are not this one's
        monday = await agent.session(run.session("alice-monday"))
        set_user_id(monday, alice)
        await agent.run("Please remember that I only eat vegetarian food.", session=monday)
        friday = await agent.session(run.session("alice-friday"))
        set_user_id(friday, alice)
        result = await agent.run("Any vegetarian dinner ideas for tonight?", session=friday)
        recalled = model.requests[-1].messages[0].text.splitlines()
        say(f"   a new session, and the model is given: {recalled[0]}")
        say(f"      {recalled[1]}")
        say(f"   answer: {result.text}")
    finally:
        await vectors.close()


def usage_table(result: RunResult) -> list[str]:
    """Return one line per model call of `result`: input and output tokens, with cache columns when reported."""
    usages = [(t.step, t.usage) for t in result.traces if t.usage is not None]
    cached = any(u.cache_read_tokens or u.cache_write_tokens for _, u in usages)
    head = f"{'call':>4} {'input':>7}" + (f" {'cached':>7} {'written':>8}" if cached else "") + f" {'output':>7}"
    lines = [head]
    for step, u in usages:
        lines.append(f"{step:>4} {u.input_tokens:>7}" + (f" {u.cache_read_tokens:>7} {u.cache_write_tokens:>8}"
                                                          if cached else "") + f" {u.output_tokens:>7}")
    return lines


async def _prompt_caching(store: SQLiteStore, run: _Run, say: Callable[[str], None]) -> None:
    say("")
    say("6. Prompt caching with Claude: the weather loop through the anthropic SDK, against a local stand-in")
    say("   for the Messages API that simulates its cache (contextpipe.testing.FakeAnthropicServer).")
    import importlib.util

    if importlib.util.find_spec("anthropic") is None:
        say('   (skipped: pip install "contextpipe[anthropic]" to see it)')
        return
    from ..models.anthropic import AnthropicChatModel
    from ..testing.fake_anthropic import AnthropicReply, FakeAnthropicServer

    with FakeAnthropicServer() as server:
        server.enqueue(
            AnthropicReply(thinking="I need the location code first.",
                           tool_calls=(("lookup_location_code", '{"city": "Suzhou"}'),)),
            AnthropicReply(thinking="Now the forecast for SZ.",
                           tool_calls=(("get_weather_forecast", '{"location_code": "SZ"}'),)),
            AnthropicReply("Sunny and 25 °C in Suzhou: a T-shirt and a light windbreaker.", thinking="Sunny."))
        async with AnthropicChatModel("claude-sonnet-5", base_url=server.base_url, api_key="demo") as model:
            agent = Agent(model, instructions="You are a helpful assistant. Use the tools to check the weather. "
                          + "Answer in one sentence, with what to wear. " * 20,
                          tools=[lookup_location_code, get_weather_forecast], providers=[History(store)],
                          settings={"anthropic_thinking": {"type": "enabled", "budget_tokens": 1024}})
            session = await agent.session(run.session("demo-claude"))
            result = await agent.run("What should I wear in Suzhou today?", session=session)
    say("   cache breakpoints go on the tools, the instructions and the end of the previous call's prompt;")
    say("   thinking blocks are stored with their signatures and sent back unchanged. Tokens per call:")
    for line in usage_table(result):
        say("      " + line)
    say(f"   answer: {result.text}")


def main() -> None:
    """Run the demonstration on stdout (or, internally, the crash worker)."""
    if len(sys.argv) == 4 and sys.argv[1] == "crash-worker":
        asyncio.run(_crash_worker(sys.argv[2], sys.argv[3]))
        return
    asyncio.run(run_demo())


if __name__ == "__main__":
    main()
