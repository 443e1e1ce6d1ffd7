"""The sampler adds each CUDA rank's device memory and its GPU's utilisation, asked of NVML (a fake built with cc).

No GPU here, and a plan that says CUDA would start ranks that cannot run; the seam is the device
map (rank -> its cuda index): real processes (sleeping children, or a real launch's gloo ranks)
whose pids the fake NVML lists, given a device map as a CUDA plan would give it.

Imports internals (launch.sampler, launch.group, devices.nvml, notebook.worker_tables): the public face shows none of this.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nbaccel
from nbaccel.devices import nvml
from nbaccel.launch.group import LocalRankGroup
from nbaccel.launch.sampler import ResourceSampler
from nbaccel.testing import CollectingSink
from tests.devices.fakes import build_fake_nvml, write_use
from tests.handshake import MarkWhen

pytestmark = pytest.mark.timeout(120)

GPUS = "NVIDIA H200|GPU-aa01|9|0|;NVIDIA H200|GPU-bb02|9|0|"


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml-sampler"))


@pytest.fixture
def use_file(fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(fake_library))
    monkeypatch.setenv("FAKE_NVML_GPUS", GPUS)
    monkeypatch.setenv("FAKE_NVML_USE", str(tmp_path / "use.txt"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "use.txt"


@pytest.fixture
def children() -> Iterator[list[int]]:
    started = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        yield [child.pid for child in started]
    finally:
        for child in started:
            child.kill()
            child.wait()


def _foreign_pid() -> int:
    """A pid no process of this namespace has (as a host pid seen from inside a container)."""
    return next(pid for pid in range(4_000_000, 4_100_000) if not os.path.exists(f"/proc/{pid}"))


def test_each_cuda_rank_gets_its_device_memory_its_peak_and_its_gpus_utilisation(use_file: Path, children: list[int]) -> None:
    first, second, cpu_rank = children
    write_use(use_file, {0: {first: 2**30, 99999999: 7 * 2**30}, 1: {second: 3 * 2**30}}, {0: 37, 1: 91})
    sampler = ResourceSampler({0: first, 1: second, 2: cpu_rank}, now=0.0, gpus={0: 0, 1: 1})
    samples = sampler.sample(1.0)
    assert samples[0]["gpu_mem"] == 2**30 and samples[0]["peak_gpu_mem"] == 2**30 and samples[0]["gpu_util"] == 37
    assert samples[1]["gpu_mem"] == 3 * 2**30 and samples[1]["gpu_util"] == 91
    assert "gpu_mem" not in samples[2] and samples[2]["rss"] > 0  # a rank without a GPU: CPU and memory only
    write_use(use_file, {0: {first: 2**29}, 1: {}}, {0: 5, 1: 0})  # rank 1 freed everything
    samples = sampler.sample(2.0)
    assert samples[0]["gpu_mem"] == 2**29 and samples[0]["peak_gpu_mem"] == 2**30 and samples[0]["gpu_util"] == 5
    assert samples[1]["gpu_mem"] == 0 and samples[1]["peak_gpu_mem"] == 3 * 2**30  # not listed: it holds nothing there
    assert sampler.gpu_peaks == {0: 2**30, 1: 3 * 2**30}


def test_pids_of_another_namespace_leave_the_memory_unknown_never_guessed(use_file: Path, children: list[int]) -> None:
    write_use(use_file, {0: {_foreign_pid(): 4 * 2**30}}, {0: 60})  # what NVML answers inside a container
    sampler = ResourceSampler({0: children[0]}, now=0.0, gpus={0: 0})
    sample = sampler.sample(1.0)[0]
    assert sample["gpu_mem"] is None and sample["peak_gpu_mem"] is None and sample["gpu_util"] == 60


def test_cpu_ranks_and_a_machine_without_nvml_ask_nothing(fake_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: list[int]) -> None:
    fresh = tmp_path / "unopened" / "libnvidia-ml.so.1"  # a path NVML was never opened from
    fresh.parent.mkdir()
    fresh.write_bytes(fake_library.read_bytes())
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(fresh))
    sampler = ResourceSampler({0: children[0]}, now=0.0)  # a CPU plan: no device map
    assert set(sampler.sample(1.0)[0]) == {"cpu", "rss", "peak_rss", "cpu_time"}
    assert str(fresh) not in Path("/proc/self/maps").read_text()  # not even loaded
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(tmp_path / "missing.so"))
    sampler = ResourceSampler({0: children[0]}, now=0.0, gpus={0: 0})  # CUDA ranks, no NVML: CPU and memory, no error
    assert sampler.gpu is None and set(sampler.sample(1.0)[0]) == {"cpu", "rss", "peak_rss", "cpu_time"}


def hold_and_say_my_pid(use_path: str) -> int:
    """A rank that writes its own line into the fake NVML's file (as the driver would list it) and waits."""
    import os

    import torch.distributed as dist

    from tests.handshake import wait_for

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(f"{use_path}.{rank}", "w") as mine:
        mine.write(f"proc {rank} {os.getpid()} {(rank + 1) * 2**30}\nutil {rank} {40 + rank}\n")
    dist.barrier()
    if rank == 0:
        with open(use_path + ".new", "w") as whole:
            whole.write("".join(Path(f"{use_path}.{r}").read_text() for r in range(2)))
        os.replace(use_path + ".new", use_path)
    wait_for(use_path + ".seen")  # the kernel sampled every rank with the file in place
    dist.barrier()
    return rank


@pytest.mark.slow
def test_a_real_launch_samples_its_ranks_gpu_use_through_the_loop(use_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # gloo ranks on the CPU, given the device map a CUDA plan gives (rank r on cuda:r)
    monkeypatch.setattr(LocalRankGroup, "local_gpus", lambda self: {rank: rank for rank in range(self.num_processes)})
    sink = MarkWhen(str(use_file) + ".seen", all_sampled_on_a_gpu(2))
    assert nbaccel.notebook_launcher(hold_and_say_my_pid, args=(str(use_file),), num_processes=2, cpu=True, output=sink) == [0, 1]
    for rank in (0, 1):
        listed = [e for e in sink.events[rank] if e["type"] == "resources" and e.get("gpu_mem")]
        assert listed, sink.events[rank]
        assert listed[-1]["gpu_mem"] == (rank + 1) * 2**30 and listed[-1]["gpu_util"] == 40 + rank
        assert listed[-1]["peak_gpu_mem"] == (rank + 1) * 2**30


def test_the_kernel_never_loads_the_cuda_driver_to_sample(use_file: Path, children: list[int]) -> None:
    from nbaccel.devices import driver

    write_use(use_file, {0: {children[0]: 2**20}}, {0: 1})
    ResourceSampler({0: children[0]}, now=0.0, gpus={0: 0}).sample(1.0)
    assert nvml.visible_gpus() is not None  # the fake answered
    assert driver.driver_state() is driver.DriverState.NOT_LOADED


def test_a_node_agent_maps_its_cuda_ranks_as_its_own_cuda_visible_devices_shows_them() -> None:
    from nbaccel.launch.group import gpu_map

    # The agent's group numbers its ranks 0..nproc-1 (it sends them as first_rank + l).
    assert gpu_map("cuda", None, 2) == {0: 0, 1: 1}  # local rank l on cuda:l of the agent's devices
    assert gpu_map("cuda", [3, 1], 2) == {0: 3, 1: 1}  # a spec that names the devices
    assert gpu_map("cpu", None, 2) == {}  # gloo ranks: NVML is never asked
    assert gpu_map("cuda", [5], 2) == {0: 5}  # fewer devices than ranks: only those named


def test_distributed_status_of_workers_shows_what_nvml_lists_for_each_worker(use_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbaccel.notebook.worker_tables import status_table

    monkeypatch.setattr(LocalRankGroup, "local_gpus", lambda self: {rank: rank for rank in range(self.num_processes)})
    pool = nbaccel.start_workers(2, cpu=True)
    try:
        pids = [s.pid for s in pool.status()]
        write_use(use_file, {0: {pids[0]: 3 * 2**30}, 1: {pids[1]: 2**29}}, {0: 71, 1: 4})
        statuses = pool.status()
    finally:
        pool.stop()
    assert [s.gpu_held_mb for s in statuses] == [3 * 1024, 512] and [s.gpu_util for s in statuses] == [71, 4]
    assert [s.gpu_peak_mb for s in statuses] == [3 * 1024, 512]
    table = status_table(statuses).splitlines()
    assert "gpu use (held/peak/busy)" in table[0]
    assert "3.0 GiB / 3.0 GiB / 71%" in table[1] and "512 MiB / 512 MiB / 4%" in table[2]


def all_sampled_on_a_gpu(ranks: int) -> Callable[[CollectingSink], bool]:
    """Every rank has a sample that lists its GPU memory: the sampler read the fake NVML's file."""
    return lambda sink: all(any(e["type"] == "resources" and e.get("gpu_mem") for e in sink.events.get(r, [])) for r in range(ranks))
