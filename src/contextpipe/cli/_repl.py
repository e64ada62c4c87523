"""The chat's prompt: turns streamed word-wrapped, a notice while the model is silent, slash commands.

A tool call that needs approval is asked about (y/n/always) when the run stops for it, and the run
resumes with the answers; a message typed while calls of the session still await a decision is
held back until they are decided, then sent.

`ChatRepl` runs on the `asyncio.Runner` of ``contextpipe chat`` (`contextpipe.cli.chat`), turn by
turn from the main thread, and reads the prompt between turns in the main thread too (with
`_lines.LineReader`: line editing, history, pastes).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape

from ..agent import Agent
from ..approvals import Decision, PendingApproval
from ..errors import ApprovalError, ContextPipeError, UsageError, shorten
from ..events import RunResult, ToolCallFinished, ToolCallStarted
from ..messages import Message, Source
from ..models.base import TextDelta
from ..session import Session, set_user_id, user_id
from ._lines import LineReader, trimmed
from ._shared import CONTROL_CHARACTERS, error_text, shown
from ._undo import NothingToDo, fork_here, history_lines, undo, unreply

__all__ = ["COMMANDS", "ChatRepl", "WaitNotice", "WordWrap"]

T = TypeVar("T")

COMMANDS: dict[str, str] = {
    "/help": "list these commands",
    "/session": "the session's id, size and where it is stored",
    "/history [N]": "the session's last N messages (default 10), and where rewound ones are left out",
    "/undo": "take back your last message and its answer (type it again, or something else)",
    "/retry": "answer your last message again",
    "/fork [ID]": "copy the session into a new one (default <id>-fork-<n>) and go on in that",
    "/inspect [N]": "where the tokens of the Nth stored model call came from (default: the last)",
    "/paste": "send the lines that follow as one message, up to a line holding only '.' (or Ctrl-D)",
    "/exit": "leave (also /quit, Ctrl-D or Ctrl-C)",
}
"""The slash commands the prompt understands; any other line goes to the model (start it with // to
send a line that begins with /)."""

_INPUT = Source("input")


# --- the prompt ----------------------------------------------------------------------------------


class WordWrap:
    r"""Write streamed text to a terminal, breaking lines between words rather than inside them.

    >>> lines = []
    >>> wrap = WordWrap(lines.append, width=12)
    >>> for chunk in ["The qui", "ck brown fox jum", "ps over it."]:
    ...     wrap.feed(chunk)
    >>> wrap.finish()
    >>> "".join(lines).split("\n")
    ['The quick ', 'brown fox ', 'jumps over ', 'it.']

    A word is written once it is complete (the next space or line break arrives, or `finish`); a
    word wider than the terminal is written on a line of its own and the terminal breaks it.
    `width=None` writes the text as it comes (output that is not a terminal). Control characters
    are dropped either way, so a model cannot send escape sequences to the user's terminal.
    """

    def __init__(self, write: Callable[[str], None], width: int | None, column: int = 0) -> None:
        self._write = write
        self.width = width
        self.column = column
        """Cells already used on the current line."""
        self._word = ""

    def feed(self, text: str) -> None:
        """Take the next piece of the stream."""
        text = CONTROL_CHARACTERS.sub("", text)
        if self.width is None:
            self._write(text)
            return
        for char in text:
            if char == "\n":
                self._flush_word()
                self._write("\n")
                self.column = 0
            elif char in " \t":
                self._flush_word()
                if self.column + 1 > self.width:
                    self._write("\n")
                    self.column = 0
                else:
                    self._write(char)
                    self.column += 1
            else:
                self._word += char

    def finish(self) -> None:
        """Write the last, unfinished word."""
        self._flush_word()

    def _flush_word(self) -> None:
        if not self._word:
            return
        size = cell_len(self._word)
        if self.width is not None and self.column > 0 and self.column + size > self.width:
            self._write("\n")
            self.column = 0
        self._write(self._word)
        self.column += size
        if self.width is not None and self.column > self.width:
            self.column %= self.width
        self._word = ""


WAITING: Final = "waiting for the model… (Ctrl-C stops it)"
"""What `WaitNotice` says."""


class WaitNotice:
    """Say "waiting for the model…" on the terminal once the model has been silent for `after` seconds.

    `clear` erases it in place (back to the column it starts at, clear to the end of the line) before
    the model's text is written, so it leaves nothing behind, not even the ``^C`` a terminal echoes
    after it; it is cut to fit the line for that. On the console of the answer when that is a
    terminal, after ``assistant> ``; else on the error console at the start of a line when that one
    is a terminal; else (output to files, or a terminal without escape codes) never shown.
    """

    def __init__(self, console: Console | None, after: float, *, inline: bool = True) -> None:
        self.console = console
        self.after = after
        self.inline = inline
        self._timer: asyncio.TimerHandle | None = None
        self._at: int | None = None  # the column it starts at, while it is shown

    def arm(self, column: int) -> None:
        """Show the notice in `after` seconds (the cursor is then at `column`) unless `clear` comes first."""
        self.clear()
        if self.console is not None:
            self._timer = asyncio.get_running_loop().call_later(self.after, self._show,
                                                                column if self.inline else 0)

    def clear(self) -> None:
        """Cancel the notice, erasing it if it is shown."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._at is not None and self.console is not None:
            # To its column from the line's start: a ^C echoed after it has moved the cursor on.
            forward = f"\x1b[{self._at}C" if self._at else ""  # (ESC[0C moves one column)
            self.console.file.write(f"\r{forward}\x1b[K")
            self.console.file.flush()
        self._at = None

    def _show(self, column: int) -> None:
        self._timer = None
        assert self.console is not None
        text = WAITING[:max(0, self.console.width - column - 1)]
        if len(text) < len("waiting"):
            return
        self.console.print(f"[dim]{escape(text)}[/dim]", end="")
        self._at = column


