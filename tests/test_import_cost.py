"""Importing contextpipe stays cheap: pydantic is loaded only with the first tool or typed session state."""

from __future__ import annotations

import subprocess
import sys

CHECK_IMPORT = """
import sys, contextpipe
from contextpipe.providers import History
from contextpipe.stores import SQLiteStore
assert 'pydantic' not in sys.modules, 'import contextpipe loaded pydantic'
from contextpipe.tokens import Calibration
assert Calibration().ratio == 1.0 and 'pydantic' in sys.modules
"""

CHECK_TOOL = '''
from contextpipe import tool
@tool
def double(x: int) -> int:
    """Double x."""
    return 2 * x
print(sorted(double.spec.parameters["properties"]))
'''


def test_import_does_not_load_pydantic_until_a_tool_needs_it() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK_IMPORT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-c", CHECK_TOOL], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['x']"
