"""AMD GPUs read off a stand-in KFD tree: the count, HIP's visibility variables, initialised HIP, each process's memory.

Imports internals (devices.amd, devices.sysfs): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbaccel.devices import amd
from nbaccel.testing import device_root
from tests.devices.fakes import fake_kfd_tree, write_kfd_process

pytestmark = pytest.mark.timeout(60)

MI300X = [{"gpu_id": 1000 + i, "name": "gfx942", "unique_id": 0xABC0 + i, "minor": 128 + i, "used": i * 2**30, "busy": 10 * i} for i in range(4)]


@pytest.fixture
def amd_box(tmp_path: Path) -> Iterator[Path]:
    root = fake_kfd_tree(tmp_path / "root", MI300X, cpus=2)
    with device_root(root):
        yield root


def test_every_kfd_node_with_a_gpu_id_is_a_gpu_in_node_order(amd_box: Path) -> None:
    gpus = amd.machine_gpus()
    assert [(g.index, g.gpu_id, g.name, g.render_minor) for g in gpus] == [(i, 1000 + i, "gfx942", 128 + i) for i in range(4)]
    assert gpus[1].uuid == "GPU-000000000000abc1" and gpus[0].vram_total == 192 * 2**30
    assert amd.vram_used(gpus[3]) == 3 * 2**30 and amd.utilisation(gpus[2]) == 20


def test_a_tree_of_ten_nodes_orders_them_by_number_not_by_name(tmp_path: Path) -> None:
    gpus = [{"gpu_id": 500 + i, "minor": 128 + i} for i in range(9)]
    with device_root(fake_kfd_tree(tmp_path, gpus, cpus=2)):  # nodes 0..10: "10" sorts before "2" as text
        assert [g.gpu_id for g in amd.machine_gpus()] == [500 + i for i in range(9)]


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({}, [0, 1, 2, 3]),
        ({"ROCR_VISIBLE_DEVICES": "1,3"}, [1, 3]),
        ({"ROCR_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1"}, [3]),  # HIP's indices are within ROCR's list
        ({"HIP_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"CUDA_VISIBLE_DEVICES": "3"}, [3]),  # HIP reads CUDA's variable when its own is unset
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "2"}, [1]),  # and its own first
        ({"HIP_VISIBLE_DEVICES": ""}, []),
        ({"HIP_VISIBLE_DEVICES": "0,9,1"}, [0]),  # stops at the first entry naming nothing
        ({"ROCR_VISIBLE_DEVICES": "GPU-000000000000abc2,0"}, [2, 0]),  # by UUID
        ({"ROCR_VISIBLE_DEVICES": "GPU-000000000000ABC"}, []),  # an ambiguous prefix names nothing
    ],
)
def test_visibility_as_the_hip_runtime_reads_it(amd_box: Path, variables: dict[str, str], expected: list[int]) -> None:
    assert [g.index for g in amd.visible_gpus(variables)] == expected


def test_an_open_kfd_device_says_hip_was_initialised_here(amd_box: Path) -> None:
    assert not amd.hip_initialised()
    fd = os.open(amd_box / "dev/kfd", os.O_RDWR)  # what ROCr's hsa_init does
    try:
        assert amd.hip_initialised()
    finally:
        os.close(fd)
    assert not amd.hip_initialised()


def test_each_process_s_memory_and_the_gpu_s_use_are_sampled_from_kfd(amd_box: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_kfd_process(amd_box, 4242, {1001: 5 * 2**30, 1003: 2**30})
    write_kfd_process(amd_box, 4343, {1001: 0})  # opened KFD, holds nothing there
    assert amd.process_vram([1000, 1001, 1003]) == {1000: {}, 1001: {4242: 5 * 2**30}, 1003: {4242: 2**30}}
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,3")
    use = amd.AmdGpuUse.open({0: 0, 1: 1, 2: 7})  # rank 2's cuda:7 names nothing: not sampled
    assert use is not None and use.devices == {0: 1001, 1: 1003}
    found = use.sample([0, 1])
    assert found[1001].memory == {4242: 5 * 2**30} and found[1001].utilisation == 10
    assert found[1003].memory == {4242: 2**30} and found[1003].utilisation == 30


def test_a_machine_without_the_amdgpu_driver_has_none(tmp_path: Path) -> None:
    with device_root(tmp_path):
        assert amd.machine_gpus() == [] and not amd.hip_initialised() and amd.AmdGpuUse.open({0: 0}) is None