def _moves_cursor(console: Console) -> bool:
    """Whether `console` is a terminal that takes escape codes (not ``TERM=dumb``): the notice needs them."""
    return console.is_terminal and not console.is_dumb_terminal


class ChatRepl:
    """Read lines, run them through the agent turn by turn, and answer slash commands."""

    def __init__(
        self,
        runner: asyncio.Runner,
        agent: Agent,
        session: Session,
        where: str,
        out: Console,
        err: Console,
        *,
        render_trace: Callable[[int, dict[str, Any]], None],
        wait_notice_after: float = 1.0,
    ) -> None:
        self.runner = runner
        self.agent = agent
        self.session = session
        self.where = where
        self.out = out
        self.err = err
        self._render_trace = render_trace
        self.wait_notice_after = wait_notice_after
        """Seconds of silence from the model before `WaitNotice` shows."""
        self.lines = LineReader(err, COMMANDS)
        self.unanswered = 0
        """Messages of this chat that got no answer (the run failed or was interrupted)."""

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Chat until /exit or Ctrl-D (exit code 0), or Ctrl-C at the prompt (130).

        Reading from a pipe, the exit code is 1 if a message got no answer.
        """
        interactive = sys.stdin.isatty()
        if interactive:
            self.lines.start()
        try:
            while True:
                try:
                    entry = self.lines.read("you> ")
                except EOFError:
                    self.out.print()
                    break
                except KeyboardInterrupt:
                    self.out.print()
                    return 130
                text = trimmed(entry.text) if entry.pasted else entry.text.strip()
                if not text:
                    continue
                if entry.pasted or not text.startswith("/"):
                    self._turn(text)
                elif text.startswith("//"):
                    self._turn(text[1:])
                elif not self._command(text):
                    break
        finally:
            self.lines.stop()
        return 1 if self.unanswered and not interactive else 0

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    # --- a turn ------------------------------------------------------------------------------------

    def _turn(self, text: str | None) -> None:
        """Send `text` (None: answer the session's view as it is, for /retry) and stream the answer."""
        message = Message.user(text) if text is not None else None
        self.out.print("[bold]assistant>[/bold] ", end="")
        stream = self.out.file
        width = self.out.width if self.out.is_terminal else None

        def write(piece: str) -> None:
            stream.write(piece)
            stream.flush()

        wrap = WordWrap(write, width, column=len("assistant> "))
        try:
            self._decide(self._call(self._stream(message, wrap, self._wait_notice())), wrap)
            wrap.finish()
            self.out.print()
            return
        except ApprovalError:  # calls of the session await a decision: the message waits, not kept in the log
            wrap.finish()
            self.out.print()
            self._hold(text, wrap)
            return
        except KeyboardInterrupt:  # an interrupted run saves its input itself: say whether it is there
            wrap.finish()
            self.out.print()
            self.unanswered += 1
            if message is not None:
                self._report_kept(message)
            return
        except ContextPipeError as exc:
            wrap.finish()
            self.out.print()
            self.unanswered += 1
            self.err.print(f"[red]error:[/red] {shown(error_text(exc))}")
            problem = "the run failed"
        except Exception:  # a bug: keep the message, then let the traceback show
            wrap.finish()
            self.out.print()
            if message is not None:
                self._keep_input(message, "the run crashed")
            raise
        if message is not None:
            self._keep_input(message, problem)

    def _wait_notice(self) -> WaitNotice:
        if _moves_cursor(self.out):
            return WaitNotice(self.out, self.wait_notice_after)
        return WaitNotice(self.err if _moves_cursor(self.err) else None, self.wait_notice_after, inline=False)

    def _hold(self, text: str | None, wrap: WordWrap) -> None:
        """Have the calls the session's earlier run left waiting decided, then send `text` (held back until then).

        A run that fails or is interrupted meanwhile leaves the message unsent: it is not kept in the
        session, where it would come between a call and its result.
        """
        self.err.print("[yellow]tool calls of this session await your decision first; your message is sent "
                       "once they are decided[/yellow]")
        try:
            decided = self._decide(self._call(self._stream(None, wrap, self._wait_notice())), wrap)
        except (ContextPipeError, KeyboardInterrupt) as exc:
            wrap.finish()
            self.out.print()
            problem = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"error: {shown(error_text(exc))}"
            self.err.print(f"[red]{problem}[/red]; your message was not sent (send it again)")
            decided = False
        if not decided:
            self.unanswered += 1
            return
        wrap.finish()
        self.out.print()
        self._turn(text)

    def _decide(self, result: RunResult | None, wrap: WordWrap) -> bool:
        """Ask about each call the run stopped for (y/n/always) and resume it, until it needs no decision.

        Returns False when the input ended before a decision (the calls still await one).
        """
        while result is not None and result.stop_reason == "approval_required":
            wrap.finish()
            self.out.print()
            decisions: dict[str, Decision] = {}
            for pending in result.pending_approvals:
                decision = self._ask(pending)
                if decision is None:
                    self.err.print("[yellow]no answer: the calls still await a decision (the next message asks "
                                   "again)[/yellow]")
                    return False
                decisions[pending.call_id] = decision
            self.out.print("[bold]assistant>[/bold] ", end="")
            wrap.column = len("assistant> ")
            result = self._call(self._stream(None, wrap, self._wait_notice(), decisions))
        return True

    def _ask(self, pending: PendingApproval) -> Decision | None:
        """Ask whether `pending` may run: y(es), n(o) or a(lways: its tool, in this session); None at end of input."""
        self.out.print(f"[yellow]run {shown(pending.tool_name)}({shown(pending.arguments)})?[/yellow] "
                       f"[dim]{shown(pending.why)}[/dim]")
        while True:
            try:
                answer = self.lines.read("approve? [y]es, [n]o, [a]lways> ").text.strip().lower()
            except EOFError:
                return None
            if answer in ("y", "yes"):
                return pending.approve()
            if answer in ("a", "always"):
                return pending.approve(always=True)
            if answer in ("n", "no"):
                return pending.reject("the user said no")

    async def _stream(self, message: Message | None, wrap: WordWrap, notice: WaitNotice,
                      approvals: dict[str, Decision] | None = None) -> RunResult | None:
        running = 0  # tool calls started and not finished: while one runs, the wait is not the model's
        notice.arm(wrap.column)
        events = self.agent.stream(message, session=self.session, approvals=approvals)
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    notice.clear()
                    wrap.feed(event.text)
                elif isinstance(event, ToolCallStarted):
                    notice.clear()
                    wrap.finish()
                    self.out.print(f"\n[dim]  calling {shown(event.call.name)}({shown(event.call.arguments)})[/dim]")
                    wrap.column = 0
                    running += 1
                elif isinstance(event, ToolCallFinished):
                    notice.clear()
                    self.out.print(f"[dim]  -> {shown(event.result.result[:200])}[/dim]")
                    wrap.column = 0
                    running = max(0, running - 1)
                    if not running:
                        notice.arm(0)  # the next model call
        finally:
            notice.clear()
        return events.result

    def _report_kept(self, message: Message) -> None:
        """Tell the user whether the interrupted run's message is in the session (the agent saved it)."""
        store, session = self.agent.store, self.session
        try:
            recent = self._call(store.load(session.tenant, session.id, limit=50)).messages
        except (ContextPipeError, KeyboardInterrupt) as exc:
            self.err.print(f"[yellow]interrupted; the session could not be read to check your message: "
                           f"{shown(error_text(exc))}[/yellow]")
            return
        if any(m.id == message.id for m in recent):
            self.err.print("[dim]interrupted; your message is kept in the session[/dim]")
        else:
            self.err.print("[yellow]interrupted; your message could not be kept in the session[/yellow]")

    def _keep_input(self, message: Message, problem: str) -> None:
        """Make sure the user's message is in the session after a failed turn.

        The agent stores the input together with the first model answer (or when the run is
        interrupted); a run that failed before that stores nothing, so the message is appended
        here (appending is idempotent by message id).
        """
        store, session = self.agent.store, self.session
        try:
            self._call(store.append(session.tenant, session.id, [message.with_source(_INPUT)]))
        except (ContextPipeError, KeyboardInterrupt) as exc:
            self.err.print(f"[yellow]{problem}; your message could not be kept in the session: "
                           f"{shown(error_text(exc))}[/yellow]")
            return
        self.err.print(f"[dim]{problem}; your message is kept in the session[/dim]")
        try:
            stored = self._call(store.get_session(session.tenant, session.id))
        except (ContextPipeError, KeyboardInterrupt):
            return  # the next turn reads the session again, and says what fails
        if stored is not None and stored.created_at != session.created_at:
            # The session was deleted (or expired) meanwhile, and the append made it again: go on in
            # that one, for the same user.
            if (user := user_id(session)) is not None and user_id(stored) is None:
                set_user_id(stored, user)
            self.session = stored

    # --- slash commands ----------------------------------------------------------------------------

    def _command(self, text: str) -> bool:
        """Run a slash command; return False to leave the chat."""
        name, _, argument = text.partition(" ")
        argument = argument.strip()
        if name in ("/exit", "/quit"):
            return False
        try:
            if name == "/help":
                self._help()
            elif name == "/session":
                self._call(self._show_session())
            elif name == "/history":
                self._call(self._show_history(self._number(argument, 10)))
            elif name == "/inspect":
                self._call(self._inspect(self._number(argument, None)))
            elif name == "/paste":
                self._paste()
            elif name in ("/undo", "/retry", "/fork"):
                self._undo_command(name, argument)
            else:
                self.err.print(f"unknown command {escape(name)}; /help lists the commands (start a line with // "
                               "to send it to the model as it is)")
        except KeyboardInterrupt:
            self.out.print()
        except NothingToDo as exc:
            self.err.print(f"[yellow]{escape(str(exc))}[/yellow]")
        except ContextPipeError as exc:
            self.err.print(f"[red]error:[/red] {shown(error_text(exc))}")
        return True

    def _undo_command(self, name: str, argument: str) -> None:
        """/undo, /retry or /fork [ID] (`_undo`): act on the session's view; go on in the session they leave."""
        before = self.session.id
        if name == "/undo":
            self.session, text = self._call(undo(self.agent, self.session))
            self.out.print(f"[dim]undone: your message {shown(repr(text))} and what followed it (kept in the log, "
                           "left out of the view); type it again or anything else[/dim]")
        elif name == "/retry":
            self.session = self._call(unreply(self.agent, self.session))
            self._turn(None)
        else:
            self.session, at = self._call(fork_here(self.agent, self.session, argument or None))
            self.out.print(f"forked {shown(repr(before))} at message {at} into {shown(repr(self.session.id))}; "
                           f"now chatting in {shown(repr(self.session.id))} ({shown(repr(before))} stays as it was)")

    def _paste(self) -> None:
        """Send the lines up to one holding only '.' (or Ctrl-D) as one message; Ctrl-C cancels."""
        self.out.print("[dim]paste or type the message; end it with a line holding only '.' (or Ctrl-D), "
                       "Ctrl-C cancels[/dim]")
        text = trimmed(self.lines.read_until_dot("paste> "))
        if text:
            self._turn(text)
        else:
            self.out.print("[dim]nothing to send[/dim]")

    def _help(self) -> None:
        for usage, what in COMMANDS.items():
            self.out.print(f"  {escape(usage):<14} {escape(what)}")
        self.out.print("[dim]  Lines starting with // are sent to the model without the first /.[/dim]")

    @staticmethod
    def _number(argument: str, default: int | None) -> int | None:
        if not argument:
            return default
        if not argument.isdigit() or int(argument) < 1:
            raise UsageError(f"expected a number from 1, got {shorten(argument)}")
        return int(argument)

    async def _show_session(self) -> None:
        store, session = self.agent.store, self.session
        stored = await store.get_session(session.tenant, session.id)
        page = await store.load(session.tenant, session.id, limit=1)
        traces = await store.load_traces(session.tenant, session.id)
        providers = ", ".join(f"{p.kind}:{p.source_id}" for p in self.agent.providers) or "none"
        self.out.print(f"session {escape(repr(session.id))} (tenant {escape(repr(session.tenant))}) in "
                       f"{escape(self.where)}: {page.last_seq} message(s), "
                       f"version {stored.version if stored else 0}, {len(traces)} stored model call(s)")
        self.out.print(f"model {escape(self.agent.model.name)}; context: {escape(providers)}")

    async def _show_history(self, last: int | None) -> None:
        for line in await history_lines(self.agent, self.session, last or 10):
            self.out.print(line)

    async def _inspect(self, number: int | None) -> None:
        traces = await self.agent.store.load_traces(self.session.tenant, self.session.id)
        if not traces:
            self.out.print("[dim]no model call stored yet in this session[/dim]")
            return
        if number is None:
            number = len(traces)
        if number > len(traces):
            self.err.print(f"this session has {len(traces)} stored model call(s)")
            return
        self._render_trace(number, traces[number - 1])
