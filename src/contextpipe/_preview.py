"""One message as one line of text; public as `contextpipe.trace.preview`.

It lives below `trace` and `compaction` (which `trace` imports) so that `Summarize` can render the
messages it sends to its model the way traces, ``contextpipe sessions show`` and the demo show them.
"""

from __future__ import annotations

import re

from .errors import UsageError
from .messages import FunctionCall, FunctionResult, Message, Part, ReasoningPart, TextPart

__all__ = ["preview"]

_WORD = re.compile(r"\S+")


def preview(message: Message, width: int | None = 60, *, one_line: bool = True) -> str:
    r"""Return `message` as text: its parts in order, joined by `` | ``.

    Text is shown as it is, a call as ``call NAME(ARGUMENTS)``, a result as ``result: TEXT`` (or
    ``result (error): TEXT``) with its images or files named in brackets, and an image or file part
    by its media type and size in brackets; reasoning is left out. With `one_line`, every run of
    white space (line breaks too) becomes one space. A preview longer than `width` characters is cut
    to `width`, its last one "…"; ``width=None`` keeps it whole.

    >>> preview(Message.user("What should I wear\nin Suzhou today?"))
    'What should I wear in Suzhou today?'
    >>> preview(Message("assistant", (TextPart("Let me look."), FunctionCall("c1", "lookup", '{"city": "Suzhou"}'))))
    'Let me look. | call lookup({"city": "Suzhou"})'
    >>> preview(Message("tool", (FunctionResult("c1", "no such city", is_error=True),)))
    'result (error): no such city'
    >>> preview(Message.user("word " * 20), width=16)
    'word word word …'
    """
    if width is not None and width < 1:
        raise UsageError(f"preview width must be at least 1 character (or None for the whole text), got {width}")
    parts = message.parts
    # The usual message, one text part, needs no list of pieces.
    text = parts[0].text if len(parts) == 1 and type(parts[0]) is TextPart else " | ".join(_pieces(parts))
    if one_line:
        text = " ".join(text.split()) if width is None else _first_words(text, width)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _first_words(text: str, width: int) -> str:
    """`text` with its white space runs made single spaces, as far as past `width` (a 50 MB result is not split)."""
    words: list[str] = []
    length = -1
    for match in _WORD.finditer(text):
        words.append(match.group())
        length += len(words[-1]) + 1
        if length > width:
            break
    return " ".join(words)


def _pieces(parts: tuple[Part, ...]) -> list[str]:
    """Each part as text (adjacent text parts as one piece), reasoning and empty text left out."""
    pieces: list[str] = []
    after_text = False
    for part in parts:
        if isinstance(part, TextPart):
            if part.text.strip():
                if after_text:
                    pieces[-1] += part.text
                else:
                    pieces.append(part.text)
                after_text = True
            continue
        if isinstance(part, ReasoningPart):
            continue  # left out, and it does not part the texts around it
        after_text = False
        from ._media import describe  # here: importing the agent (which imports this module) need not load it

        if isinstance(part, FunctionCall):
            pieces.append(f"call {part.name}({part.arguments})")
        elif isinstance(part, FunctionResult):
            media = f" [with {', '.join(describe(m) for m in part.parts)}]" if part.parts else ""
            pieces.append(f"result{' (error)' if part.is_error else ''}: {part.result}{media}")
        else:
            pieces.append(f"[{describe(part)}]")
    return pieces
