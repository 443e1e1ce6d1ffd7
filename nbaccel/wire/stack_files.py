"""The files of "where is each rank?", named alike by the kernel and the rank.

The kernel gives each rank a stack file private to the launch (``NBACCEL_STACK_FILE``) and sends
``STACK_SIGNAL`` to ask for its stacks (``nbaccel.launch.stacks``); the rank registers
``faulthandler`` for that signal and answers into the file (``nbaccel.rank.stack_dump``). Beside
it lie the line that ends a complete dump, and the named pipe and answer file of the rank's count
of collectives (``nbaccel.rank.collective_count``). Both sides take the names from here, so
neither imports the other's code for them.

Example:
    >>> last_line_path("/tmp/nbaccel-stacks/rank-1"), count_pipe_path("/tmp/nbaccel-stacks/rank-1")
    ('/tmp/nbaccel-stacks/rank-1.last', '/tmp/nbaccel-stacks/rank-1.count.pipe')
"""

from __future__ import annotations

import signal

STACK_SIGNAL = signal.SIGUSR2  # sent to the rank alone, never its process group
STACK_FILE_VARIABLE = "NBACCEL_STACK_FILE"


def last_line_path(stack_file: str) -> str:
    """Where the rank says how its dumps end: faulthandler writes no end marker, but it dumps the
    main thread (the oldest) last, and that stack always ends in the same outermost frame."""
    return stack_file + ".last"


def count_pipe_path(stack_file: str) -> str:
    """The named pipe the kernel writes to, to ask the rank dumping to ``stack_file`` for its count of collectives."""
    return stack_file + ".count.pipe"


def count_answer_path(stack_file: str) -> str:
    """Where that rank writes its count ("" without a group)."""
    return stack_file + ".count"
