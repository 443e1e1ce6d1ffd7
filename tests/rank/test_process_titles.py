"""Ranks, workers and the fork server say what they are in ps, top and nvidia-smi (/proc/<pid>/comm and cmdline).

Each is a real process: ranks forked, spawned and forked by the real fork server, persistent
workers, the server itself. The command line a process can show is as long as the one it was
started with (nbaccel.rank.process_title), so expected titles are cut to this process's own.

Imports internals (launch.fork_server, notebook.cell, rank.process_title): the server's pid, a
compiled cell's label, the argument area's length; it tests those units directly.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from nbaccel import notebook_launcher, start_workers
from nbaccel.launch.starters import fork_server
from nbaccel.notebook.cell import compile_cell
from nbaccel.rank import process_title
from nbaccel.rank.process_title import command_line

pytestmark = pytest.mark.timeout(120)


def names() -> tuple[str, str]:
    """This process's comm and command line, as ps reads them."""
    with open(f"/proc/{os.getpid()}/comm") as comm:
        return comm.read().strip(), command_line(os.getpid())


def fits(title: str, forked_from: int | None = None) -> str:
    """``title`` as the argument area of ``forked_from`` (default: this process) can hold it: what a
    process forked from it shows. The fork server's ranks have the server's area, which is this
    process's when it was forked at import, and its own command line's when it was exec'd."""
    if forked_from is None:
        area = process_title._AREA
    else:
        with open(f"/proc/{forked_from}/stat", "rb") as stat:
            text = stat.read()
        fields = text[text.rfind(b")") + 2 :].split()
        area = int(fields[45]), int(fields[46])
    assert area is not None, "Linux gives every process an argument area"
    return title[: area[1] - area[0] - 1]


def server_pid() -> int:
    server = fork_server.running_server()
    assert server is not None
    return server.pid


def train() -> tuple[str, str]:
    return names()


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_each_rank_is_named_by_its_rank_and_its_function(start_method: str) -> None:
    titles = notebook_launcher(train, num_processes=2, cpu=True, output="text", start_method=start_method)
    if start_method == "spawn":  # a spawned rank's command line is its own, `python -m nbaccel.rank.spawn_entry`
        assert titles == [("nbaccel-r0/2", "nbaccel rank 0/2 (train)"), ("nbaccel-r1/2", "nbaccel rank 1/2 (train)")]
    else:
        parent = server_pid() if start_method == "forkserver" else None
        assert titles == [(f"nbaccel-r{r}/2", fits(f"nbaccel rank {r}/2 (train)", parent)) for r in range(2)]
    if start_method == "forkserver":
        fork_server.shutdown()


def test_a_cell_rank_is_named_by_its_cell_and_a_wrapped_function_by_the_function() -> None:
    cell = compile_cell("from tests.rank.test_process_titles import names\nnames()")
    cell.label = "cell [12]"  # what %%distributed sets: the cell's In[12]
    # Through the fork server: the cell travels pickled, its label with it.
    try:
        assert notebook_launcher(cell, num_processes=2, cpu=True, output="text", start_method="forkserver")[1] == (
            "nbaccel-r1/2",
            fits("nbaccel rank 1/2 (cell [12])", server_pid()),
        )
    finally:
        fork_server.shutdown()
    wrapped = functools.partial(train)
    assert notebook_launcher(wrapped, num_processes=2, cpu=True, output="text", pdb=True)[0] == ("nbaccel-r0/2", fits("nbaccel rank 0/2 (train)"))


def test_persistent_workers_are_named_workers() -> None:
    pool = start_workers(num_processes=2, cpu=True)
    try:
        assert pool.run(train) == [(f"nbaccel-w{r}/2", fits(f"nbaccel worker {r}/2")) for r in range(2)]
    finally:
        pool.stop()


def test_the_fork_server_names_itself_and_its_kernel() -> None:
    notebook_launcher(train, num_processes=1, cpu=True, output="text", start_method="forkserver")  # answered: it runs its loop
    server = fork_server.running_server()
    assert server is not None
    try:
        with open(f"/proc/{server.pid}/comm") as comm:
            assert comm.read().strip() == "nbaccel-forksrv"
        assert command_line(server.pid) == fits(f"nbaccel fork server (kernel {os.getpid()})", server.pid)
        assert names()[0] != "nbaccel-forksrv"  # the kernel keeps its own names
    finally:
        fork_server.shutdown()


def test_a_long_title_is_cut_to_the_argument_area_and_the_environment_is_untouched() -> None:
    """A process started with a short command line shows as much of the title as it holds; its
    environment (read by C's getenv, as NCCL does) stays whole."""
    code = (
        "import ctypes;from nbaccel.rank import process_title as t;"
        "t.set_title('nbaccel rank 1/4 (' + 'x' * 4000 + ')', 'nbaccel-r1/4-and-more');"
        "getenv = ctypes.CDLL(None).getenv; getenv.restype = ctypes.c_char_p;"
        "print(open('/proc/self/comm').read().strip(), t.command_line(), getenv(b'NBACCEL_PROBE').decode(), sep='|')"
    )
    env = {**os.environ, "NBACCEL_PROBE": "kept"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    comm, cmdline, probe = run.stdout.strip().split("|")
    area = len(sys.executable) + 1 + len("-c") + 1 + len(code) + 1  # the arguments, each ended by a NUL
    assert comm == "nbaccel-r1/4-an" and probe == "kept"
    assert cmdline.startswith("nbaccel rank 1/4 (xxx") and len(cmdline) == area - 1
