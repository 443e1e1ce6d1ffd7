"""A stuck rank's last collective in the stack summary (issue 14, item 11), decided here without a GPU.

The launcher turns the recorder on for NCCL ranks only; the rank points its pipe and dump into
the launch's private folder; the kernel pokes the pipe and adds the newest entry to the summary.
NCCL's watchdog is played by a real child process that does what torch's DumpPipe does (a FIFO
``<prefix><rank>.pipe`` read without blocking; on any byte, a pickled dump at ``<prefix><rank>``).
The real watchdog answers in tests/gpu/test_gpu_paths.py. On gloo (real ranks below) each rank's
own thread says how many collectives it issued.

Imports internals (launch.stacks, wire, wire.rank_env): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import nbaccel
from nbaccel.launch.stacks import StackFiles
from nbaccel.testing import CollectingSink, scaled
from nbaccel.wire import flight_recorder
from nbaccel.wire.rank_env import rank_environment

pytestmark = pytest.mark.timeout(60)


def test_the_recorder_is_on_for_nccl_ranks_only_and_a_users_setting_wins() -> None:
    cuda = rank_environment(rank=0, world_size=1, master_port=29500, device_type="cuda", inherited={})
    assert cuda["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    cpu = rank_environment(rank=0, world_size=1, master_port=29500, device_type="cpu", inherited={})
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in cpu
    mine = rank_environment(rank=0, world_size=1, master_port=29500, device_type="cuda", inherited={"TORCH_FR_BUFFER_SIZE": "50"})
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in mine  # the rank inherits the user's own


RANK_SIDE = """
import os, sys
from nbaccel.rank import stack_dump
stack_dump.install(sys.argv[1])
print(os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"), os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE"))
"""


@pytest.mark.parametrize(("buffer", "user_pipe"), [("2000", None), ("0", None), ("2000", "/mine/pipe-")])
def test_the_rank_points_the_recorder_into_the_private_folder(tmp_path, buffer, user_pipe) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NCCL", "TORCH_FR"))}
    env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = buffer
    if user_pipe:
        env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] = user_pipe
    stack_file = str(tmp_path / "rank3.txt")
    run = subprocess.run([sys.executable, "-c", RANK_SIDE, stack_file], env=env, capture_output=True, text=True, timeout=30, check=True)
    pipe, dump = run.stdout.split()
    if buffer == "0":
        assert (pipe, dump) == ("None", "None")
    else:
        assert pipe == (user_pipe or f"{tmp_path}/nccl-pipe-")
        assert dump == f"{tmp_path}/nccl-trace-"


WATCHDOG = """
import faulthandler, os, pickle, signal, sys, time
folder, rank = sys.argv[1], int(sys.argv[2])
faulthandler.register(signal.SIGUSR2, file=open(os.path.join(folder, f"rank{rank}.txt"), "a"), all_threads=True)
pipe = os.path.join(folder, f"nccl-pipe-{rank}.pipe")
os.mkfifo(pipe, 0o666)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # as torch's DumpPipe opens it
print("ready", flush=True)
entries = [
    {"record_id": 0, "collective_seq_id": 6, "profiling_name": "nccl:broadcast", "state": "completed", "process_group": ("0", "default_pg")},
    {"record_id": 1, "collective_seq_id": 7, "profiling_name": "nccl:all_reduce", "state": "started", "process_group": ("0", "default_pg")},
]
while True:
    try:
        asked = os.read(fd, 100)
    except BlockingIOError:
        asked = b""
    if asked:
        with open(os.path.join(folder, f"nccl-trace-{rank}"), "wb") as dump:
            pickle.dump({"version": "2.4", "pg_config": {}, "entries": entries}, dump)
    time.sleep(0.05)
"""


def test_a_stuck_nccl_ranks_summary_names_its_last_collective_and_number() -> None:
    files = StackFiles()
    watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, files.folder, "1"], stdout=subprocess.PIPE, text=True)
    try:
        assert watchdog.stdout.readline().strip() == "ready"
        found = files.collect({1: watchdog.pid})
        assert found[1].summary.endswith("; last collective: nccl:all_reduce #7 (started)"), found[1].summary
    finally:
        watchdog.kill()
        watchdog.wait()
        watchdog.stdout.close()
        files.close()


def test_a_rank_without_a_recorder_keeps_its_plain_summary() -> None:
    files = StackFiles()
    sleeper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import faulthandler, signal, time
        faulthandler.register(signal.SIGUSR2, file=open({files.path(0)!r}, "a"), all_threads=True)
        print("ready", flush=True)
        time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sleeper.stdout.readline().strip() == "ready"
        summary = files.collect({0: sleeper.pid})[0].summary
        assert "last collective" not in summary and summary.startswith("rank 0: ")
    finally:
        sleeper.kill()
        sleeper.wait()
        sleeper.stdout.close()
        files.close()


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_dump_that_names_a_class_is_refused_not_run(tmp_path) -> None:
    path = tmp_path / "nccl-trace-0"
    path.write_bytes(pickle.dumps({"entries": [_Evil()]}))
    assert flight_recorder.read_dump(str(path)) is None
    path.write_bytes(b'{"entries": [{"profiling_name": "nccl:all_gather", "collective_seq_id": 3, "record_id": 0}]}')
    assert flight_recorder.describe_last(flight_recorder.read_dump(str(path)) or {}) == "last collective: nccl:all_gather #3"
    path.write_bytes(pickle.dumps({"entries": []})[:5])  # half written
    assert flight_recorder.read_dump(str(path)) is None


# -- gloo: no recorder, but each rank's count of collectives ----------------------------------------


def one_collective_more_on_rank_zero() -> None:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    dist.all_reduce(torch.ones(1))  # both ranks: one collective each
    if state.process_index == 1:
        time.sleep(120)
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for a partner that does not come


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_on_gloo_a_stuck_ranks_summary_says_how_many_collectives_each_rank_issued() -> None:
    with pytest.raises(nbaccel.LaunchTimeoutError) as caught:
        nbaccel.notebook_launcher(one_collective_more_on_rank_zero, num_processes=2, cpu=True, timeout=scaled(4), output=CollectingSink())
    where = {o.rank: o.where for o in caught.value.outcomes}
    assert where[0].startswith("rank 0: in `dist.all_reduce` at ") and where[0].endswith("; 2 collectives issued"), where
    assert where[1].startswith("rank 1: in `time.sleep` at ") and where[1].endswith("; 1 collective issued"), where
    assert "nbaccel-collective-count" not in caught.value.outcomes[0].stack  # nbaccel's own thread is not shown
    assert psutil.Process().children() == []


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_rank_without_a_group_adds_no_count() -> None:
    def sleeper() -> None:
        time.sleep(120)

    with pytest.raises(nbaccel.LaunchTimeoutError) as caught:
        nbaccel.notebook_launcher(sleeper, num_processes=1, cpu=True, timeout=scaled(3), output=CollectingSink())
    assert "issued" not in caught.value.outcomes[0].where and "time.sleep" in caught.value.outcomes[0].where
