"""AMD (ROCm) and Intel (XPU) GPUs decided with stand-ins: the plan, each rank's environment, the backend,
a kernel that initialised HIP or Level Zero routed to the fork server, each AMD rank's GPU memory sampled.

torch is this machine's CPU build with ``torch.version.hip`` (or ``.xpu``) set; the GPUs are stand-in
sysfs trees (``nbaccel.testing.device_root``). No rank runs on a GPU: where one would be needed the
decision and the environment each rank gets are checked; the launches that run are real (fork,
gloo ranks on CPU) with the decisions taken from the stand-ins.

Imports internals (launch.plan, launch.group, launch.fork_server, state.default_group): these
decisions sit below the public face.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import nbaccel
from nbaccel.launch import plan as plan_module
from nbaccel.launch.group import LocalRankGroup, _environment
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.preflight import fork_hazards
from nbaccel.launch.rendezvous import LoopbackRendezvous
from nbaccel.launch.starters import fork_server
from nbaccel.state.default_group import default_backend
from nbaccel.testing import CollectingSink, device_root
from tests.devices.fakes import fake_drm_tree, fake_kfd_tree, write_kfd_process
from tests.handshake import MarkWhen, wait_for

pytestmark = pytest.mark.timeout(120)

MI300X = [{"gpu_id": 2000 + i, "name": "gfx942", "unique_id": 0xBEE0 + i, "minor": 128 + i} for i in range(4)]
MAX_1550 = [(f"0000:{0x18 + i:02x}:00.0", 0x8086, 0x038000, f"renderD{128 + i}") for i in range(4)]


@pytest.fixture
def amd_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")  # a ROCm build: torch.cuda drives AMD GPUs
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(tmp_path / "no-libnvidia-ml.so.1"))
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    root = fake_kfd_tree(tmp_path / "root", MI300X)
    with device_root(root):
        yield root


@pytest.fixture
def intel_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(torch.version, "xpu", "20250101")  # an XPU build
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(tmp_path / "no-libnvidia-ml.so.1"))
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    root = fake_drm_tree(tmp_path / "root", MAX_1550)
    with device_root(root):
        yield root


def envs(plan: plan_module.LaunchPlan) -> list[dict[str, str]]:
    return [_environment(plan, LoopbackRendezvous("127.0.0.1", None), rank, 0) for rank in range(plan.num_processes)]


def test_a_rocm_torch_plans_one_rank_per_amd_gpu_on_torch_cuda_and_rccl(amd_box: Path) -> None:
    plan = plan_module.make_plan(LaunchOptions(), started=0.0)
    assert (plan.num_processes, plan.device_type, plan.gpus, plan.gpu_vendor, plan.device_notes) == (4, "cuda", (0, 1, 2, 3), "amd", ())
    assert default_backend(plan.device_type) == "nccl"  # RCCL, under torch's name for it
    for rank, env in enumerate(envs(plan)):
        assert (env["HIP_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"], env["NBACCEL_DEVICE_INDEX"], env["NBACCEL_DEVICE_TYPE"]) == (
            "0,1,2,3",
            "0,1,2,3",
            str(rank),
            "cuda",
        )


def test_rocm_visibility_variables_of_the_kernel_carry_into_the_ranks(amd_box: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "GPU-000000000000bee3,1,2")  # ROCr shows physical 3, 1, 2
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2,0")  # HIP then 2 and 3 of those: physical GPUs 2 and 3
    plan = plan_module.make_plan(LaunchOptions(num_processes=1, gpus=[1]), started=0.0)
    (env,) = envs(plan)
    assert plan.gpus == (1,) and env["HIP_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "0"  # the kernel's cuda:1 is HIP's entry "0"
    assert "ROCR_VISIBLE_DEVICES" not in env  # inherited unchanged: the HIP-level list is within it


def test_busy_amd_gpus_are_skipped_from_kfd_s_per_process_memory(amd_box: Path) -> None:
    write_kfd_process(amd_box, 4242, {2000: int(38.2 * 2**30)})
    write_kfd_process(amd_box, os.getpid(), {2001: 2**30})  # this kernel: not another process
    plan = plan_module.make_plan(LaunchOptions(), started=0.0)
    assert plan.gpus == (1, 2, 3)
    assert plan.device_notes == ("GPU 0: 38.2 GiB used by pid 4242, so it is skipped (name it in gpus= to use it anyway)",)


def test_an_xpu_torch_keeps_every_device_visible_and_pins_each_rank_on_xccl(intel_box: Path) -> None:
    plan = plan_module.make_plan(LaunchOptions(), started=0.0)
    assert (plan.num_processes, plan.device_type, plan.gpus, plan.gpu_vendor) == (4, "xpu", (0, 1, 2, 3), "intel")
    assert default_backend("xpu") == "xccl"
    for rank, env in enumerate(envs(plan)):
        assert "ZE_AFFINITY_MASK" not in env and "CUDA_VISIBLE_DEVICES" not in env  # never a per-rank mask
        assert (env["NBACCEL_DEVICE_TYPE"], env["NBACCEL_DEVICE_INDEX"]) == ("xpu", str(rank))
    chosen = plan_module.make_plan(LaunchOptions(gpus=[3, 1]), started=0.0)
    assert [env["NBACCEL_DEVICE_INDEX"] for env in envs(chosen)] == ["3", "1"]  # gpus= picks, all stay visible


def test_an_xpu_rank_s_state_takes_its_device_and_xccl_from_the_environment() -> None:
    from nbaccel.state.launch_env import LaunchEnvironment
    from nbaccel.state.partial import _device, _device_index, _device_type

    env = LaunchEnvironment.read({"NBACCEL_DEVICE_TYPE": "xpu", "NBACCEL_DEVICE_INDEX": "3", "LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"})
    assert _device_type(False, env) == "xpu" and _device("xpu", _device_index(env, 1)) == torch.device("xpu", 3)
    assert default_backend(_device_type(False, env)) == "xccl"


def test_a_cuda_torch_beside_amd_gpus_says_which_build_they_need(amd_box: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    plan = plan_module.make_plan(LaunchOptions(), started=0.0)
    assert plan.device_type == "cpu" and len(plan.device_notes) == 1
    assert (
        "is a CUDA 12.6 build; the 4 AMD GPU(s) here need a ROCm build (pip install torch --index-url https://download.pytorch.org/whl/rocm6.4)"
        in plan.device_notes[0]
    )


def whose_child() -> int:
    return os.getppid()


@pytest.mark.parametrize("runtime", ["hip", "level zero"])
def test_a_kernel_that_initialised_hip_or_level_zero_launches_from_the_fork_server(
    runtime: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fork_server.start_early()  # forked while this process was safe (or exec'd fresh where it cannot be)
    server = fork_server.running_server() or fork_server.fork_server()
    root = fake_kfd_tree(tmp_path / "root", MI300X) if runtime == "hip" else fake_drm_tree(tmp_path / "root", MAX_1550)
    with device_root(root):
        assert fork_hazards() == []
        held = os.open(root / ("dev/kfd" if runtime == "hip" else "dev/dri/renderD129"), os.O_RDWR)  # as ROCr's hsa_init, Level Zero's zeInit
        try:
            assert [h.kind for h in fork_hazards()] == ["rocm" if runtime == "hip" else "xpu"]
            assert nbaccel.notebook_launcher(whose_child, num_processes=2, cpu=True, output=CollectingSink()) == [server.pid] * 2
            with pytest.raises(nbaccel.PreflightError, match="HIP \\(ROCm\\) is already initialised|Level Zero \\(Intel XPU\\) is already initialised"):
                nbaccel.notebook_launcher(whose_child, num_processes=1, cpu=True, start_method="fork")
        finally:
            os.close(held)
            fork_server.shutdown()
    said = [line for line in capsys.readouterr().out.splitlines() if "fork server" in line]
    assert len(said) == 1 and ("holds /dev/kfd open" if runtime == "hip" else "holds a GPU's render node open") in said[0]


def hold_amd_memory(proc_folder: str, sampled: str) -> int:
    """A rank that writes its own KFD file (as the driver would list it) and holds it until the
    kernel's sink saw every rank's GPU memory in a sample (``sampled``)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mine = Path(proc_folder) / str(os.getpid())
    mine.mkdir()
    (mine / f"vram_{2000 + rank}").write_text(f"{(rank + 1) * 2**30}\n")
    dist.barrier()
    wait_for(sampled)
    return rank


