"""A rank answers for its count of collectives only once it has a default process group, however made.

The count's FIFO and thread (``nbaccel.rank.collective_count``) come with the rank's first default
group: through ``dist.init_process_group``, through the name imported from ``torch.distributed``,
through ``init_device_mesh``, under fork, the fork server and spawn alike. A rank that makes no
group has neither.

Imports internals (rank.collective_count, rank.stack_dump: the rank checks for its own FIFO; launch.starters.fork_server: to end the server).
"""

from __future__ import annotations

import pytest

import nbaccel
from nbaccel.launch.starters import fork_server
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(120)


def pipe_before_and_after(how: str) -> tuple[bool, bool, int | None]:
    """Whether this rank's count FIFO exists before and after it makes its group; its count then."""
    import os

    import torch
    import torch.distributed as dist

    from nbaccel.rank.collective_count import collective_count
    from nbaccel.wire.stack_files import STACK_FILE_VARIABLE, count_pipe_path

    pipe = count_pipe_path(os.environ[STACK_FILE_VARIABLE])
    before = os.path.exists(pipe)
    if how == "init_process_group":
        dist.init_process_group("gloo")
    elif how == "imported name":
        from torch.distributed import init_process_group

        init_process_group("gloo")
    elif how == "device mesh":
        from torch.distributed.device_mesh import init_device_mesh

        init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    if how != "none":
        dist.all_reduce(torch.ones(1))
    after = os.path.exists(pipe)
    count = collective_count()
    if dist.is_initialized():
        dist.destroy_process_group()
    return before, after, count


@pytest.mark.parametrize("how", ["init_process_group", "imported name", "device mesh"])
def test_the_count_starts_with_the_first_default_group_however_it_is_made(how: str) -> None:
    results = nbaccel.notebook_launcher(pipe_before_and_after, args=(how,), num_processes=2, cpu=True, output=CollectingSink())
    assert [r[:2] for r in results] == [(False, True), (False, True)], results
    assert all(isinstance(r[2], int) and r[2] >= 1 for r in results), results


def test_a_rank_without_a_group_has_no_count_thread() -> None:
    results = nbaccel.notebook_launcher(pipe_before_and_after, args=("none",), num_processes=1, cpu=True, output=CollectingSink())
    assert results == [(False, False, None)]


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_the_count_starts_with_the_group_under_every_start_method(start_method: str) -> None:
    try:
        results = nbaccel.notebook_launcher(
            pipe_before_and_after, args=("init_process_group",), num_processes=2, cpu=True, start_method=start_method, output=CollectingSink()
        )
    finally:
        fork_server.shutdown()  # the server the forkserver launch started (a no-op after spawn)
    assert [r[:2] for r in results] == [(False, True), (False, True)], results


IN_A_KERNEL = r"""
import os, sys, tempfile
import torch.distributed as dist
from nbaccel.rank import collective_count

collective_count.wrap_loaded()  # what the fork hook does before each fork
assert dist.init_process_group.__code__.co_filename == collective_count.__file__, "not wrapped"
dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
answering = [f for f in sys._current_frames().values() if f.f_code.co_name == "_answer_forever"]
assert not answering and collective_count._started_in != os.getpid(), answering
assert collective_count.collective_count() is not None  # the group itself is torch's, working
dist.destroy_process_group()
print("ok")
"""


def test_a_process_that_is_not_an_answering_rank_makes_a_group_as_torch_does() -> None:
    """The kernel (or a fork server, a DataLoader worker) holds the wrap its ranks inherit: its own
    group starts no answering thread (nothing to make its pipe). In a child interpreter: a group
    made in this process would be inherited, half-built, by the next tests' forked ranks."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IN_A_KERNEL], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def group_in_a_fork_of_the_rank(store: str) -> tuple[bool, bool]:
    """Whether this rank's count FIFO exists after a process it forked (a DataLoader worker, say)
    made a group of its own; and after the rank made its own."""
    import os

    import torch.distributed as dist

    from nbaccel.wire.stack_files import STACK_FILE_VARIABLE, count_pipe_path

    pipe = count_pipe_path(os.environ[STACK_FILE_VARIABLE])
    child = os.fork()
    if child == 0:
        code = 1
        try:
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
            dist.destroy_process_group()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after_child = os.path.exists(pipe)
    dist.init_process_group("gloo")
    after_rank = os.path.exists(pipe)
    dist.destroy_process_group()
    return after_child, after_rank


def test_a_process_the_rank_forked_answers_for_no_count(tmp_path: pytest.TempPathFactory) -> None:
    results = nbaccel.notebook_launcher(group_in_a_fork_of_the_rank, args=(f"{tmp_path}/store",), num_processes=1, cpu=True, output=CollectingSink())
    assert results == [(False, True)]
