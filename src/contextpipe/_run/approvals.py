"""One run's approvals (`contextpipe.approvals`): which calls wait for a person, and what the run was told.

A run meets approvals in three places:

- before the providers' `before_run` (`ApprovalGate.decide`), under the run's lease: the decisions
  the run was given must each name a call awaiting approval at the end of the session's log (with
  the digest of its arguments, when the decision carries one), or the run is refused with
  `ApprovalError` before anything runs or is stored.
- before the first model call (`ApprovalGate.resume`), among the calls a previous run left open:
  a call awaiting approval runs (approved, or its tool always allowed in the session), is answered
  with the rejection (an error result the model reads), or stays open (no decision yet): the run
  then stops again with ``approval_required`` without calling the model, and new input is refused
  (`ApprovalError`: it would come between a call and its result). The approvals are saved in the
  session's state (`STATE_KEY`) before the approved calls start, and so are the calls that run
  because their tool is always allowed: a run killed while one runs leaves that mark, and the next
  run answers the call as any call a killed run left open (run again if its tool runs again:
  idempotent, retry_with_key or outbox; else "interrupted"), never asking again, never running it twice.
  A run that fails before (a provider's before_run) has saved nothing: the calls still wait.
- after each model call (`ApprovalGate.check`): the calls that need approval are marked in the
  model's message (`AWAITING_KEY`, saved with it), the others run, and the run stops.

A call to a `contextpipe.ClientTool` waits the same way, also marked as the client's (`CLIENT_KEY`):
never allowed by a policy or an "always", only answered (`Answer`, stored as its result) or rejected.
The run stops with ``client_tool_calls`` when only such calls wait (`ApprovalGate.stop_reason`).

A sync tool among the others that timed out has a late result still to come (`contextpipe._run.threads`),
and it may not go into the log while calls of its exchange wait: nothing comes between a call and
its result. The run holds it in the session's state instead (`ApprovalGate.hold_late`), and the run
that answers the exchange puts it right after the answer (`ApprovalGate.held_after`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..approvals import (
    AWAITING_KEY,
    CLIENT_KEY,
    DECISIONS_KEY,
    STATE_KEY,
    AgentApprovalPolicy,
    Answer,
    Approval,
    ApprovalCheck,
    Decision,
    PendingApproval,
    Rejection,
    arguments_digest,
    awaiting_approval,
    client_calls,
)
from ..errors import ApprovalError, CodecError, LeaseLost, UsageError, clause, shorten
from ..events import StopReason
from ..exchanges import LATE_RESULT_KEY, last_exchange, tool_message
from ..messages import FunctionCall, FunctionResult, Message, Source
from ..session import Session
from ..trace import ApprovalAction, TracedToolCall
from .calls import interrupted

if TYPE_CHECKING:
    from ..providers.base import HistoryProvider
    from ..tool_context import ToolContext
    from ..tools import Tool
    from ..trace import RunJournal
    from .calls import CallContexts
    from .writer import StepWriter

__all__ = ["APPROVAL", "ApprovalGate", "agent_policy", "pending_in"]

APPROVAL = Source("tool", "approval")
"""The source of the tool message answering calls a person decided."""


def agent_policy(policy: AgentApprovalPolicy | None) -> ApprovalCheck | None:
    """Return the check of ``Agent(needs_approval=policy)``: the function given, or one matching tool names."""
    if policy is None or callable(policy):
        return policy
    patterns = (policy,) if isinstance(policy, str) else tuple(policy)
    if not all(isinstance(p, str) for p in patterns):
        raise UsageError(f"needs_approval must be a function (ctx, arguments) -> bool | str or tool names "
                         f"(fnmatch patterns such as 'git_*'), got {shorten(policy)}")
    if not patterns:  # no tool named: no call is checked
        return None

    from fnmatch import fnmatchcase  # here: an agent without a policy of tool names never loads it

    def covers(ctx: ToolContext[Any], arguments: dict[str, Any]) -> bool | str:
        for pattern in patterns:
            if fnmatchcase(ctx.tool_name, pattern):
                return f"the agent's approval policy covers tool {ctx.tool_name!r} ({pattern!r})"
        return False

    return covers


def _waiting(history: Sequence[Message]) -> tuple[Message | None, dict[str, FunctionCall]]:
    """Return the last model message of `history` and its calls marked as awaiting approval, still without a result."""
    message, open_ = last_exchange(history)
    marked = awaiting_approval(message)
    return message, {c.call_id: c for c in open_ if c.call_id in marked}


def pending_in(history: Sequence[Message], session: Session) -> list[PendingApproval]:
    """Return the calls awaiting a decision at the end of `history` (`session`'s log), as a run would find them.

    A call marked as awaiting approval and without a result waits, unless an earlier run approved
    it (it may have run: the next run answers it as any call a stopped run left open) or its tool
    is always allowed in the session (the next run runs it without asking).
    """
    message, waiting = _waiting(history)
    if message is None:
        return []
    marked, kept, client = awaiting_approval(message), _Kept.read(session), client_calls(message)
    return [PendingApproval(c.call_id, c.name, c.arguments, marked[c.call_id], message.id, client=c.call_id in client)
            for c in waiting.values()
            if c.call_id in client or (not kept.approved_earlier(c, message) and c.name not in kept.always)]


@dataclass(slots=True)
class _Kept:
    """What the session's state keeps of its approvals (`STATE_KEY`)."""

    approved: dict[str, dict[str, str]]
    """Approved calls not known to be answered yet: call id -> the id of the message that made it and its digest."""
    always: set[str]
    """Tools always allowed in the session."""
    late: list[dict[str, Any]] = field(default_factory=list)
    """Late results held until their exchange is answered (`ApprovalGate.hold_late`), as stored messages."""

    @classmethod
    def read(cls, session: Session | None) -> _Kept:
        raw = session.state.get(STATE_KEY) if session is not None else None
        if raw is None:
            return cls({}, set())
        assert session is not None
        try:
            approved = {str(k): {"message_id": str(v["message_id"]), "digest": str(v["digest"])}
                        for k, v in dict(raw.get("approved", {})).items()}
            late = [dict(m) for m in raw.get("late", [])]
            return cls(approved, {str(t) for t in raw.get("always", [])}, late)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"session {shorten(session.id)}: state under key {STATE_KEY!r} is not the session's "
                             f"approvals ({type(exc).__name__}: {clause(exc)}); remove the key to start afresh"
                             ) from exc

    def write(self, session: Session) -> None:
        if self.approved or self.always or self.late:
            session.state[STATE_KEY] = {"approved": dict(self.approved), "always": sorted(self.always),
                                        **({"late": list(self.late)} if self.late else {})}
        else:
            session.state.pop(STATE_KEY, None)

    def keep(self, message: Message, waiting: Mapping[str, FunctionCall], new: Mapping[str, Decision]) -> None:
        """Keep the `new` approvals of calls `message` made; forget those of calls no longer `waiting` (answered)."""
        self.approved = {k: v for k, v in self.approved.items() if k in waiting and v["message_id"] == message.id}
        for call_id, decision in new.items():
            call = waiting[call_id]
            if isinstance(decision, Approval):
                self.approved[call_id] = {"message_id": message.id,
                                          "digest": arguments_digest(call.name, call.arguments)}
                if decision.always:
                    self.always.add(call.name)

    def approved_earlier(self, call: FunctionCall, message: Message) -> bool:
        """Tell whether an earlier run approved `call` (made by `message`) and may have started it."""
        mark = self.approved.get(call.call_id)
        return mark is not None and mark["message_id"] == message.id and \
            mark["digest"] == arguments_digest(call.name, call.arguments)


