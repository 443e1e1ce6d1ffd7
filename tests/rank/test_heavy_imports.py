"""A forked rank's modules at its start are noted by its parent before the fork (no set made in the
rank); a process that was not forked notes its own.

Imports internals (rank.heavy_imports: the notes themselves).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nbaccel.rank import heavy_imports

pytestmark = pytest.mark.timeout(60)


def test_a_forked_child_has_its_parents_modules_as_they_were_at_the_fork() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it was handed, then leave without pytest's teardown
        noted = heavy_imports._AT_FORK
        os.write(write_end, b"%d %d" % (noted is not None, noted == heavy_imports.present()))
        os._exit(0)
    os.close(write_end)
    try:
        answer = os.read(read_end, 64)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert answer == b"1 1"  # noted before the fork, and what the parent had


def test_a_process_that_was_not_forked_notes_its_own_modules() -> None:
    code = "from nbaccel.rank import heavy_imports as h; print(h._AT_FORK is None, h.present_at_start() == h.present())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr
