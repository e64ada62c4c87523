"""`override` (PEP 698) for the type checker, without loading `typing_extensions` when a program runs.

`typing.override` is new in Python 3.12; `typing_extensions` has it for 3.11, but importing that
module costs some 5 ms, which every program using a store would pay for a decorator that, at run
time, only marks the method.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import override
else:
    def override(method: Any) -> Any:
        """Mark `method` as overriding its base class's, as `typing_extensions.override` does at run time."""
        with contextlib.suppress(AttributeError, TypeError):  # not writable (a builtin): nothing to mark
            method.__override__ = True
        return method

__all__ = ["override"]
