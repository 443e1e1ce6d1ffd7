"""GPUs count only when the installed torch can drive them: a CPU-only torch on an NVIDIA box runs CPU ranks.

The real CPU torch of this machine (``torch.version.cuda`` is None) beside a fake NVML that lists
two GPUs and a fake libcuda: a real launch (real forks, real gloo ranks) and its notice.

Imports internals (devices.inventory, devices.torch_build, launch.plan): the decisions are tested below the public face too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import nbaccel
from nbaccel.devices import driver
from nbaccel.devices.inventory import gpu_inventory
from nbaccel.devices.torch_build import TorchBuild, install_hint
from nbaccel.testing import CollectingSink
from tests.devices.fakes import build_fake_cuda, build_fake_nvml

pytestmark = pytest.mark.timeout(120)

TWO_H200 = "NVIDIA H200|GPU-aa01|9|0|;NVIDIA H200|GPU-bb02|9|0|"


@pytest.fixture
def nvidia_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine with an NVIDIA driver whose NVML lists two H200s (a fresh library: NVML reads its GPUs once)."""
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(build_fake_nvml(tmp_path / "nvml")))
    monkeypatch.setenv("NBACCEL_CUDA_DRIVER_LIBRARY", str(build_fake_cuda(tmp_path / "cuda")))
    monkeypatch.setenv("FAKE_CUDA_RECORD", str(tmp_path / "cuinit.log"))
    monkeypatch.setenv("FAKE_NVML_GPUS", TWO_H200)
    monkeypatch.setenv("FAKE_NVML_CUDA", "12060")  # the driver supports CUDA 12.6
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "cuinit.log"


def where_am_i() -> dict[str, object]:
    import os

    import torch.distributed as dist

    state = nbaccel.PartialState()
    return {
        "device": str(state.device),
        "backend": dist.get_backend(),
        "type": os.environ["NBACCEL_DEVICE_TYPE"],
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def test_a_cpu_only_torch_on_a_gpu_box_runs_cpu_ranks_and_says_why(nvidia_box: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert torch.version.cuda is None  # this machine's torch is the CPU build
    results = nbaccel.notebook_launcher(where_am_i, output=CollectingSink())
    assert results == [{"device": "cpu", "backend": "gloo", "type": "cpu", "visible": None}] * 2
    notices = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel:")]
    assert len(notices) == 1, notices  # one line, not also "no GPU visible"
    assert f"torch {torch.__version__} is a CPU-only build and cannot use the 2 NVIDIA GPU(s) here, so the ranks run on CPU with gloo" in notices[0]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu126" in notices[0]  # the newest index the driver supports
    assert not nvidia_box.exists() and driver.driver_state() is not driver.DriverState.INITIALISED  # nothing ran cuInit


def test_the_plan_keeps_the_notice_and_gpus_given_are_refused_with_it(nvidia_box: Path) -> None:
    from nbaccel.launch.options import LaunchOptions
    from nbaccel.launch.plan import make_plan

    plan = make_plan(LaunchOptions(num_processes=3), started=0.0)
    assert (plan.num_processes, plan.device_type, plan.gpus, plan.gpu_vendor) == (3, "cpu", None, "")
    assert len(plan.device_notes) == 1 and "CPU-only build" in plan.device_notes[0]
    with pytest.raises(ValueError, match=r"gpus=\[0\] names device\(s\) \[0\], but only 0 GPU\(s\) are visible.*CPU-only build.*whl/cu126"):
        nbaccel.notebook_launcher(where_am_i, gpus=[0])


def test_a_cuda_torch_counts_the_same_gpus(nvidia_box: Path) -> None:
    found = gpu_inventory(build=TorchBuild("2.13.0+cu126", cuda="12.6", hip=None, xpu=None))
    assert (found.device_type, found.vendor, [d.name for d in found.devices], found.notes) == ("cuda", "nvidia", ["NVIDIA H200"] * 2, ())


def test_install_hints_name_the_build_for_each_vendor() -> None:
    assert install_hint("nvidia", (13, 1)).endswith("/cu130")
    assert install_hint("nvidia", (12, 9)).endswith("/cu128")
    assert install_hint("nvidia", (11, 4)).endswith("/cu118")  # older than every index: the oldest
    assert install_hint("nvidia").endswith("/cu128") and install_hint("amd").endswith("/rocm6.4")


NO_NVML_LAUNCH = """
import json, os, sys
import nbaccel
from nbaccel.testing import CollectingSink
print(json.dumps({"devices": nbaccel.notebook_launcher(lambda: nbaccel.PartialState().device.type, output=CollectingSink()), "pid": os.getpid()}))
"""


@pytest.mark.slow
def test_without_nvml_the_driver_counts_in_a_child_and_the_kernel_stays_uninitialised(tmp_path: Path) -> None:
    """In a fresh interpreter: loading the fake libcuda (no cuInit) would stay loaded in this one."""
    import json
    import os
    import subprocess
    import sys

    record = tmp_path / "cuinit.log"
    env = {
        **os.environ,
        "NBACCEL_NVML_LIBRARY": str(tmp_path / "no-libnvidia-ml.so.1"),  # a container without NVML
        "NBACCEL_CUDA_DRIVER_LIBRARY": str(build_fake_cuda(tmp_path / "cuda")),
        "FAKE_CUDA_RECORD": str(record),
        "FAKE_CUDA_DEVICES": "2",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", NO_NVML_LAUNCH], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["devices"] == ["cpu", "cpu"]
    assert "cannot use the 2 NVIDIA GPU(s) here, so the ranks run on CPU with gloo" in done.stdout
    assert str(seen["pid"]) not in record.read_text().split()  # cuInit ran in the counting child only


def test_fp8_on_a_cpu_only_torch_says_why_there_is_no_gpu(nvidia_box: Path) -> None:
    with pytest.raises(ValueError, match=r"mixed_precision='fp8' needs GPUs.*CPU-only build and cannot use the 2 NVIDIA GPU"):
        nbaccel.notebook_launcher(where_am_i, mixed_precision="fp8")


def test_a_state_made_in_the_kernel_counts_no_gpu_a_cpu_only_torch_cannot_use(nvidia_box: Path) -> None:
    from nbaccel.state.partial import cuda_device_count
    from nbaccel.testing import reset_all_states

    assert cuda_device_count() == 0  # NVML lists 2 GPUs; this torch could not use them
    try:
        assert nbaccel.PartialState().device == torch.device("cpu")
    finally:
        reset_all_states()
