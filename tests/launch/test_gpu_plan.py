"""Plans on GPUs decided without one: which GPUs the ranks get, Accelerate's RTX 40 guard, clusters, bf16.

Imports internals (agent, cluster.cluster, cluster.plan, devices.nvml, launch, launch.options): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nbaccel.agent import node
from nbaccel.cluster.cluster import NodeInfo
from nbaccel.cluster.plan import cluster_on_gpus
from nbaccel.devices.inventory import Device, Inventory
from nbaccel.devices.nvml import Gpu
from nbaccel.launch import plan as plan_module
from nbaccel.launch.options import LaunchOptions
from tests.devices.fakes import build_fake_cuda, build_fake_nvml

RTX = Gpu(0, "GPU-r0", "NVIDIA GeForce RTX 4090", (8, 9))


def nvidia_gpus(count: int) -> Inventory:
    return Inventory("cuda", "nvidia", tuple(Device(i, "NVIDIA H200", i) for i in range(count)))


def test_fewer_ranks_than_gpus_get_the_first_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "gpu_inventory", lambda: nvidia_gpus(4))
    monkeypatch.setattr(plan_module, "occupants", lambda found: {})
    monkeypatch.setattr(plan_module, "nccl_guard", lambda gpus: None)
    assert plan_module.make_plan(LaunchOptions(num_processes=2), started=0.0).gpus == (0, 1)
    assert plan_module.make_plan(LaunchOptions(), started=0.0).gpus == (0, 1, 2, 3)
    assert plan_module.make_plan(LaunchOptions(gpus=(3,)), started=0.0).gpus == (3,)


@pytest.mark.parametrize(("driver", "expected"), [("535.104.05", {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}), ("550.40.07", {})])
def test_rtx40_guard_sets_nccl_variables_on_old_drivers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], driver: str, expected: dict
) -> None:
    monkeypatch.setattr(plan_module.nvml, "visible_gpus", lambda: [RTX, RTX])
    monkeypatch.setattr(plan_module.nvml, "driver_version", lambda: driver)
    for name in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    plan_module.nccl_guard((0, 1))
    assert {k: os.environ[k] for k in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE") if k in os.environ} == expected
    assert ("RTX 40-series" in capsys.readouterr().out) == bool(expected)


def test_the_user_s_nccl_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module.nvml, "visible_gpus", lambda: [RTX, RTX])
    monkeypatch.setattr(plan_module.nvml, "driver_version", lambda: "535.1.1")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "0")
    monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    plan_module.nccl_guard((0, 1))
    assert os.environ["NCCL_P2P_DISABLE"] == "0" and os.environ["NCCL_IB_DISABLE"] == "1"


def node_info(name: str, gpus: int, nproc: int) -> NodeInfo:
    return NodeInfo(name=name, host=name, address="10.0.0.1", nproc=nproc, gpus=gpus, pid=1)


def test_a_cluster_short_of_gpus_is_an_error_not_quietly_cpu() -> None:
    assert cluster_on_gpus([node_info("a", 2, 2), node_info("b", 4, 2)]) is True
    assert cluster_on_gpus([node_info("a", 0, 2), node_info("b", 0, 2)]) is False
    with pytest.raises(ValueError, match=r"node b \(b, 10.0.0.1\) has 1 GPU\(s\) for 2 rank\(s\).*--nproc-per-node.*cpu=True"):
        cluster_on_gpus([node_info("a", 2, 2), node_info("b", 1, 2)])


def test_the_agent_counts_through_the_one_gpu_map_and_hides_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "gpu_inventory", lambda: nvidia_gpus(3))
    assert node.visible_gpus() == 3
    monkeypatch.setattr(node, "gpu_inventory", lambda: Inventory("cpu", "", (), ("torch 2.13.0+cpu is a CPU-only build ...",)))
    assert node.visible_gpus() == 0  # a CPU-only torch: the node's ranks run on CPU

    def broken() -> Inventory:
        raise OSError("NVML is broken")

    monkeypatch.setattr(node, "gpu_inventory", broken)
    with pytest.raises(OSError, match="NVML is broken"):
        node.visible_gpus()


BF16 = """
import json, os, torch
torch.version.cuda = "12.6"  # a CUDA build, as far as nbaccel can tell (a CPU-only torch counts no GPU)
from nbaccel.devices import driver
from nbaccel.state.accelerator import check_precision_supported
answers = []
for precision in ("bf16", "fp8", "fp16"):
    try:
        check_precision_supported(precision, torch.device("cuda", 0))
        answers.append("ok")
    except ValueError as error:
        answers.append(str(error))
def no_count():
    raise AssertionError("torch.cuda.device_count() in the kernel: it can run cuInit")
torch.cuda.device_count = no_count
import nbaccel
try:
    state = nbaccel.AcceleratorState(mixed_precision="bf16")
    answers.append(f"state ok on {state.device}")
except ValueError as error:
    answers.append(str(error))
print(json.dumps({"answers": answers, "driver": driver.driver_state().value}))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ("Tesla V100-SXM2-16GB|GPU-v|7|0|", ["Tesla V100-SXM2-16GB (compute capability 7.0)", "Tesla V100", "ok", "not supported by Tesla V100"]),
        ("NVIDIA H200|GPU-h|9|0|", ["ok", "ok", "ok", "state ok on cuda:0"]),
    ],
)
def test_bf16_is_checked_through_nvml_without_initialising_cuda(tmp_path, gpu: str, expected: list[str]) -> None:
    record = tmp_path / "cuinit.log"
    env = {
        **os.environ,
        "NBACCEL_NVML_LIBRARY": str(build_fake_nvml(tmp_path)),
        "NBACCEL_CUDA_DRIVER_LIBRARY": str(build_fake_cuda(tmp_path)),
        "FAKE_CUDA_RECORD": str(record),
        "FAKE_NVML_GPUS": gpu,
    }
    env.pop("NBACCEL_FORK_LAUNCHED", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(BF16)], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    for answer, part in zip(seen["answers"], expected, strict=True):
        assert part in answer
    assert seen["driver"] == "not loaded" and not record.exists()


def test_a_cluster_runs_on_its_nodes_kind_of_gpu_and_refuses_a_mix() -> None:
    xpu = [NodeInfo(name=n, host=n, address="10.0.0.1", nproc=2, gpus=4, pid=1, device_type="xpu") for n in "ab"]
    assert cluster_on_gpus(xpu) is True
    mixed = [xpu[0], NodeInfo(name="c", host="c", address="10.0.0.3", nproc=2, gpus=2, pid=1)]
    with pytest.raises(
        ValueError, match=r"node a \(a, 10.0.0.1\) has xpu GPUs; node c \(c, 10.0.0.3\) has cuda GPUs: one launch runs on one kind of GPU.*cpu=True"
    ):
        cluster_on_gpus(mixed)


def test_the_agent_joins_with_its_gpus_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "gpu_inventory", lambda: Inventory("xpu", "intel", tuple(Device(i, "Intel GPU 0x0bd5", i) for i in range(2))))
    assert node.node_devices() == (2, "xpu")
    monkeypatch.setattr(node, "gpu_inventory", lambda: Inventory("cuda", "", ()))
    assert node.node_devices() == (0, "cpu")
