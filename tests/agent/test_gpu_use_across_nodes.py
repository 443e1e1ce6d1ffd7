"""Each node's agent samples its CUDA ranks' GPU memory and utilisation through NVML and sends them to the kernel.

No GPU here: the agents ask a fake ``libnvidia-ml.so.1`` (built with cc) which lists what the ranks
write into its file (each its own pid, as the driver would list it), and run gloo ranks on the
CPU (``cpu=True``), given the device map a CUDA launch gives (local rank l on the agent's cuda:l),
patched into the agent process, since a CUDA launch cannot run here. Everything else is real:
the agents' samplers, their links, the kernel's loop and sink.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nbaccel import Cluster, notebook_launcher
from nbaccel.testing import CollectingSink
from tests.agent.harness import stop_agents
from tests.devices.fakes import build_fake_nvml
from tests.handshake import MarkWhen

pytestmark = pytest.mark.timeout(120)

# The agent, with the device map of a CUDA launch (only the map: its ranks stay on gloo).
AGENT = """
import sys
from nbaccel.launch.group import LocalRankGroup
LocalRankGroup.local_gpus = lambda self: {local: local for local in range(self.num_processes)}
from nbaccel.agent.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.fixture
def agents_on_fake_gpus(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    use = tmp_path / "use.txt"
    env = {
        **os.environ,
        "NBACCEL_NVML_LIBRARY": str(build_fake_nvml(tmp_path / "nvml")),
        "FAKE_NVML_GPUS": "NVIDIA H200|GPU-aa01|9|0|;NVIDIA H200|GPU-bb02|9|0|",
        "FAKE_NVML_USE": str(use),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cluster = Cluster("127.0.0.1:0")
    argv = [sys.executable, "-c", AGENT, cluster.address, "--token-file", str(cluster.token_file), "--nproc-per-node", "2"]
    agents = [subprocess.Popen(argv, text=True, env=env) for _ in range(2)]
    try:
        cluster.wait(nodes=2, timeout=60)
        yield cluster, use
    finally:
        cluster.close()
        stop_agents(agents)


def hold_and_say_my_pid(use_path: str) -> int:
    """Each rank writes its line for the fake NVML (its local GPU, its pid, rank + 1 GiB); rank 0 joins them."""
    import os
    from pathlib import Path

    import torch.distributed as dist

    from tests.handshake import wait_for

    dist.init_process_group("gloo")
    rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    Path(f"{use_path}.{rank}").write_text(f"proc {local} {os.getpid()} {(rank + 1) * 2**30}\nutil {local} {50 + local}\n")
    dist.barrier()
    if rank == 0:
        Path(use_path + ".new").write_text("".join(Path(f"{use_path}.{r}").read_text() for r in range(dist.get_world_size())))
        os.replace(use_path + ".new", use_path)
    wait_for(use_path + ".seen")  # its agent sampled every rank with the file in place
    dist.barrier()
    return rank


def test_each_agent_sends_its_ranks_gpu_memory_and_utilisation_to_the_kernel(agents_on_fake_gpus: tuple[Cluster, Path]) -> None:
    cluster, use = agents_on_fake_gpus
    sink = MarkWhen(str(use) + ".seen", all_sampled_on_a_gpu(4))
    assert notebook_launcher(hold_and_say_my_pid, args=(str(use),), cluster=cluster, cpu=True, output=sink) == [0, 1, 2, 3]
    for rank in range(4):
        listed = [e for e in sink.events.get(rank, []) if e["type"] == "resources" and e.get("gpu_mem")]
        assert listed, (rank, sink.events.get(rank))
        assert listed[-1]["gpu_mem"] == (rank + 1) * 2**30 and listed[-1]["peak_gpu_mem"] == (rank + 1) * 2**30
        assert listed[-1]["gpu_util"] == 50 + rank % 2  # its agent's cuda:<local rank>


def all_sampled_on_a_gpu(ranks: int) -> Callable[[CollectingSink], bool]:
    """Every rank has a sample that lists its GPU memory: the sampler read the fake NVML's file."""
    return lambda sink: all(any(e["type"] == "resources" and e.get("gpu_mem") for e in sink.events.get(r, [])) for r in range(ranks))
