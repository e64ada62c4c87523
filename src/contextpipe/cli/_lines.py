"""What the chat reads at its prompt: lines with editing and a history, pastes, and the lines of ``/paste``.

On a terminal, GNU readline edits the line and keeps a history; bracketed paste is turned on, so
that the terminal marks a paste (``ESC[200~`` ... ``ESC[201~``) and a paste of 40 lines is one
message, not 40 (Python's readline module turns it off when it loads). Readline reads the marks
itself and turns bracketed paste on only while it reads a line; without readline, the terminal's
own line editing passes the marks through, they are read here, and bracketed paste is turned on
for the whole chat; either way it is off when the chat ends. (With libedit, macOS's stand-in for
readline, and on a terminal that takes no escape codes, ``TERM=dumb``, it is left off: there
``/paste`` takes a paste.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Final

from rich.console import Console
from rich.markup import escape

__all__ = ["PASTE_END", "PASTE_START", "Entry", "LineReader", "trimmed"]

PASTE_START: Final = "\x1b[200~"
"""What a terminal sends before a paste, once bracketed paste is on."""
PASTE_END: Final = "\x1b[201~"
"""What it sends after the paste."""
_BRACKETS_ON: Final = "\x1b[?2004h"
_BRACKETS_OFF: Final = "\x1b[?2004l"


def _dumb_terminal() -> bool:
    """Whether the terminal takes no escape codes (``TERM=dumb``, as in Emacs' shell), as Rich decides it."""
    return os.environ.get("TERM", "").lower() in ("dumb", "unknown")


@dataclass(frozen=True)
class Entry:
    """One entry at the prompt: a typed line, or a paste (always a message, even one that starts with /)."""

    text: str
    pasted: bool = False


def trimmed(text: str) -> str:
    r"""Return `text` without the blank lines around it or the spaces ending its lines; indentation is kept.

    >>> trimmed("\n  def f():\r\n      return 1  \n\n")
    '  def f():\n      return 1'
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(line.rstrip() for line in lines)


class LineReader:
    """Read what the user types or pastes at the chat's prompt (`read`) and in ``/paste`` (`read_until_dot`)."""

    def __init__(self, err: Console, commands: Iterable[str], read: Callable[[str], str] = input) -> None:
        self.err = err
        self._commands = sorted(commands)
        self._read = read
        self._readline: ModuleType | None = None
        self._history_file: Path | None = None
        self._brackets = False  # turned on, so turned off at the end

    def start(self) -> None:
        """Set up line editing, the history and bracketed paste (when stdin is a terminal)."""
        brackets = sys.stdout.isatty() and not _dumb_terminal()
        try:
            import readline
        except ImportError:
            if brackets:
                sys.stdout.write(_BRACKETS_ON)
                sys.stdout.flush()
                self._brackets = True
            return
        self._readline = readline
        if brackets and "libedit" not in (readline.__doc__ or ""):
            readline.parse_and_bind("set enable-bracketed-paste on")  # readline turns it on and off per line
            self._brackets = True  # and off at the end too, however the chat ends
        self._start_editing(readline)

    def stop(self) -> None:
        """Save the history and turn bracketed paste off again."""
        if self._brackets:
            sys.stdout.write(_BRACKETS_OFF)
            sys.stdout.flush()
            self._brackets = False
        if self._history_file is None or self._readline is None:
            return
        try:
            self._readline.write_history_file(self._history_file)
        except OSError as exc:
            self.err.print(f"[dim]prompt history not saved to {escape(str(self._history_file))}: "
                           f"{escape(str(exc))}[/dim]")

    def read(self, prompt: str) -> Entry:
        """Read one entry: a line, or the whole of a paste (`EOFError` at the end of input)."""
        line = self._read(prompt)
        if "\n" in line:  # readline took a bracketed paste: a typed line holds no line break
            return Entry(line, pasted=True)
        if PASTE_START not in line:
            return Entry(line)
        lines = [line]  # the marks came through the terminal's own line editing: read up to the end mark
        while PASTE_END not in lines[-1]:
            try:
                lines.append(self._read(""))
            except EOFError:
                break
        return Entry("\n".join(lines).replace(PASTE_START, "").replace(PASTE_END, ""), pasted=True)

    def read_until_dot(self, prompt: str) -> str:
        """Read lines up to one holding only ``.`` (or the end of input); they are kept out of the history.

        Ctrl-C (`KeyboardInterrupt`) cancels.
        """
        mark = self._readline.get_current_history_length() if self._readline else 0
        lines: list[str] = []
        try:
            while True:
                try:
                    entry = self.read(prompt)
                except EOFError:
                    break
                if not entry.pasted and entry.text.strip() == ".":
                    break
                lines.append(entry.text)
        finally:
            self._forget_since(mark)
        return "\n".join(lines)

    def _forget_since(self, mark: int) -> None:
        """Remove the history entries added after the first `mark` ones."""
        if self._readline is None:
            return
        while self._readline.get_current_history_length() > mark:
            self._readline.remove_history_item(self._readline.get_current_history_length() - 1)

    def _start_editing(self, readline: ModuleType) -> None:
        names = sorted({usage.split(" ")[0] for usage in self._commands} | {"/quit"})

        def complete(text: str, state: int) -> str | None:
            matches = [n for n in names if n.startswith(text)] if text.startswith("/") else []
            return matches[state] if state < len(matches) else None

        readline.set_completer(complete)
        readline.set_completer_delims(" \t\n")
        readline.parse_and_bind("tab: complete")
        readline.set_history_length(1000)
        name = os.environ.get("CONTEXTPIPE_HISTORY", str(Path.home() / ".contextpipe_history"))
        if not name:
            return
        self._history_file = Path(name)
        try:
            readline.read_history_file(self._history_file)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.err.print(f"[dim]prompt history not read from {escape(name)}: {escape(str(exc))}[/dim]")