def _every_rank_sampled_with_gpu_memory(sink: CollectingSink) -> bool:
    return all(any(e.get("type") == "resources" and e.get("gpu_mem") == (rank + 1) * 2**30 for e in sink.events.get(rank, [])) for rank in (0, 1))


@pytest.mark.slow
def test_a_real_launch_samples_each_amd_rank_s_gpu_memory_from_kfd(amd_box: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # gloo ranks on the CPU, given the device map an AMD plan gives (rank r on cuda:r, AMD's tools)
    monkeypatch.setattr(LocalRankGroup, "local_gpus", lambda self: {rank: rank for rank in range(self.num_processes)})
    start = LocalRankGroup.start.__func__  # type: ignore[attr-defined]

    def start_on_amd(cls: type[LocalRankGroup], *args: object, **kwargs: object) -> LocalRankGroup:
        group = start(cls, *args, **kwargs)
        group.gpu_vendor = "amd"
        return group

    monkeypatch.setattr(LocalRankGroup, "start", classmethod(start_on_amd))
    (amd_box / "sys/class/drm/renderD129/device/gpu_busy_percent").write_text("64\n")
    sampled = str(amd_box / "sampled")
    sink = MarkWhen(sampled, _every_rank_sampled_with_gpu_memory)
    proc = str(amd_box / "sys/class/kfd/kfd/proc")
    assert nbaccel.notebook_launcher(hold_amd_memory, args=(proc, sampled), num_processes=2, cpu=True, output=sink) == [0, 1]
    for rank in (0, 1):
        listed = [e for e in sink.events[rank] if e["type"] == "resources" and e.get("gpu_mem")]
        assert listed, sink.events[rank]
        assert listed[-1]["gpu_mem"] == listed[-1]["peak_gpu_mem"] == (rank + 1) * 2**30
        assert listed[-1]["gpu_util"] == (64 if rank == 1 else 0)


PINNED: list[int] = []  # what the stand-in set_device was asked, in each (forked) rank


def pin_recorder(device: object) -> None:
    PINNED.append(int(getattr(device, "index", device)))  # type: ignore[call-overload]


def what_each_rank_got() -> dict[str, object]:
    names = ("NBACCEL_DEVICE_TYPE", "NBACCEL_DEVICE_INDEX", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "LOCAL_RANK")
    return {"env": {name: os.environ.get(name) for name in names}, "pinned": list(PINNED), "parent": os.getppid()}


@pytest.mark.parametrize("vendor", ["amd", "intel"])
def test_a_real_launch_on_stand_in_gpus_pins_each_rank_before_its_function(
    vendor: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real forks, the plan from the stand-ins; torch's set_device is the one stand-in in the ranks
    (this torch has no GPU): each rank pins its own device before the function runs."""
    request.getfixturevalue("amd_box" if vendor == "amd" else "intel_box")
    monkeypatch.setattr(torch.cuda if vendor == "amd" else torch.xpu, "set_device", pin_recorder)
    results = nbaccel.notebook_launcher(what_each_rank_got, gpus=[2, 0], output=CollectingSink())
    assert [r["parent"] for r in results] == [os.getpid()] * 2  # forked from this process
    assert [r["pinned"] for r in results] == ([[0], [1]] if vendor == "amd" else [[2], [0]])
    envs = [r["env"] for r in results]
    if vendor == "amd":
        assert [(e["NBACCEL_DEVICE_TYPE"], e["HIP_VISIBLE_DEVICES"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [("cuda", "2,0", "2,0")] * 2
    else:
        assert [(e["NBACCEL_DEVICE_TYPE"], e["NBACCEL_DEVICE_INDEX"], e["ZE_AFFINITY_MASK"]) for e in envs] == [("xpu", "2", None), ("xpu", "0", None)]
