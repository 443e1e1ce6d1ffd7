"""A shared GPU box: by default a plan takes only the GPUs no other process uses, and says which it skipped.

A fake NVML (built with cc) lists four H200s, the processes on them and their memory in use;
torch is this machine's CPU build with ``torch.version.cuda`` set, so that the plan counts NVIDIA
GPUs (no CUDA rank is started: the plan and each rank's environment are what is decided).

Imports internals (launch.plan, launch.group, launch.options): these decisions sit below the public face.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from nbaccel.launch import plan as plan_module
from nbaccel.launch.group import _environment
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.rendezvous import LoopbackRendezvous
from tests.devices.fakes import build_fake_nvml, write_use

pytestmark = pytest.mark.timeout(120)

FOUR_H200 = ";".join(f"NVIDIA H200|GPU-{i}{i}0{i}|9|0|" for i in range(4))
GIB = 2**30


@pytest.fixture
def shared_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(build_fake_nvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_GPUS", FOUR_H200)
    monkeypatch.setenv("FAKE_NVML_USE", str(tmp_path / "use.txt"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.6")  # a CUDA build, as far as the plan can tell
    monkeypatch.setattr(plan_module, "nccl_guard", lambda gpus: None)
    return tmp_path / "use.txt"


def plan(capsys: pytest.CaptureFixture[str] | None = None, **options: object) -> plan_module.LaunchPlan:
    return plan_module.make_plan(LaunchOptions(**options), started=0.0)  # type: ignore[arg-type]


def test_gpus_another_process_uses_are_skipped_and_named(shared_box: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_use(shared_box, {0: {4242: int(38.2 * GIB)}, 2: {5151: 3 * GIB, 5252: None}}, {}, {0: (int(38.6 * GIB), 80 * GIB)})
    made = plan()
    assert (made.num_processes, made.device_type, made.gpus, made.gpu_vendor) == (2, "cuda", (1, 3), "nvidia")
    assert made.device_notes == (
        "GPU 0: 38.2 GiB used by pid 4242, so it is skipped (name it in gpus= to use it anyway)",
        "GPU 2: 3.0 GiB used by pids 5151, 5252, so it is skipped (name it in gpus= to use it anyway)",
    )
    said = capsys.readouterr().out
    assert all(f"nbaccel: {note}" in said for note in made.device_notes)
    # each rank sees the launch's GPUs, physical indices, and pins its own
    envs = [_environment(made, LoopbackRendezvous("127.0.0.1", None), rank, 0) for rank in range(2)]
    assert [(e["CUDA_VISIBLE_DEVICES"], e["NBACCEL_DEVICE_INDEX"], e["NBACCEL_DEVICE_TYPE"]) for e in envs] == [("1,3", "0", "cuda"), ("1,3", "1", "cuda")]


def test_this_kernel_s_own_memory_is_not_another_process(shared_box: Path) -> None:
    write_use(shared_box, {1: {os.getpid(): 5 * GIB}}, {}, {1: (5 * GIB + 300 * 2**20, 80 * GIB)})
    assert plan().gpus == (0, 1, 2, 3)


def test_memory_in_use_by_processes_nvml_does_not_list_makes_a_gpu_busy(shared_box: Path) -> None:
    write_use(shared_box, {}, {}, {0: (512 * 2**20, 80 * GIB), 3: (20 * GIB, 80 * GIB)})  # 512 MiB: the driver's own, not busy
    made = plan()
    assert made.gpus == (0, 1, 2)
    assert made.device_notes == (
        "GPU 3: 20.0 GiB of 80.0 GiB in use by processes not listed here (another container's?), so it is skipped (name it in gpus= to use it anyway)",
    )


def test_gpus_given_are_obeyed_with_a_warning_for_a_busy_one(shared_box: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_use(shared_box, {0: {4242: int(38.2 * GIB)}}, {})
    made = plan(gpus=[0, 1])
    assert made.gpus == (0, 1) and made.num_processes == 2
    assert made.device_notes == ("GPU 0: 38.2 GiB used by pid 4242; gpus= names it, so a rank uses it anyway (it may run out of memory, or run slower)",)
    assert "nbaccel: GPU 0: 38.2 GiB used by pid 4242; gpus= names it" in capsys.readouterr().out


def test_more_ranks_than_free_gpus_is_refused_naming_the_busy_ones(shared_box: Path) -> None:
    write_use(shared_box, {0: {4242: 38 * GIB}, 1: {4343: GIB}}, {})
    with pytest.raises(
        ValueError,
        match=r"num_processes=3 but only 2 of the 4 visible GPU\(s\) are free \(GPU 0: 38.0 GiB used by pid 4242; GPU 1: 1.0 GiB used by pid 4343\).*gpus=\[...\].*cpu=True",
    ):
        plan(num_processes=3)
    assert plan(num_processes=2).gpus == (2, 3)


def test_every_gpu_busy_is_an_error_not_a_quiet_cpu_launch(shared_box: Path) -> None:
    write_use(shared_box, {gpu: {4000 + gpu: GIB} for gpu in range(4)}, {})
    with pytest.raises(ValueError, match=r"only 0 of the 4 visible GPU\(s\) are free.*GPU 3: 1.0 GiB used by pid 4003"):
        plan()
    assert plan(cpu=True).device_type == "cpu"  # cpu=True asks nothing of NVML


def test_kernel_visible_devices_name_the_skipped_gpu_as_the_kernel_sees_it(shared_box: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the kernel's cuda:0 is NVML's GPU 2
    write_use(shared_box, {2: {4242: 2 * GIB}}, {})
    made = plan()
    assert made.gpus == (1,) and made.device_notes[0].startswith("GPU 0: 2.0 GiB used by pid 4242")
    assert _environment(made, LoopbackRendezvous("127.0.0.1", None), 0, 0)["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_plan_made_only_to_be_shown_keeps_its_notes_and_says_nothing(shared_box: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_use(shared_box, {1: {4242: GIB}}, {})
    made = plan_module.make_plan(LaunchOptions(), started=0.0, announce=False)
    assert made.gpus == (0, 2, 3) and made.device_notes[0].startswith("GPU 1: 1.0 GiB used by pid 4242")
    cpu = plan_module.make_plan(LaunchOptions(cpu=True), started=0.0, announce=False)
    assert cpu.device_notes == ("no GPU visible; launching 2 CPU processes on gloo.",)
    assert capsys.readouterr().out == ""
