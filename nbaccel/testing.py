"""What tests of nbaccel (and of code built on it) stand on, instead of internal module paths.

Example:
    >>> sink = CollectingSink()
    >>> sink.output(0, "stdout", ["hello"])
    >>> sink.text(0)
    ['hello']
    >>> nbaccel_frames('File "/site/nbaccel/launch/loop.py", line 3\\nFile "Cell In[2]", line 1')
    ['File "/site/nbaccel/launch/loop.py", line 3']
"""

from __future__ import annotations

import re

from nbaccel.output.sinks import CollectingSink
from nbaccel.state import reset_all_states

__all__ = ["CollectingSink", "nbaccel_frames", "reset_all_states"]

# A frame of nbaccel's own in a traceback names a file inside the package, whatever it is called.
_PACKAGE_FILE = re.compile(r"nbaccel[/\\](?:[\w.-]+[/\\])*[\w.-]+\.py")


def nbaccel_frames(traceback_text: str) -> list[str]:
    """The lines of ``traceback_text`` that point into nbaccel's own source files.

    Tracebacks shown to users should hold only their own code: assert that this is empty.
    """
    return [line for line in traceback_text.splitlines() if _PACKAGE_FILE.search(line)]
