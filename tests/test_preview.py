"""`contextpipe.trace.preview`: one message as one line, cut without splitting a whole long text first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe import FunctionCall, Message, UsageError
from contextpipe.messages import ReasoningPart, TextPart
from contextpipe.trace import preview


@given(st.text(alphabet=st.sampled_from("ab \t\n\u2028\x1f\xa0é"), max_size=80), st.integers(1, 40))
def test_a_cut_preview_equals_cutting_the_whole_normalised_text(text: str, width: int) -> None:
    whole = " ".join(text.split())
    expected = whole if len(whole) <= width else whole[: width - 1] + "…"
    assert preview(Message.user(text), width) == expected
    assert preview(Message.user(text), None) == whole


def test_blank_text_and_reasoning_leave_no_piece_behind() -> None:
    call = FunctionCall("c1", "f", "{}")
    assert preview(Message("assistant", (TextPart("  "), call))) == "call f({})"
    assert preview(Message("assistant", (TextPart("a "), ReasoningPart("thinking"), TextPart("b")))) == "a b"


def test_a_width_below_one_is_refused() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        preview(Message.user("hello world"), width=0)
