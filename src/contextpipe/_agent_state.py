"""The session state an agent keeps for itself and checks its providers against: reserved keys, token calibration.

`Agent` refuses a provider whose state would overwrite another's or the agent's own
(`provider_state_keys`), and reads back the token calibration a session keeps (`stored_calibration`).
"""

from __future__ import annotations

from .approvals import STATE_KEY as APPROVALS_KEY
from .errors import CodecError, UsageError
from .providers.base import ContextProvider
from .session import RESERVED_STATE_KEYS, ProviderState, Session
from .tokens import CALIBRATION_KEY, Calibration

__all__ = ["RESERVED_KEYS", "provider_state_keys", "stored_calibration"]

RESERVED_KEYS = {**RESERVED_STATE_KEYS, CALIBRATION_KEY: "the agent's token calibration",
                  APPROVALS_KEY: "the session's approvals (tools always allowed, approved calls, held late results)"}


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