def _new_decision(call_id: str, decision: Decision, call: FunctionCall | None, message: Message | None,
                  kept: _Kept, history: Sequence[Message], session: Session) -> bool:
    """Check one decision (see `ApprovalGate.decide`); return False for an approval an earlier run recorded already."""
    if not isinstance(decision, Approval | Rejection | Answer):
        raise UsageError(f"approvals[{shorten(call_id)}] is {type(decision).__name__}: give approve() or "
                         "reject('why') (or pending.approve() / pending.reject('why'), bound to the arguments shown; "
                         "pending.answer(result) for a client tool's call)")
    if call is None or message is None:
        answered = any(r.call_id == call_id for m in history for r in m.function_results)
        raise ApprovalError(
            f"call {shorten(call_id)} of session {shorten(session.id)} has been answered already (another "
            "decision may have won: one run at a time holds the session); nothing was run. Its answer is in "
            "the session's log (agent.history(session))" if answered else
            f"call {shorten(call_id)} is not awaiting approval in session {shorten(session.id)}; nothing was "
            f"run. Calls awaiting approval: {_listed(history)}", call_ids=[call_id])
    digest = arguments_digest(call.name, call.arguments)
    if decision.digest is not None and decision.digest != digest:
        raise ApprovalError(
            f"the decision on call {shorten(call_id)} was made for other arguments than those of the call awaiting "
            f"approval ({call.name}({shorten(call.arguments)})); nothing was run. Decide again on the call as "
            "it is (result.pending_approvals)", call_ids=[call_id])
    from ..client_tools import misfit  # here: a run given no decision never loads the tools machinery

    misfit(call, decision, call.call_id in client_calls(message))
    if not kept.approved_earlier(call, message):
        return True
    if isinstance(decision, Approval):
        return False
    raise ApprovalError(
        f"call {shorten(call_id)} to {call.name!r} was approved by an earlier run, which may have run it before it "
        "stopped; it can no longer be rejected. Resume the session (agent.run(None, session=...)): the call is "
        "answered as interrupted, or run again if its tool runs again (idempotent, retry_with_key, outbox)",
        call_ids=[call_id])


