"""The step loop of a run with an output type: a final answer that does not validate is sent back.

`OutputLoop` is the `StepLoop` of ``agent.run(..., output_type=...)``. When the model gives its final
answer (no tool calls, nothing waiting for a person), the answer is validated against the run's
`OutputSchema`. If it does not match and retries are left, the answer is marked invalid in its
metadata (`OUTPUT_KEY`) and a correction message follows it: a user message, sourced from the
run's output check (``Source("tool", "output")``), with the validation errors and the schema. Both
are saved with the step, like any model output, and the loop goes on to another model call. Each
attempt's trace says how it went (a ``validated_output`` or ``invalid_output`` change); the result
holds the validated value, or the last answer and its errors once retries run out
(`OutputValidationError`).

A replay reads the marks back (`contextpipe._run.replay`): an answer marked invalid is not the
run's final answer, and a correction is part of the run, so an interrupted retry resumes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from .._compat import override
from ..errors import OutputValidationError, UsageError, clause
from ..events import NoOutput, RunResult
from ..messages import Message, Source
from ..models.base import ModelSettings
from ..trace import ContextChange
from .loop import ModelStep, StepLoop
from .replay import final_text

if TYPE_CHECKING:
    from ..events import RunEvent
    from ..messages import FunctionCall
    from ..output import OutputSchema

__all__ = ["OUTPUT_KEY", "OUTPUT_SOURCE", "OutputCheck", "OutputLoop", "output_check", "with_output"]

OUTPUT_KEY: Final = "output"
"""Metadata key: ``invalid`` on a final answer that did not validate, ``correction`` on the message sent back."""

OUTPUT_SOURCE: Final = Source("tool", "output")
"""The source of a correction message: the run's output check."""


@dataclass(slots=True)
class OutputCheck:
    """How the validation of a run's answers went."""

    schema: OutputSchema[Any]
    """The run's output type."""
    retries: int
    """How many times an answer that does not validate is sent back."""
    attempts: int = 0
    """Answers validated so far."""
    value: Any = None
    """The validated output, once an answer validated."""
    valid: bool = False
    """Whether an answer validated."""
    raw: str = ""
    """The last answer validated."""
    errors: str = ""
    """What was wrong with the last answer, when it did not validate."""


class OutputLoop(StepLoop):
    """A `StepLoop` that validates the final answer and sends it back with the errors when it does not match."""

    def __init__(self, *args: Any, output: OutputCheck, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.output = output
        """The validation of the run's answers."""
        self._retrying = False

    @override
    async def _held(self, step: ModelStep) -> tuple[list[Message], list[FunctionCall]]:
        produced, calls = await super()._held(step)
        if calls or self.approvals.pending or not produced or any(m.function_calls for m in produced):
            return produced, calls  # not a final answer (tool calls, or the calls of one made past a limit)
        check = self.output
        check.attempts += 1
        check.raw = final_text(produced)
        import pydantic  # loaded by the run's OutputSchema already

        try:
            check.value, check.valid, check.errors = check.schema.validate(check.raw), True, ""
        except pydantic.ValidationError as exc:
            check.errors = str(exc)
            self._retrying = not step.final and check.attempts <= check.retries
            self._note(step, "invalid_output", f"attempt {check.attempts}: {exc.error_count()} error(s)"
                       + ("; sent back to the model" if self._retrying else "; no retries left"))
            if self._retrying:
                produced = self._send_back(produced, check.schema.correction(exc))
            return produced, calls
        self._note(step, "validated_output", f"attempt {check.attempts} validated as {check.schema.name}")
        return produced, calls

    @override
    async def _tool_step(self, step: ModelStep) -> AsyncGenerator[RunEvent, None]:
        async with aclosing(super()._tool_step(step)) as events:
            async for event in events:
                yield event
        if self._retrying:  # the answer and its correction are saved: the model gets another call
            self._retrying = False
            self._stop = None

    def _send_back(self, produced: list[Message], correction: str) -> list[Message]:
        """Mark the last answer invalid, add the correction after it; return the messages to save."""
        last = produced[-1]
        marked = Message(last.role, last.parts, last.id, last.author_name, last.created_at,
                         {**last.metadata, OUTPUT_KEY: "invalid"}, last.source)
        message = Message.user(correction, metadata={OUTPUT_KEY: "correction"}, source=OUTPUT_SOURCE)
        for messages in (self._tail, self.state.new_messages):
            if messages and messages[-1] is last:
                messages[-1] = marked
            messages.append(message)
        return [*produced[:-1], marked, message]

    def _note(self, step: ModelStep, action: Literal["validated_output", "invalid_output"], note: str) -> None:
        """Say on the step's trace how its answer validated."""
        traces = self.ctx.journal.traces
        if traces and traces[-1].step == step.step:
            traces[-1].changes = (*traces[-1].changes, ContextChange("output", action, (note,)))


def output_check(output_type: type[Any] | None, retries: int,
                 settings: ModelSettings | None) -> tuple[OutputCheck | None, ModelSettings | None]:
    """Return the check of a run's answers against `output_type` (None for plain text), and the run's settings.

    The settings ask the model for the schema (``response_format``); they replace one given.
    """
    if output_type is None or output_type is str:
        return None, settings
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise UsageError(f"output_retries must be a whole number, 0 or more, not {retries!r}")
    from ..output import OutputSchema  # here: a run without an output type never loads it (nor pydantic for it)

    try:
        schema: OutputSchema[Any] = OutputSchema(output_type)
    except Exception as exc:  # pydantic's errors for a type it cannot describe
        raise UsageError(f"output_type {output_type!r} cannot be described as a JSON schema: {clause(exc)}; "
                         "use a pydantic model, a dataclass, a TypedDict or a plain type") from exc
    asked = ModelSettings(response_format=schema.response_format())
    return OutputCheck(schema, retries), (settings or ModelSettings()) | asked


def with_output(result: RunResult[Any], check: OutputCheck | None) -> RunResult[Any]:
    """Put the run's validated output on `result`; raise `OutputValidationError` when its last answer did not match.

    A replayed result (`contextpipe._run.replay`) is validated here, from its final answer.
    """
    if check is None:
        return result
    if result.replayed and result.stop_reason == "completed":
        try:
            check.value, check.valid, check.attempts = check.schema.validate(result.text), True, 1
        except ValueError as exc:  # pydantic.ValidationError is one
            check.raw, check.errors, check.attempts = result.text, str(exc), 1
    if check.valid:
        result._output = check.value
    elif check.attempts:
        result._output = NoOutput(f"no answer matched the output type ({check.attempts} attempt(s)); the last "
                                  "answer is the result's text")
        raise OutputValidationError(check.raw, check.errors, check.attempts, result)
    else:
        result._output = NoOutput(
            f"the run stopped with stop_reason={result.stop_reason!r} before its final answer, so it has no output; "
            "resume it (agent.run(None, session=..., output_type=...)) once its calls are decided, or raise its limits")
    return result
