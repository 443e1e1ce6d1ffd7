"""A forked rank's environment set as one block (issue 28): the C environment and os.environ
agree, on real forked ranks, and what only the C environment held in the kernel is kept.

Imports an internal (rank.bootstrap.prepare_environment) to check it is in use on this platform.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

import nbaccel
from nbaccel.rank.bootstrap import prepare_environment


def _seen() -> dict[str, object]:
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    os.environ["NBACCEL_TEST_SET_IN_RANK"] = "yes"  # setenv on a replaced environ must work
    del os.environ["NBACCEL_TEST_TO_DROP"]  # and unsetenv
    shell = subprocess.run(
        ["sh", "-c", 'echo "$RANK $WORLD_SIZE $NBACCEL_TEST_C_ONLY $NBACCEL_TEST_SET_IN_RANK|$NBACCEL_TEST_TO_DROP"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "c": {name: libc.getenv(name.encode()) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NBACCEL_TEST_C_ONLY", "NBACCEL_TEST_TO_DROP")},
        "py": {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NBACCEL_TEST_C_ONLY")},
        "shell": shell.stdout.strip(),
    }


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="the block is set through glibc's environ")
def test_forked_ranks_environment_in_c_and_python(monkeypatch: pytest.MonkeyPatch) -> None:
    assert prepare_environment({"RANK": "0"}) is not None  # the block path is the one tested
    monkeypatch.setenv("NBACCEL_TEST_TO_DROP", "1")
    os.putenv("NBACCEL_TEST_C_ONLY", "c")  # a library's setenv: not in os.environ
    try:
        seen = nbaccel.notebook_launcher(_seen, num_processes=2, output="text")
    finally:
        os.unsetenv("NBACCEL_TEST_C_ONLY")
    for rank, got in enumerate(seen):
        assert got["c"] == {
            "RANK": str(rank).encode(),
            "LOCAL_RANK": str(rank).encode(),
            "WORLD_SIZE": b"2",
            "NBACCEL_TEST_C_ONLY": b"c",
            "NBACCEL_TEST_TO_DROP": None,
        }
        assert got["py"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "NBACCEL_TEST_C_ONLY": None}
        assert got["shell"] == f"{rank} 2 c yes|"