def _listed(history: Sequence[Message]) -> str:
    message, open_ = last_exchange(history)
    marked = awaiting_approval(message)
    return ", ".join(f"{c.name} ({c.call_id})" for c in open_ if c.call_id in marked) or "none"


class ApprovalGate:
    """Decides which tool calls of one run wait for a person, and answers the ones decided (module docstring)."""

    def __init__(self, policy: ApprovalCheck | None = None, session: Session | None = None,
                 writer: StepWriter | None = None) -> None:
        self._policy = policy
        self._session = session
        self._writer = writer
        self._decided: dict[str, Decision] = {}  # this run's new decisions, checked by `decide`
        self._asked: tuple[Message, dict[str, FunctionCall]] | None = None  # the message and the calls they decide
        self._baseline: dict[str, Any] | None = None  # the session's state before the providers ran
        self._kept = _Kept.read(session)
        self._tools: Mapping[str, Tool] | None = None
        self._watching = False
        self._actions: dict[str, ApprovalAction] = {}  # how each call about to run (or rejected) was decided
        self._released: set[str] = set()  # the ids of the held late results given back (`held_after`)
        self._wait_stored = False  # whether the calls waiting for a person are in the log (found there)
        self._logged: set[str] = set()  # the ids of the calls the log left open at the run's start
        self._unsaved_late: list[Message] = []  # per run, late results to hold once the run is saved
        self.pending: list[PendingApproval] = []
        """The calls awaiting a person's decision: the run stops (``approval_required``) when there are any."""

    async def decide(self, approvals: Mapping[str, Decision] | None, loader: HistoryProvider | None) -> None:
        """Check the run's decisions against the calls awaiting approval at the end of the session's log.

        Called under the run's lease, before the providers' before_run: raises `ApprovalError`
        (nothing run, nothing stored) for a decision that names no call awaiting approval or was
        made for other arguments. An approval sent again for a call an earlier run approved is
        accepted and left out: that run may have run it, so the call is answered as any call a
        stopped run left open. The approvals are kept in the session's state by `resume`, before
        the calls run.
        """
        session, writer = self._session, self._writer
        if not approvals:
            self._keep_baseline()
            return
        if session is None or loader is None or writer is None:
            raise UsageError("approvals= decides tool calls awaiting approval in a session's log: pass "
                             "session=..., to an agent whose history loads the session's messages")
        history = (await writer.guard(loader.load_view(session))).messages
        message, waiting = _waiting(history)
        self._decided = {call_id: decision for call_id, decision in approvals.items()
                         if _new_decision(call_id, decision, waiting.get(call_id), message, self._kept, history,
                                          session)}
        if message is not None and any(isinstance(d, Approval) for d in self._decided.values()):
            self._asked = (message, waiting)
        self._keep_baseline()

    def _keep_baseline(self) -> None:
        """Copy the session's state (no provider changes it) when this run may save approvals in it.

        It may when it approves a call, or when a call awaiting approval runs because its tool is
        always allowed in the session.
        """
        if self._session is not None and (self._asked is not None or self._kept.always):
            self._baseline = json.loads(json.dumps(self._session.state_to_json()))

    def watches(self, tools: Mapping[str, Tool]) -> bool:
        """Tell whether a call to one of the run's `tools` may need approval (a tool, or the agent's policy, asks)."""
        if tools is not self._tools:  # the run's tools are fixed once the providers' before_run is over
            self._tools = tools
            self._watching = self._policy is not None or any(t.needs_approval for t in tools.values())
        return self._watching

    # --- after a model call -------------------------------------------------------------------------

    async def check(self, produced: list[Message], calls: list[FunctionCall],
                    contexts: CallContexts) -> tuple[list[Message], list[FunctionCall]]:
        """Return the model's messages (calls that need approval marked), and the calls to run now.

        The calls that need approval are `pending`, unless their tool is always allowed in the session.
        """
        from ..client_tools import ClientTool  # here: only a step with tool calls gets here

        self._actions.clear()
        contexts.expect(produced, calls)
        made_by = {c.call_id: m for m in produced for c in m.function_calls}
        waiting: list[PendingApproval] = []
        for call in calls:
            why = await self._why(call, contexts.for_call)
            if why is None:
                continue
            client = isinstance((self._tools or {}).get(call.name), ClientTool)
            if call.name in self._kept.always and not client:
                self._actions[call.call_id] = "allowed"
                continue
            waiting.append(PendingApproval(call.call_id, call.name, call.arguments, why, made_by[call.call_id].id,
                                           client=client))
        self.pending, self._wait_stored = waiting, False  # the model's message: saved with the step, or the run
        if not waiting:
            return produced, calls
        return _marked_all(produced, waiting), [c for c in calls if c.call_id not in {p.call_id for p in waiting}]

    async def _why(self, call: FunctionCall, context_for: Callable[[FunctionCall], ToolContext[Any]]) -> str | None:
        """Return why `call` needs approval (its tool's check first, then the agent's); None when it needs none."""
        tool = (self._tools or {}).get(call.name)
        if tool is None:  # answered "no such tool" without running anything
            return None
        from ..client_tools import ClientTool, client_why

        if isinstance(tool, ClientTool):  # it always waits, whatever a policy says
            return client_why(call.name)
        for check, whose in ((tool.needs_approval, f"tool {call.name!r}"), (self._policy, "the agent's policy")):
            if check is True:
                return f"tool {call.name!r} needs approval for every call"
            if check is None or check is False:
                continue
            if (why := await _ask(check, whose, call, context_for)) is not None:
                return why
        return None

    # --- on resume ----------------------------------------------------------------------------------

    async def resume(self, history: Sequence[Message], pending: Sequence[FunctionCall],
                     has_input: bool) -> list[FunctionCall]:
        """Return the calls a previous run left open to answer now; the others still await a decision (`pending`).

        Raises `ApprovalError` when some still await one and the run has new input. The approvals
        are saved in the session's state before this returns: before the approved calls run.
        """
        message, _ = last_exchange(history)
        marked, client = awaiting_approval(message), client_calls(message)
        self._logged = {c.call_id for c in pending}
        answer: list[FunctionCall] = []
        waiting: list[PendingApproval] = []
        always = self._always(pending)
        for call in pending:
            if message is None or call.call_id not in marked or \
                    self._answers_now(call, message, set() if call.call_id in client else always):
                answer.append(call)
            else:
                waiting.append(PendingApproval(call.call_id, call.name, call.arguments, marked[call.call_id],
                                               message.id, client=call.call_id in client))
        if waiting and has_input:
            _refuse_input(waiting)
        allowed = {c.call_id: c for c in answer if self._actions.get(c.call_id) == "allowed"}
        if allowed and message is not None:  # they run as approved ones do: kept as such before they start
            self._asked = (message, {c.call_id: c for c in pending if c.call_id in marked})
        await self._keep_approvals(allowed)
        self.pending, self._wait_stored = waiting, bool(waiting)
        return answer

    def stop_reason(self) -> StopReason:
        """Return why the run stops for the `pending` calls: ``client_tool_calls`` when all are a client's to run."""
        return "client_tool_calls" if all(p.client for p in self.pending) else "approval_required"

    def _always(self, calls: Sequence[FunctionCall]) -> set[str]:
        """Return the tools always allowed: by the session, or by this run's decision on one of `calls`."""
        return self._kept.always | {c.name for c in calls if isinstance(d := self._decided.get(c.call_id), Approval)
                                    and d.always}  # this run's "always" counts for its other calls too

    def _answers_now(self, call: FunctionCall, message: Message, always: set[str]) -> bool:
        """Tell whether the open `call` awaiting approval is answered now (decided, or allowed); note how."""
        decision = self._decided.get(call.call_id)
        if decision is not None:
            self._actions[call.call_id] = _ACTIONS[type(decision)]
        elif self._kept.approved_earlier(call, message):  # it may have run: answered as any open call, even
            pass  # when its tool is always allowed now (it is not run again)
        elif call.name in always:
            self._actions[call.call_id] = "allowed"
        else:
            return False
        return True

    async def _keep_approvals(self, allowed: Mapping[str, FunctionCall]) -> None:
        """Save this run's approvals in the session's state, beside the state as it was before the providers ran.

        The calls in `allowed` (to run because their tool is always allowed) are kept as approved.
        The providers' changes are saved with the run, as always; this saves only the approvals.
        """
        session, writer, asked, baseline = self._session, self._writer, self._asked, self._baseline
        if session is None or writer is None or asked is None or baseline is None:
            return
        self._kept.keep(*asked, {**{call_id: Approval() for call_id in allowed}, **self._decided})
        saved = Session(session.id, session.tenant, baseline, session.version, session.created_at, session.ttl)
        self._kept.write(saved)
        await writer.guard(writer.store.save_session(saved, lease=writer.lease))
        session.version = saved.version
        self._kept.write(session)
        self._baseline = None

    # --- late results that come while calls wait ------------------------------------------------------

    def holds_late(self) -> bool:
        """Tell whether late results coming now are held (`hold_late`): calls wait for a person, in a session."""
        return bool(self.pending) and self._session is not None and self._writer is not None

    async def hold_late(self, messages: Sequence[Message]) -> None:
        """Hold `messages`, late results that came while calls at the log's end wait for a person.

        Nothing may come between those calls and their answer, so the results wait in the session's
        state. The hold is saved at once when its call is in the log (per step; or, per run, a call
        the log left open, or waiting calls found there), on top of the stored state only (the run's
        own state changes are saved as it ends). Per run, a late result of a call this run's model
        made is saved with the whole run: its hold waits for that save (`keep_held`), and is lost
        with the run's messages when there is none.
        """
        session, writer = self._session, self._writer
        assert session is not None
        assert writer is not None
        now = list(messages) if writer.per_step or self._wait_stored else \
            [m for m in messages if m.metadata.get(LATE_RESULT_KEY) in self._logged]
        held_now = {m.id for m in now}
        self._unsaved_late.extend(m for m in messages if m.id not in held_now)
        if not now:
            return
        self._add_late(now)
        writer.check()
        stored = await writer.store.get_session(session.tenant, session.id)
        if session.version > 0 and (stored is None or stored.created_at != session.created_at):
            raise LeaseLost.session_ended(writer.store.backend, session.key, made_again=stored is not None)
        saved = Session(session.id, session.tenant, stored.state if stored is not None else {}, session.version,
                        session.created_at, session.ttl)
        self._kept.write(saved)
        await writer.store.save_session(saved, lease=writer.lease)  # not `guard`: this runs in a task of its own
        session.version = saved.version

    def keep_held(self) -> None:
        """Per run, once the whole run is saved: hold what `hold_late` kept back (saved with the run's state)."""
        if self._unsaved_late:
            self._add_late(self._unsaved_late)
            self._unsaved_late = []

    def _add_late(self, messages: Sequence[Message]) -> None:
        from ..codec import message_to_dict  # only a run that holds one needs the codec

        assert self._session is not None
        self._kept.late.extend(message_to_dict(m) for m in messages)
        self._kept.write(self._session)

    def holding(self) -> bool:
        """Tell whether the session holds late results (`hold_late`) for a run to give back."""
        return bool(self._kept.late)

    def held_after(self, history: Sequence[Message]) -> list[Message]:
        """Return the late results held for calls made in `history`, once none of its calls waits for a person.

        Those whose call is not in `history` stay held. Those in it already (their save landed, but
        not the session state's) are forgotten at once; `answered` forgets the others once the run
        saved them.
        """
        if not self._kept.late or self.pending:
            return []
        from ..codec import message_from_dict

        made = {c.call_id for m in history for c in m.function_calls}
        held = [m for m in map(message_from_dict, self._kept.late) if m.metadata.get(LATE_RESULT_KEY) in made]
        fresh = self._forget_present(held, {m.id for m in history})
        self._released = {m.id for m in fresh}
        return fresh

    def _forget_present(self, held: list[Message], present: set[str]) -> list[Message]:
        """Forget the `held` results whose ids are `present` in the log already; return the others."""
        if any(m.id in present for m in held):
            assert self._session is not None
            self._kept.late = [d for d in self._kept.late if d.get("id") not in present]
            self._kept.write(self._session)
        return [m for m in held if m.id not in present]

    def take(self, call_id: str) -> ApprovalAction | None:
        """Return (and forget) how the call about to run was approved, for its trace."""
        return self._actions.pop(call_id, None)

    def answers(self, calls: Sequence[FunctionCall], journal: RunJournal,
                runs_again: Callable[[FunctionCall], bool]) -> dict[str, FunctionResult]:
        """Return the answers of the open `calls` that are not run, by call id.

        A call a person rejected gets the rejection (the model reads the reason; the trace notes
        it); one nobody decided whose tool does not run again (`runs_again`: idempotent, retry_with_key, outbox) is
        answered `interrupted`, as any call a stopped run left open. Approved calls run.
        """
        results: dict[str, FunctionResult] = {}
        for call in calls:
            decision = self._decided.get(call.call_id)
            if isinstance(decision, Answer):  # the client ran it: its result, never run here
                self._actions.pop(call.call_id, None)
                journal.record_tool_call(TracedToolCall(0, call.call_id, call.name, decision.is_error,
                                                        approval="answered"))
                results[call.call_id] = FunctionResult(call.call_id, decision.result, is_error=decision.is_error)
            elif isinstance(decision, Rejection):
                self._actions.pop(call.call_id, None)
                journal.record_tool_call(TracedToolCall(0, call.call_id, call.name, True, approval="rejected"))
                reason = f" ({decision.reason.strip()})" if decision.reason.strip() else ""
                results[call.call_id] = FunctionResult(
                    call.call_id, f"Error: the call to {call.name!r} was not run: the user rejected it{reason}. Do "
                    "not call it again with the same arguments unless the user asks; say so, or find another way.",
                    is_error=True)
            elif call.call_id not in self._actions and not runs_again(call):
                results[call.call_id] = interrupted(call)
        return results

    def answer(self, calls: Sequence[FunctionCall], results: Sequence[FunctionResult],
               repair: Source) -> Message:
        """Return the tool message answering the open `calls`: with the decisions in its metadata, if there were any."""
        message = tool_message(calls, results)
        decisions = {c.call_id: self._record(c) for c in calls if c.call_id in self._decided}
        if not decisions:
            return message.with_source(repair)
        return Message(message.role, message.parts, message.id, message.author_name, message.created_at,
                       {**message.metadata, DECISIONS_KEY: decisions}, APPROVAL)

    def _record(self, call: FunctionCall) -> dict[str, str]:
        decision = self._decided[call.call_id]
        record = {"decision": _ACTIONS[type(decision)], "digest": arguments_digest(call.name, call.arguments)}
        if isinstance(decision, Rejection) and decision.reason:
            record["reason"] = decision.reason
        return record

    def answered(self) -> None:
        """Forget the approvals of the calls just answered, once their answers are in the log (saved with the state).

        That is every approval kept: the calls still open await a decision, so none was approved.
        The late results given back (`held_after`), saved with the answer, are forgotten too. The
        answer is saved right away in either mode (`StepWriter.save_answer`).
        """
        session, kept = self._session, self._kept
        if session is None or not (kept.approved or self._released):
            return
        kept.approved.clear()
        kept.late = [m for m in kept.late if m.get("id") not in self._released]
        self._released = set()
        kept.write(session)


