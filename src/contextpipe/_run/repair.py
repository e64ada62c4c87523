"""The repair of a loaded history before a run's first model call (`contextpipe._run.loop` does the rest).

`check_history` checks the history's tool exchanges once and repairs, in the run's view only, a
log that breaks the rules (`contextpipe.exchanges.repair_exchanges`). Calls still open at the very
end (a crash, a kill, a cancelled run) are the loop's to answer: recorded results are kept, calls
to idempotent tools run again, every other call is answered `interrupted`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..exchanges import exchange_problem, repair_exchanges
from ..messages import Message, Source
from ..pipeline import Segment

__all__ = ["REPAIR", "check_history"]

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
