"""The repair of a loaded history before a run's first model call (`contextpipe._run.loop` does the rest).

`check_history` checks the history's tool exchanges once and repairs, in the run's view only, a
log that breaks the rules (`contextpipe.exchanges.repair_exchanges`). Calls still open at the very
end (a crash, a kill, a cancelled run) are the loop's to answer: recorded results are kept, calls
to tools that run again (`Tool.runs_again`: idempotent, retry_with_key, outbox) run again, every
other call is answered `interrupted`.

A run cut while it answers them (cancelled, a stream closed early) and that still has its input
to keep (`StepWriter.save_input`) first answers every one of them (`cut_answer`): the input may
never be stored between a call and its result. So does a run stopped before its loop read the
history (in a provider's `before_run`), from the log's end (`answer_open_end`). Any other run cut
there saves the answers its calls got (`answers_all`), and leaves the rest open for the next run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..exchanges import exchange_problem, repair_exchanges, tool_message
from ..messages import FunctionCall, FunctionResult, Message, Source
from ..pipeline import Segment
from .calls import interrupted, not_run_again

if TYPE_CHECKING:
    from ..pipeline import RunContext
    from .writer import StepWriter

__all__ = ["REPAIR", "answer_open_end", "answers_all", "check_history", "cut_answer", "keep_input", "save_cut_answer"]

REPAIR = Source("tool", "repair")
"""The source of the messages a repair adds."""


def check_history(head: Sequence[Segment]) -> tuple[list[Segment], list[Message], list[str]]:
    """Check the loaded history's tool exchanges once, segment by segment; repair it if it breaks the rules.

    Returns the segments to send (complete ones frozen and marked, so the check before each model
    call skips them), the history when it may end in calls without results (empty when every
    segment is complete) and the repair notes.
    """
    checked = [_checked(s) for s in head]
    for s in checked:
        if not s._checked:
            break
    else:
        return checked, [], []
    fixed, notes = repair_exchanges([m for s in head for m in s.messages])
    return (_resegment(fixed, head) if notes else checked), fixed, notes


def cut_answer(pending: Sequence[FunctionCall], results: Mapping[str, FunctionResult], *,
               idempotent: Callable[[FunctionCall], bool], threaded: Callable[[FunctionCall], bool],
               answered_only: bool = False) -> Message | None:
    """Return the answer of a repair cut short: each call left open with what it got, or why it has nothing.

    A call run in a thread is left out (`threaded`: the loop records the thread's result once it
    is done, `contextpipe._run.threads`); the others keep the result they got before the cut, or
    are answered `not_run_again` (idempotent tools) or `interrupted` (the rest, as the repair
    would have). With `answered_only` (a run that keeps no input) the calls without a result are
    left out too, open for the next run. None when every call is left out.
    """
    calls = [c for c in pending if not threaded(c) and (not answered_only or c.call_id in results)]
    if not calls:
        return None
    answers = [results.get(c.call_id) or (not_run_again(c) if idempotent(c) else interrupted(c)) for c in calls]
    return tool_message(calls, answers).with_source(REPAIR)


def answers_all(writer: StepWriter, ctx: RunContext, error: BaseException) -> bool:
    """Tell whether a repair cut by `error` answers every call it was to answer (`cut_answer`), to keep its input.

    Only a run stopped from outside (not an `Exception`) keeps its input, and only one that has
    input to keep (`StepWriter.keeps_input`); any other saves only the answers its calls got.
    """
    return not isinstance(error, Exception) and writer.keeps_input(ctx)


async def save_cut_answer(writer: StepWriter, ctx: RunContext, answer: Message | None, error: BaseException) -> None:
    """Save the `answer` of a repair cut by `error` (`cut_answer`; all its calls or those answered: `answers_all`).

    Whether or not the run keeps its input, what its calls got is saved: a call a person approved
    that completed is never answered "interrupted" by the next run. The calls left out stay open
    for the next run (which runs calls to tools that run again), even by a run saved per run
    (`StepWriter.save_answer`). A failed save is a note on `error`, and the input is not kept then.
    """
    if answer is None or writer.lost is not None:
        return
    try:
        await writer.keep(writer.save_answer(ctx, [answer]), error)
    except Exception as exc:
        error.add_note(f"the answers to the calls the session's previous run left open could not be saved: "
                       f"{type(exc).__name__}: {exc}")


async def answer_open_end(writer: StepWriter, ctx: RunContext) -> None:
    """Answer the calls the log's end leaves open, for a run stopped before its loop read the history.

    The run keeps its input (`StepWriter.save_input`) after them: each call is answered as by a
    repair cut before it ran anything (`cut_answer`). Nothing to do once the loop read the history.
    A call awaiting a person's decision is left open (`contextpipe._run.approvals`), so the input is not kept.
    """
    if writer.history_read:
        return
    calls = await writer.open_calls()
    writer.left_open(calls)
    tools = ctx.tools
    answer = cut_answer([c for c in calls if c.call_id not in writer.awaiting_approval], {},
                        threaded=lambda _: False,
                        idempotent=lambda c: (tool := tools.get(c.name)) is not None and tool.runs_again)
    if answer is not None:
        await writer.save_step(ctx, [answer], with_request=False)


def _checked(segment: Segment) -> Segment:
    """Return `segment` frozen and marked checked when its tool exchanges are complete, else as it is."""
    if segment._checked or exchange_problem(segment.messages) is not None:
        return segment
    return Segment(segment.source, tuple(segment.messages), segment.first_seq, segment._tagged, _checked=True)


def _resegment(messages: Sequence[Message], segments: Sequence[Segment]) -> list[Segment]:
    """Split repaired `messages` back into segments by the source each had (new ones: the repair's)."""
    origin = {m.id: s.source for s in segments for m in s.messages}
    out: list[Segment] = []
    for message in messages:
        source = origin.get(message.id, REPAIR)
        if out and out[-1].source == source:
            out[-1].messages.append(message)  # type: ignore[attr-defined]
        else:
            out.append(Segment(source, [message]))
    return out


async def keep_input(writer: StepWriter, ctx: RunContext, interruption: BaseException) -> None:
    """Save the input of a run interrupted before its first answer was saved; a failure becomes a note.

    Interrupted means stopped from outside (a cancelled task, Ctrl-C, a stream closed early): not
    an `Exception`. A run that failed keeps no input here (its tool threads' results may still save
    it, with the model output they follow: `StepLoop._settle`). The calls the session's previous run
    left open are answered first when the loop did not get to them (`answer_open_end`).
    """
    if isinstance(interruption, Exception) or not writer.keeps_input(ctx):
        return
    try:
        # Stopped before the loop read the history: the calls left open are answered first.
        await writer.leaving(answer_open_end(writer, ctx), interruption)
        await writer.leaving(writer.save_input(ctx), interruption)
    except Exception as exc:
        interruption.add_note(f"the run's input could not be kept in the session: {type(exc).__name__}: {exc}")
