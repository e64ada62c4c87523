"""Keep the process's C++ runtime sound when usearch and onnxruntime share it (Linux).

usearch's wheels link their own copy of the C++ standard library statically and export its locale
facet ids as unique symbols, which the dynamic linker shares process-wide. If usearch is loaded
before the system's ``libstdc++.so.6`` has set up its standard locale, the facet ids the two copies
hand out collide, and the next library that uses a locale facet -- onnxruntime from 1.23 on, at its
import -- calls the wrong virtual function and the process dies (SIGSEGV). Setting the system
locale up first (what any C++ program does at start, and what importing torch or onnxruntime first
happens to do) keeps the ids consistent. `prepare` does it when `contextpipe.vectors` is imported,
which is always before contextpipe loads usearch; `onnxruntime_is_safe` says whether importing
onnxruntime now is safe (it is not if usearch was loaded before `prepare` could run).
"""

from __future__ import annotations

import sys

_state = {"prepared": False, "usearch_first": False}


def prepare() -> None:
    """Set up the system C++ runtime's standard locale before usearch can load (Linux; idempotent)."""
    if _state["prepared"] or sys.platform != "linux":
        return
    _state["prepared"] = True
    if "usearch.compiled" in sys.modules:
        _state["usearch_first"] = True
        return
    import ctypes

    try:
        libstdcxx = ctypes.CDLL("libstdc++.so.6")
        libstdcxx._ZNSt6locale7classicEv()  # std::locale::classic(): builds the standard facets once
    except (OSError, AttributeError):  # no system libstdc++ (musl, static builds): nothing to share with
        pass


CLASH = ("usearch was imported before contextpipe.vectors, and importing onnxruntime after it would crash this "
         "process (their C++ runtimes clash): import contextpipe.vectors first")
"""What to tell a user when `onnxruntime_is_safe` is false."""


def onnxruntime_is_safe() -> bool:
    """Whether importing onnxruntime now cannot hit usearch's C++ runtime clash."""
    if sys.platform != "linux" or "onnxruntime" in sys.modules:
        return True
    return not (_state["usearch_first"] or ("usearch.compiled" in sys.modules and not _state["prepared"]))