_ACTIONS: dict[type, ApprovalAction] = {Approval: "approved", Rejection: "rejected", Answer: "answered"}


def _refuse_input(waiting: Sequence[PendingApproval]) -> None:
    names = ", ".join(f"{p.tool_name} ({p.call_id})" for p in waiting)
    client = "; a client tool's call: pending.answer(result)" if any(p.client for p in waiting) else ""
    raise ApprovalError(
        f"the session's tool calls {names} await approval, and new input may not come before they are "
        "answered; nothing was run or stored. Decide them first: agent.run(None, session=session, "
        f"approvals={{call_id: approve() or reject('why'){client}}}) (a run without input lists them in "
        "result.pending_approvals), then send the input again", call_ids=[p.call_id for p in waiting])


async def _ask(check: ApprovalCheck, whose: str, call: FunctionCall,
               context_for: Callable[[FunctionCall], ToolContext[Any]]) -> str | None:
    """Ask an `ApprovalCheck` about `call`; a check that cannot answer (it raised, bad arguments) asks a person."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() not in ("", "null") else {}
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        return f"{whose} cannot check arguments that are not a JSON object, so a person must decide"
    try:
        verdict: Any = check(context_for(call), arguments)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception as exc:
        return f"the approval check of {whose} raised {type(exc).__name__} ({clause(exc)}), so a person must decide"
    if isinstance(verdict, str):
        return verdict or None
    return f"{whose} asks for approval of this call" if verdict else None


def _marked_all(produced: list[Message], waiting: Sequence[PendingApproval]) -> list[Message]:
    """Return the model's `produced` messages with the `waiting` calls marked in them (`_marked`)."""
    why_by_id = {p.call_id: p.why for p in waiting}
    clients = {p.call_id for p in waiting if p.client}
    return [_marked(m, {c.call_id: why_by_id[c.call_id] for c in m.function_calls if c.call_id in why_by_id}, clients)
            for m in produced]


def _marked(message: Message, why: dict[str, str], clients: set[str]) -> Message:
    """Return `message` with its calls in `why` marked as awaiting approval, those in `clients` as a client's."""
    if not why:
        return message
    client = sorted(c for c in why if c in clients)
    return Message(message.role, message.parts, message.id, message.author_name, message.created_at,
                   {**message.metadata, AWAITING_KEY: why, **({CLIENT_KEY: client} if client else {})}, message.source)

