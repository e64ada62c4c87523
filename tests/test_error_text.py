"""How error messages echo values (`errors.shorten`) and embed other errors' texts (`errors.clause`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextpipe.errors import SHORT, SessionBusy, UsageError, clause, shorten
from contextpipe.session import SessionKey


@given(st.text(), st.integers(min_value=1, max_value=200))
def test_shorten_keeps_a_short_value_whole_and_cuts_a_long_one_to_its_limit(value: str, limit: int) -> None:
    shown = shorten(value, limit)
    if len(repr(value)) <= limit:
        assert shown == repr(value)
    else:
        assert shown.startswith(repr(value)[:limit] + "…")
        assert shown.endswith(f" ({len(value)} characters)")
        assert len(shown) <= limit + len(f"…' ({len(value)} characters)")


@given(st.one_of(st.binary(), st.lists(st.integers()), st.integers()))
def test_shorten_bounds_any_value(value: object) -> None:
    assert len(shorten(value)) <= SHORT + len(" (1000000 bytes)") + 2


@given(st.text())
def test_clause_never_leaves_a_full_stop_before_the_punctuation_that_follows(text: str) -> None:
    embedded = clause(text)
    assert text.rstrip().startswith(embedded)
    if not text.rstrip().endswith(".."):
        assert not (embedded + "; retry").count(".;")


def test_a_long_id_is_cut_in_every_message_that_names_it() -> None:
    with pytest.raises(UsageError) as invalid:
        SessionKey("default", "a" * 10_000)
    assert len(str(invalid.value)) < 300 and "(10000 characters)" in str(invalid.value)
    busy = SessionBusy.held("sqlite", SessionKey("default", "b" * 200))
    assert len(str(busy)) < 300 and busy.session_id == "b" * 200  # the attribute keeps it whole
