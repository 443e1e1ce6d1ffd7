"""The stack folders: one private parent per kernel process, a folder per live group, reused; and the
wait for a rank's answer file, which wakes when the file lands instead of polling.

Imports internals (launch.stacks, launch.folder_watch): it tests those units directly.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import nbaccel
from nbaccel.launch.folder_watch import FolderWatch
from nbaccel.launch.stacks import StackFiles
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(60)


def test_groups_alive_at_once_get_their_own_private_folders_and_a_closed_one_is_reused() -> None:
    first, second = StackFiles(), StackFiles()
    try:
        assert first.folder != second.folder
        parent = os.path.dirname(first.folder)
        assert os.path.dirname(second.folder) == parent
        for folder in (parent, first.folder):
            assert stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0  # only this user
        with open(first.path(0), "w") as dump:
            dump.write("a rank's dump")
        with open(first.path(0) + ".last", "w"):
            pass
        first.close()
        first.close()  # idempotent: handed back once
        third = StackFiles()
        assert third.folder == first.folder  # no mkdtemp, no removal
        third.close()
    finally:
        second.close()


def test_a_folder_holding_more_than_the_ranks_dumps_is_removed_not_reused() -> None:
    files = StackFiles()
    with open(os.path.join(files.folder, "nccl-trace-0"), "wb"):  # a process group's leftovers
        pass
    files.close()
    assert not os.path.exists(files.folder)
    again = StackFiles()
    assert again.folder != files.folder
    again.close()


def test_the_parent_folder_goes_when_the_process_exits() -> None:
    script = textwrap.dedent("""
        from nbaccel.launch.stacks import StackFiles
        files = StackFiles()
        print(files.folder, flush=True)
        files.close()
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    folder = run.stdout.strip()
    assert folder.startswith("/") and not os.path.exists(os.path.dirname(folder)), run.stderr


def test_launches_reuse_the_folder_and_stacks_are_still_taken() -> None:
    before = StackFiles()
    before.close()
    nbaccel.notebook_launcher(lambda: 0, num_processes=2, output=CollectingSink())
    after = StackFiles()
    try:
        assert after.folder == before.folder  # the launch took it and gave it back
    finally:
        after.close()


def test_a_wait_wakes_when_another_process_renames_its_answer_into_place(tmp_path) -> None:
    script = "import os, sys; open(sys.argv[1] + '.tmp', 'w').write('7'); os.replace(sys.argv[1] + '.tmp', sys.argv[1])"
    answer = tmp_path / "answer"
    with FolderWatch(str(tmp_path)) as watch:
        writer = subprocess.Popen([sys.executable, "-c", script, str(answer)])
        try:
            deadline = time.monotonic() + 30
            while not answer.exists():
                assert watch.wait(deadline - time.monotonic()), "the answer never woke the wait"
        finally:
            writer.wait(timeout=30)
    assert answer.read_text() == "7"


def test_a_wait_with_nothing_written_ends_at_its_timeout(tmp_path) -> None:
    with FolderWatch(str(tmp_path)) as watch:
        started = time.monotonic()
        assert watch.wait(0.05) is False
        assert time.monotonic() - started >= 0.04
