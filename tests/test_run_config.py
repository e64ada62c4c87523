"""Configuration mistakes in the run's seams are refused when they are made, not in the middle of a run."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from contextpipe import Heartbeat, Message, Session, UsageError
from contextpipe.providers import HistoryProvider, LoadedHistory
from contextpipe.stores import Lease


def test_a_history_provider_whose_save_misses_durable_is_refused_when_defined() -> None:
    with pytest.raises(UsageError, match=r"Old\.save must take the keyword argument 'durable'"):
        class Old(HistoryProvider):
            async def load(self, session: Session) -> Sequence[Message]:
                return []

            async def save(self, session: Session, messages: Sequence[Message], *,
                           lease: Lease | None = None) -> None:
                return None


def test_a_history_provider_whose_load_view_misses_lease_token_is_refused_when_defined() -> None:
    with pytest.raises(UsageError, match=r"Viewer\.load_view must take the keyword argument 'lease_token'"):
        class Viewer(HistoryProvider):
            async def load_view(self, session: Session) -> LoadedHistory:
                return LoadedHistory([])


def test_a_history_provider_taking_any_keyword_is_accepted() -> None:
    class Open(HistoryProvider):
        async def save(self, session: Session, messages: Sequence[Message], **options: object) -> None:
            return None

    assert Open("open").source_id == "open"


def test_a_sleep_of_your_own_needs_the_runs_own_heartbeat_task() -> None:
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(0)

    with pytest.raises(UsageError, match="shared_timer=False"):
        Heartbeat(sleep=sleep)
    assert Heartbeat(sleep=sleep, shared_timer=False).sleep is sleep
