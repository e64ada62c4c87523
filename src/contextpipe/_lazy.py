"""One helper for the lazy exports of subpackages whose members load optional dependencies.

``__getattr__ = lazy_exports(__name__, {"PostgresStore": ".postgres"})`` in a package's
``__init__`` makes ``from package import PostgresStore`` import ``package.postgres`` (and its
driver) only when the name is first used; ``import package`` alone loads nothing extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, table: Mapping[str, str]) -> Callable[[str], object]:
    """Return a module ``__getattr__`` importing each name of `table` from its module on first use."""

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    return __getattr__
