"""The session state an agent keeps for itself and checks its providers against: reserved keys, token calibration.

`Agent` checks its providers when it is built (`check_providers`: unique source ids, one history
loading messages), refuses a provider whose state would overwrite another's or the agent's own
(`provider_state_keys`), and reads back the token calibration a session keeps (`stored_calibration`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._prompt_cache import PROMPT_CACHE_KEY
from .approvals import STATE_KEY as APPROVALS_KEY
from .errors import CodecError, UsageError
from .providers.base import ContextProvider, HistoryProvider
from .session import RESERVED_STATE_KEYS, ProviderState, Session
from .tokens import CALIBRATION_KEY, Calibration

__all__ = ["RESERVED_KEYS", "check_providers", "provider_state_keys", "stored_calibration"]

RESERVED_KEYS = {**RESERVED_STATE_KEYS, CALIBRATION_KEY: "the agent's token calibration",
                  APPROVALS_KEY: "the session's approvals (tools always allowed, approved calls, held late results)",
                  PROMPT_CACHE_KEY: "the last model call's prompt-cache fingerprint"}


def provider_state_keys(provider: ContextProvider) -> list[str]:
    """Return the session state keys `provider` uses: those it declares and its `ProviderState` attributes'.

    Raises `UsageError` for a key the session or the agent keeps for itself, and for two held
    `ProviderState` objects sharing a key with different models.
    """
    models: dict[str, type[object]] = {}
    for state in ProviderState.held_by(provider):
        if models.setdefault(state.key, state.model) is not state.model:
            raise UsageError(f"{provider!r} holds two ProviderState objects with key {state.key!r} "
                             f"({models[state.key].__name__} and {state.model.__name__}); give each its own key")
    keys = list(dict.fromkeys([*provider.state_keys, *models]))
    for key in keys:
        if key in RESERVED_KEYS:
            raise UsageError(f"{provider!r} uses session state key {key!r}, which is reserved for "
                             f"{RESERVED_KEYS[key]}; use a key of its own, such as {provider.source_id!r}")
    return keys


def stored_calibration(session: Session) -> Calibration:
    """Return the calibration kept in `session`'s state."""
    kept = session.state[CALIBRATION_KEY]
    if isinstance(kept, Calibration):
        return kept
    try:
        return Calibration.from_dict(kept)
    except ValueError as exc:
        raise CodecError(f"session {session.id!r}: state under key {CALIBRATION_KEY!r} does not match "
                         f"Calibration: {exc}") from exc


def check_providers(providers: Sequence[ContextProvider], default_history: HistoryProvider | None) -> dict[str, str]:
    """Check an agent's providers; return the session state keys a tool's state may not use, and what each holds.

    Raises `UsageError` for an item that is not a `ContextProvider`, two sharing a source_id or a state key (the
    agent's `default_history` named when one of them is it), and more than one history provider loading messages.
    """
    seen_ids: dict[str, ContextProvider] = {}
    seen_keys: dict[str, ContextProvider] = {}
    owners = dict(RESERVED_KEYS)
    loaders = []
    for p in providers:
        if not isinstance(p, ContextProvider):
            raise UsageError(f"providers must be ContextProvider instances, got {p!r}")
        if p.source_id in seen_ids and seen_ids[p.source_id] is default_history:
            raise UsageError(
                f"{p!r} uses source_id {p.source_id!r}, the history the agent adds when given no history "
                "provider; give it another source_id, or pass default_history=False"
            )
        if p.source_id in seen_ids:
            raise UsageError(
                f"two context providers use source_id {p.source_id!r} ({seen_ids[p.source_id]!r} and {p!r}); "
                "give each a unique source_id"
            )
        seen_ids[p.source_id] = p
        for key in provider_state_keys(p):
            if key in seen_keys:
                raise UsageError(
                    f"context providers {seen_keys[key]!r} and {p!r} both use session state key {key!r}; "
                    "give each its own key"
                )
            seen_keys[key] = p
            owners[key] = f"the state of context provider {p.source_id!r}"
        if isinstance(p, HistoryProvider) and p.policy.load_messages:
            loaders.append(p)
    if len(loaders) > 1:
        names = ", ".join(repr(p) for p in loaders)
        raise UsageError(
            f"only one history provider may load messages, but {names} all do; give the others "
            "policy=HistoryPolicy(load_messages=False) (for audit logs: "
            "HistoryPolicy(load_messages=False, store_context_messages=True))"
        )
    return owners
