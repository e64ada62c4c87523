"""One helper for the lazy exports of packages whose members are loaded on first use.

``__getattr__ = lazy_exports(__name__, {"PostgresStore": ".postgres"})`` in a package's
``__init__`` makes ``from package import PostgresStore`` import ``package.postgres`` (and its
driver) only when the name is first used; ``import package`` alone loads nothing extra. The value is
then kept in the package's namespace, so later lookups are plain attribute reads.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `import contextpipe` loads only this file
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, table: Mapping[str, str], *, submodules: Collection[str] = ()
) -> Callable[[str], object]:
    """Return a module ``__getattr__`` importing each name of `table` from its module on first use.

    `submodules` names submodules reachable as attributes (``package.stores``) without an import
    statement of their own; they too are imported when first named.
    """

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is not None:
            value: object = getattr(_imported(package + module if module.startswith(".") else module), name)
        elif name in submodules:
            value = _imported(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


def _imported(module: str) -> object:
    """Import `module` (an absolute name) through the interpreter's import statement and return it.

    Not `importlib.import_module`, whose own import of the module ``-X importtime`` does not report:
    with ``__import__`` the module appears there with its cumulative time, like any imported module.
    """
    __import__(module)
    return sys.modules[module]
