"""The step loop: model step, then tool step, then continue or stop; every step saved as it happens.

One step is a model call and the tool calls it asked for. `StepLoop.events` reads like the
algorithm: build the request, call the model, record the `ModelStep`, then the tool step, until a `Stop`.
The model is always called through one chain: the providers' middleware, then the innermost call,
which checks the request (`contextpipe._run.invariants`), streams or completes, and returns the
response with the request it actually sent, so the trace shows what the model saw.

Per step (the default) the model's new messages are saved right after the call and each tool
result as soon as it is produced (one ``tool`` message per result), so a crash at step k loses
nothing before it. The working set stays in memory: a step costs O(new messages).

Model output is normalised before it is stored (call ids made unique, nameless calls answered
with an error); a stored log that breaks the tool-exchange rules is repaired in the run's view,
with a note on the trace. A log that ends in calls without results (a crash, a kill, a cancelled
stream) is answered before the first call: recorded results kept, idempotent tools run again, the
rest "interrupted" (`contextpipe._run.repair`); calls awaiting a person wait (`contextpipe._run.approvals`).

A sync tool's thread that outlives the wait for it is kept (`contextpipe._run.threads`): its late
result is recorded before the next model call, and the run ends, keeping its session until then,
only once every such thread has finished and what it produced is saved (unless the lease is lost).
A cancelled run ends whatever a driver does: each step raises a cancellation a driver swallowed,
and the saves of its way out take at most the lease's TTL (`StepWriter.keep`, `_run.way_out`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any

from ..errors import LeaseLost
from ..events import ApprovalRequired, RunEvent, StepPersisted, StopReason, ToolCallFinished, ToolCallStarted
from ..exchanges import late_result, normalise_calls, tool_message, unanswered_calls, untagged
from ..messages import INPUT, FunctionCall, FunctionResult, Message, Source
from ..models.base import CallModel, ChatModel, ModelRequest, ModelResponse, ReasoningDelta, TextDelta
from ..pipeline import MessageView, Segment
from ..trace import ContextChange, PromptTrace
from .approvals import ApprovalGate
from .cache_watch import previous_prefix, watch_cache
from .calls import CallContexts, deferrable, invoke_tool, returned, stopped_with_run
from .inbox import Inbox
from .invariants import check_messages
from .model_chain import chain, consume, no_deltas, with_request
from .repair import REPAIR, answers_all, check_history, cut_answer, save_cut_answer
from .replay import marked_stopped
from .steps import LoopState, ModelStep, Stop
from .threads import RunThreads, raise_swallowed_cancellation
from .tool_chain import ToolChain

if TYPE_CHECKING:
    from ..config import RunLimits
    from ..pipeline import RunContext
    from ..telemetry import ExecuteTool
    from ..tool_context import ToolContext
    from ..tools import Tool, ToolOutcome, ToolSpec
    from .writer import StepWriter

__all__ = ["ModelStep", "StepLoop", "Stop"]


_DONE = object()


class StepLoop:
    """Runs the tool loop of one run; iterate `events()` to drive it."""

    def __init__(self, ctx: RunContext, model: ChatModel, limits: RunLimits, writer: StepWriter, *,
                 stream: bool, want_events: bool, contexts: CallContexts | None = None,
                 instrument_tools: Callable[[ExecuteTool], ExecuteTool] | None = None,
                 approvals: ApprovalGate | None = None) -> None:
        self.ctx = ctx
        self.model = model
        self.limits = limits
        self.writer = writer
        self.stream = stream
        self.want_events = want_events
        self.state = LoopState()
        self._instrument_tools = instrument_tools
        self._contexts = contexts if contexts is not None else CallContexts(ctx.session, ctx.agent)
        self.approvals = approvals if approvals is not None else ApprovalGate(session=ctx.session)
        self._model_source = Source("model", model.name)
        self._parts: list[Segment] = []
        self._tail: list[Message] = []
        self._checked = 0  # leading messages of `_tail` a request check found complete (never scanned again)
        self._calibrated = False  # whether this run taught the token calibration (once a run)
        self._view: MessageView | None = None  # the messages of the latest request the loop built
        self._specs: list[ToolSpec] = []
        self._tools: dict[str, Tool] = {}
        self._tool_sources: dict[str, str] = {}
        self._latest_input: Message | None = None
        self._complete: CallModel = self._send
        self._stop: Stop | None = None
        self._final_call = False  # the latest request withdrew the tools
        self._head = 0  # how many of `_parts` are history (an interrupted run's answer goes after them)
        self.open_at_start: set[str] = set()  # the ids of the calls the log left open: the model may not take them
        self._threads = RunThreads()  # the sync tools' threads that may outlive the wait for them
        writer.held_open = self._threads.running  # they keep a cancelled run's lease renewed
        self._unconfirmed: list[Message] = []  # the model output being saved
        self._inbox = Inbox(writer, want_events)
        self._chain = ToolChain(self._run_tool, (), ctx.journal)  # with the middleware once before_run is over

    def _run_tool(self, call: FunctionCall, arguments: str, context: ToolContext[Any]) -> Awaitable[ToolOutcome]:
        return invoke_tool(self._tools, call, arguments, self._threads, context)

    def _call_tool(self, call: FunctionCall) -> Awaitable[FunctionResult]:
        step = self.state.steps  # the model call that asked for it: 0 while answering an interrupted run
        context = self._contexts.for_call(call)

        async def run(c: FunctionCall) -> FunctionResult:
            return await self._chain.run(c, step, context, self.approvals.take(c.call_id))

        execute: ExecuteTool = run if self._instrument_tools is None else self._instrument_tools(run)
        return execute(call)

    def _execute(self, call: FunctionCall) -> asyncio.Future[FunctionResult]:
        return asyncio.ensure_future(self._call_tool(call))

    async def events(self) -> AsyncGenerator[RunEvent, None]:
        """Drive the loop: model step, tool step, until a `Stop`; yield events on the way.

        Only what can yield is an async generator (a streamed call, the tool step; a complete call is
        a plain await), so a run that wants no events builds no generator per step. However the loop
        ends, it first waits for the tool threads still running (`_settle`).
        """
        async with self._settling():
            if open_end := self._prepare():  # only a log that may end in open calls: no generator otherwise
                async with aclosing(self._answer_interrupted(open_end)) as repair:
                    async for event in repair:
                        yield event
            while self._stop is None:
                raise_swallowed_cancellation()  # a step boundary: a cancellation a call swallowed ends the run here
                for event in await self._boundary():  # late results of tool threads, then queued messages
                    yield event
                request = self._request()
                started, ratio = time.perf_counter(), self.ctx.tokens.ratio
                response: ModelResponse | None = None
                if self.stream:
                    async for item in self._call_model(request):
                        if isinstance(item, ModelResponse):
                            response = item
                        else:
                            yield item
                else:
                    response = await self.writer.guard(self._complete(request))
                step = self._model_step(request, response, time.perf_counter() - started, ratio)
                async with aclosing(self._tool_step(step)) as tool_events:  # closed (its tasks stopped) before _settle
                    async for event in tool_events:
                        yield event
            raise_swallowed_cancellation()
            self.state.stop_reason = self._stop.reason
            if self.approvals.pending:  # sent whether events are wanted or not: once a run, when it stops for them
                yield ApprovalRequired(tuple(self.approvals.pending))

    @asynccontextmanager
    async def _settling(self) -> AsyncIterator[None]:
        """Around the loop: however it ends, wait for the tool threads still running first (`_settle`)."""
        try:
            yield
        except BaseException as exc:
            if self._threads:
                await self._settle(exc)
            raise
        if self._threads:
            await self._settle(None)

    async def _boundary(self) -> list[RunEvent]:
        """Save the tool threads' late results at a step boundary, then deliver the session's queued messages."""
        late = await self._save_late()
        delivered = await self._inbox.deliver(self._parts, self._tail, self.state.steps)  # `contextpipe._run.inbox`
        return [late, *delivered] if late is not None else list(delivered)

    async def _save_late(self) -> StepPersisted | None:
        """Add and save the late results that came since the last step (a step boundary); return the event.

        The threads are forgotten once their results are taken: a save cut short (or failed) is made
        again on the way out, as those results are nowhere else.
        """
        if not self._threads or not (late := self._threads.late()):
            return None
        messages = self._add_late(late)
        try:
            return await self._save(self.state.steps, messages)
        except BaseException as exc:
            await self.writer.save_stopping(self.ctx, messages, exc, "the late results of tool threads")
            raise

    async def _settle(self, error: BaseException | None) -> None:
        """Wait for the tool threads still running, then save what they produced (`contextpipe._run.threads`).

        A call the run never answered gets the thread's result as its own; a call answered with a
        timeout error gets a late result, held in the session while calls wait for a person
        (`ApprovalGate.hold_late`). Neither a cancellation (however often repeated) nor the run's
        `error` cuts the wait short: the run keeps its lease until the threads are done. Only a
        lost lease does, as nothing may be written then.
        """
        writer, threads = self.writer, self._threads
        if writer.lost is not None:
            return
        try:
            cancelled = await threads.wait(writer.guard)
        except LeaseLost:
            if error is None:
                raise
            return
        messages, held, resaved = self._produced()
        try:
            save = writer.save_step(self.ctx, messages, with_request=resaved)
            cut = await writer.keep(save, error, cancelled=cancelled)  # bounded if cancelled (`_run.way_out`)
            if held:
                cut = await writer.keep(self.approvals.hold_late(held), error, cancelled=cancelled) or cut
        except Exception as exc:
            if error is None:
                raise
            error.add_note(f"what tool threads produced after the run stopped waiting for them could not be "
                           f"saved: {type(exc).__name__}: {exc}")
            return
        if (cancelled or cut) and error is None:
            raise asyncio.CancelledError  # the cancellation the wait deferred (the run's own error goes on as it is)

    def _produced(self) -> tuple[list[Message], list[Message], bool]:
        """Return what the finished threads produced (`_settle`): to save, to hold, and if it resaves a model output."""
        threads = self._threads
        messages = threads.unsaved()  # answers whose save was cut: saved again (appends are idempotent by id)
        unanswered, late = threads.finish()
        messages.extend(self._add_tool_message([call], [result]) for call, result in unanswered)
        resaved: list[Message] = []
        held: list[Message] = []  # late results of an exchange awaiting a person: they wait with it (`_run.approvals`)
        if late and self.approvals.holds_late():
            held, late = [self._contexts.attach(late_result(c, r), [c]) for c, r in late], []
        if late and (stopped := unanswered_calls(self._tail)):
            # Calls of the step the run cut (async tools, or a model output being saved) would come before the
            # late results with no answer: they are answered as what they were, instead of leaving the log to
            # repair, after their model output, saved again if its save did not return (appends are idempotent
            # by id): no answer is ever stored without its call.
            resaved = self._unconfirmed
            messages.extend(resaved)
            messages.append(self._add_tool_message(stopped, [stopped_with_run(c) for c in stopped]))
        messages.extend(self._add_late(late))
        return messages, held, bool(resaved)

    def _add_late(self, late: Sequence[tuple[FunctionCall, FunctionResult]]) -> list[Message]:
        """Add the late results of calls answered with a timeout error to the run's messages; return them."""
        messages = [self._contexts.attach(late_result(call, result), [call]) for call, result in late]
        self._tail.extend(messages)
        self.state.new_messages.extend(messages)
        return messages

    # --- before the first call ----------------------------------------------------------------------

    def _prepare(self) -> list[Message]:
        """Build the working set: the context, repaired where the stored log needs it, then the input.

        The working set is the providers' segments (tagged lazily, only if something reads the
        sources) plus this run's own messages; a request is a view over them, not a copy. Returns
        the history when it may end in calls without results, or the session holds late results
        to give back (`ApprovalGate.held_after`); empty in the common case.
        """
        ctx = self.ctx
        self._tools = ctx.tools  # fixed once the providers' before_run is over
        self._specs = [t.spec for t in self._tools.values()]
        self._tool_sources = dict(ctx.tool_sources)
        self._latest_input = ctx.input[-1] if ctx.input else None
        # The middleware is fixed once the providers' before_run is over: build the chain once per run.
        if ctx.middleware:
            self._complete = chain(ctx.middleware, self._terminal(no_deltas))
        self._chain = ToolChain(self._run_tool, ctx.tool_middleware, ctx.journal)
        split = 0  # the history is everything up to the last history segment
        for i, s in enumerate(ctx.segments, 1):
            if s.source.kind == "history":
                split = i
        head, open_end, repair_notes = check_history(ctx.segments[:split])
        if repair_notes:
            ctx.journal.changes.append(ContextChange("repair", "repaired_log", tuple(repair_notes)))
        self._head = len(head)
        self._parts = head
        self._parts.extend(ctx.segments[split:])
        self._parts.append(Segment(INPUT, ctx.input, _tagged=ctx.input))
        self.writer.left_open(unanswered_calls(open_end))  # no input is kept before each has its answer saved
        if not open_end and self.approvals.holding():  # late results held for an exchange answered since
            return [m for s in head for m in s.messages]
        return open_end

    async def _answer_interrupted(self, history: list[Message]) -> AsyncGenerator[RunEvent, None]:
        """Answer the calls a previous, interrupted run left without results (see module docstring).

        The answer goes right after the history, before the context providers' messages and the input;
        the late results its exchange held while it waited for a person follow it (`_run.approvals`).
        """
        open_calls = unanswered_calls(history)
        self.open_at_start = {c.call_id for c in open_calls}
        pending = await self.approvals.resume(history, open_calls, bool(self.ctx.input))
        if self.approvals.pending:
            self._stop = Stop(self.approvals.stop_reason())
        held = self.approvals.held_after(history)  # given back once nothing in their exchange waits
        if not pending and not held:
            return
        self._contexts.expect(history, pending)
        results = self.approvals.answers(pending, self.ctx.journal, self._idempotent)  # rejected, or interrupted
        message: Message | None = None
        running: asyncio.Future[FunctionResult] | None = None
        try:
            for call in pending:
                if call.call_id in results:
                    continue
                if self.want_events:
                    yield ToolCallStarted(call)
                running = self._execute(call)
                results[call.call_id] = result = await self.writer.guard(running)
                if self.want_events:
                    yield ToolCallFinished(call, result)
            answer = [message := self._add_answer(pending, results)] if pending else []
            saved = await self.writer.save_answer(self.ctx, [*answer, *self._add_held(held, self._head + len(answer))])
            self._answered(pending)
        except BaseException as exc:  # a run cut here that keeps its input answers every call first
            cut = self._cut_repair(pending, results, message, running, answers_all(self.writer, self.ctx, exc))
            await save_cut_answer(self.writer, self.ctx, cut, exc)  # what was held stays so, for the next run
            raise
        if self.want_events and saved:
            yield StepPersisted(0, saved)
        self._chain.raise_failure()

    def _add_answer(self, pending: list[FunctionCall], results: dict[str, FunctionResult]) -> Message:
        """Put the answer of the calls the log left open right after the history in the working set; return it."""
        message = self._contexts.attach(
            self.approvals.answer(pending, [results[c.call_id] for c in pending], REPAIR), pending)
        self._parts.insert(self._head, Segment(message.source or REPAIR, [message], _tagged=[message]))
        self.state.new_messages.append(message)
        for call in pending:
            self._threads.answering(call, message)
        return message

    def _answered(self, pending: list[FunctionCall]) -> None:
        """Note that the answer of the calls the log left open is saved (and what their exchange held)."""
        self.approvals.answered()
        for call in pending:
            self._threads.saved(call)

    def _add_held(self, held: list[Message], at: int) -> list[Message]:
        """Put the late results an exchange held (`ApprovalGate.held_after`) at `at` in the working set; return them."""
        self._parts[at:at] = [Segment(m.source or REPAIR, [m], _tagged=[m]) for m in held]
        self.state.new_messages.extend(held)
        return held

    def _cut_repair(self, pending: list[FunctionCall], results: dict[str, FunctionResult], message: Message | None,
                    running: asyncio.Future[FunctionResult] | None, whole: bool) -> Message | None:
        """Return the answer of a repair cut short: what its calls got, and (`whole`) the rest answered as cut."""
        if running is not None and (got := returned(running)) is not None:
            results.setdefault(got.call_id, got)  # it returned as the run was cut: its answer
        cut = message if message is not None else cut_answer(
            pending, results, idempotent=self._idempotent, threaded=self._threads.unanswered, answered_only=not whole)
        return cut and self._contexts.attach(cut, pending)

    # --- model step ---------------------------------------------------------------------------------

    def _final(self) -> bool:
        """Return True when the next call gets no tools (a limit was reached)."""
        state, limits = self.state, self.limits
        return state.steps >= limits.max_steps or state.error_steps >= limits.max_consecutive_tool_errors

    def _request(self) -> ModelRequest:
        """Build the next request: a snapshot view of the working set (middleware and models may keep it)."""
        ctx = self.ctx
        self._view = MessageView(self._parts, tuple(self._tail), checked_tail=self._checked)
        self._final_call = self._final()
        return ModelRequest(self._view, ctx.instructions, () if self._final_call else self._specs, ctx.settings)

    def _model_step(self, request: ModelRequest, response: ModelResponse | None, latency: float,
                    ratio: float) -> ModelStep:
        """Record what one model call produced: usage, the normalised output, the trace; return the `ModelStep`."""
        assert response is not None
        ctx, state = self.ctx, self.state
        final = self._final_call
        step = state.steps + 1
        state.steps = step
        if response.usage is not None:
            state.usage = state.usage + response.usage
        produced, notes = normalise_calls([m.with_source(self._model_source) for m in response.messages],
                                          set(self.open_at_start))
        self._mark_stop(step, produced)
        if notes:
            ctx.journal.changes.append(ContextChange("model", "normalised_output", tuple(notes)))
        if response.notes:
            ctx.journal.changes.append(ContextChange(self.model.name, "adapted_request", response.notes))
        # Without middleware the model was sent the loop's own request; with it, the request that reached it.
        sent = (response.request or request) if ctx.middleware or self.stream else request
        if sent.messages is self._view:  # the check ran on the loop's own view: its tail need not be scanned again
            self._checked = len(self._tail)
        if response.usage is not None and not self._calibrated and ctx.tokens.ratio == ratio:
            # Every agent's estimates learn from what the model reports: once a run (a pass over the
            # whole request, untagged), and not when a middleware learned from this call already.
            self._calibrated = True
            ctx.tokens.learn(sent.instructions, sent.tools, untagged(sent.messages), response.usage.input_tokens)
        self._trace(step, sent, response, latency, ratio)
        self._tail.extend(produced)
        state.new_messages.extend(produced)
        return ModelStep(step, final, produced, [c for m in produced for c in m.function_calls])

    def _trace(self, step: int, sent: ModelRequest, response: ModelResponse, latency: float, ratio: float) -> None:
        ctx = self.ctx
        journal = ctx.journal
        trace = PromptTrace(
            step, self.model.name, response.usage, latency, response.finish_reason, journal.take_compaction(),
            journal.take_changes(), _request=sent, _instruction_sources=ctx.instruction_sources,
            _tool_sources=self._tool_sources, _counter=ctx.tokens, _ratio=ratio, _journal=journal,
            _previous=previous_prefix(ctx))
        journal.traces.append(trace)
        watch_cache(ctx, trace)

    async def _call_model(self, request: ModelRequest) -> AsyncIterator[TextDelta | ReasoningDelta | ModelResponse]:
        """Send `request` through the chain, streaming; yield the deltas as they arrive, then the response."""
        queue: asyncio.Queue[object] = asyncio.Queue()
        call = chain(self.ctx.middleware, self._terminal(queue.put_nowait))
        task = asyncio.ensure_future(call(request))
        task.add_done_callback(lambda _: queue.put_nowait(_DONE))
        try:
            while (item := await self.writer.guard(queue.get())) is not _DONE:
                assert isinstance(item, TextDelta | ReasoningDelta)
                yield item
            yield task.result()
        finally:
            if not task.done():
                task.cancel()

    async def _send(self, request: ModelRequest) -> ModelResponse:
        """Check the request and complete it: the innermost call when there is no middleware."""
        check_messages(request.messages, latest_input=self._latest_input)
        return await self.model.complete(request)

    def _terminal(self, on_delta: Callable[[TextDelta | ReasoningDelta], None]) -> CallModel:
        """Return the innermost call: it checks the request, sends it, returns the response and what was sent."""

        async def send(request: ModelRequest) -> ModelResponse:
            if not self.stream:
                return with_request(await self._send(request), request)
            check_messages(request.messages, latest_input=self._latest_input)
            response = await consume(self.model.stream(request), on_delta, self.model.name)
            return with_request(response, request)

        return send

    # --- tool step ----------------------------------------------------------------------------------

    async def _tool_step(self, step: ModelStep) -> AsyncGenerator[RunEvent, None]:
        """Save the model's output, run the calls it made (saving each result at once), decide what next.

        Parallel calls run concurrently, each result saved (its own tool message) as soon as it is
        produced. Sets `_stop` when the run is over.
        """
        produced, calls = await self._held(step)
        self._unconfirmed = produced  # until its save returns (`_settle` saves it again before it answers its calls)
        persisted = await self._save(step.step, produced)
        self._unconfirmed = []
        if persisted is not None:
            yield persisted
        if not calls:
            self._stop = Stop(self._stop_reason(step))
            return
        self._inbox.forget()  # the next boundary may skip the queue's read only on what a save after the tools saw
        self._contexts.expect(step.produced, calls)
        if self.want_events:
            for c in calls:
                yield ToolCallStarted(c)
        by_id = {c.call_id: c for c in calls}
        # One call (the common case) is awaited directly: no task, no concurrency to arrange.
        tasks = [self._execute(c) for c in calls] if len(calls) > 1 else []
        errors = 0
        answered: set[str] = set()
        saving: Message | None = None  # the result being saved, if a save is in progress
        try:
            for arrival in asyncio.as_completed(tasks) if tasks else [self._call_tool(calls[0])]:
                result = await self.writer.guard(arrival)
                call = by_id[result.call_id]
                answered.add(call.call_id)
                message = saving = self._add_tool_message([call], [result])
                errors += result.is_error
                self._threads.answering(call, message)
                # Saved before it is announced: a reader that stops at the announcement loses nothing.
                persisted = await self._save(step.step, [message], durable=not deferrable(self._tools, call, message))
                saving = None
                self._threads.saved(call)
                if self.want_events:
                    yield ToolCallFinished(call, result)
                if persisted is not None:
                    yield persisted
        except BaseException as exc:
            await self._keep_finished(tasks, by_id, answered, saving, exc)
            raise
        finally:
            for task in tasks:
                task.cancel()
        self._chain.raise_failure()  # every call of the step has its result saved: now a middleware's error
        self.state.error_steps = self.state.error_steps + 1 if errors == len(calls) else 0

    async def _keep_finished(self, tasks: Sequence[asyncio.Future[FunctionResult]], by_id: dict[str, FunctionCall],
                             answered: set[str], saving: Message | None, error: BaseException) -> None:
        """Save the results of a tool step cut short that exist already, so no call that completed is lost.

        That is the result whose save was cut (saved again: appends are idempotent by id) and those
        of parallel calls that finished before the loop took their result. Calls still running are
        cancelled; a sync tool's thread among them is waited for by `_settle`.
        """
        for task in tasks:
            task.cancel()
        if self.writer.lost is not None:
            return
        messages = [] if saving is None else [saving]
        finished = [r for task in tasks if (r := returned(task)) is not None and r.call_id not in answered]
        for result in finished:
            call = by_id[result.call_id]
            messages.append(message := self._add_tool_message([call], [result]))
            self._threads.answering(call, message)
        what = "the results of calls that finished"
        if not messages or not await self.writer.save_stopping(self.ctx, messages, error, what):
            return
        for result in finished:
            self._threads.saved(by_id[result.call_id])

    async def _held(self, step: ModelStep) -> tuple[list[Message], list[FunctionCall]]:
        """`_answer_withdrawn`; then the calls that need approval are marked in the model's message, and not run."""
        produced, calls = self._answer_withdrawn(step)
        if calls and self.approvals.watches(self._tools):
            produced, calls = await self.writer.guard(self.approvals.check(produced, calls, self._contexts))
            self._tail[-len(produced):] = self.state.new_messages[-len(produced):] = produced
            if self.approvals.pending:  # the other calls run, then the run stops
                self._stop = Stop(self.approvals.stop_reason())
        return produced, calls

    def _answer_withdrawn(self, step: ModelStep) -> tuple[list[Message], list[FunctionCall]]:
        """Return the messages to save and the calls to run.

        A model that called tools after they were withdrawn gets every call answered with an
        error (so the log never holds an unanswered call), and nothing is run.
        """
        if not (step.final and step.calls):
            return step.produced, step.calls
        why = (f"the run's step limit (max_steps={self.limits.max_steps}) was reached"
               if self._stop_reason(step) == "max_steps" else
               f"the run stopped after {self.limits.max_consecutive_tool_errors} steps in a row whose tool calls "
               "failed (max_consecutive_tool_errors)")
        withdrawn = self._add_tool_message(step.calls, [FunctionResult(
            c.call_id, f"Error: not run; {why}.", is_error=True) for c in step.calls], stop=self._stop_reason(step))
        return [*step.produced, withdrawn], []

    def _stop_reason(self, step: ModelStep) -> StopReason:
        if not step.final:
            return self.approvals.stop_reason() if self.approvals.pending else "completed"
        return self._limit_reason(step.step)

    def _limit_reason(self, step: int) -> StopReason:
        return "max_steps" if step > self.limits.max_steps else "tool_errors"

    def _mark_stop(self, step: int, produced: list[Message]) -> None:
        """Say in the last message of a call made at a limit (tools withdrawn) why the run stops there, for its replay.

        A call that calls tools anyway has them answered "not run", and that answer is marked instead.
        """
        if self._final_call and produced and not any(m.tool_flag & 1 for m in produced):
            produced[-1] = marked_stopped(produced[-1], self._limit_reason(step))

    def _add_tool_message(self, calls: Sequence[FunctionCall], results: Sequence[FunctionResult], *,
                          stop: StopReason | None = None) -> Message:
        message = self._contexts.attach(tool_message(calls, results), calls)
        if stop is not None:
            message = marked_stopped(message, stop)
        self._tail.append(message)
        self.state.new_messages.append(message)
        return message

    def _idempotent(self, call: FunctionCall) -> bool:
        tool = self._tools.get(call.name)
        return tool is not None and tool.runs_again

    async def _save(self, step: int, messages: Sequence[Message], *, durable: bool = True) -> StepPersisted | None:
        """Save `messages` now; return the event saying so (None when nothing was saved or no events are wanted)."""
        saved = await self.writer.save_step(self.ctx, messages, durable=durable)
        return StepPersisted(step, saved) if self.want_events and saved else None
