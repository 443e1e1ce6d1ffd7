"""Each process's GPU memory and each GPU's utilisation through NVML (a fake libnvidia-ml built with cc).

Imports internals (devices.gpu_use, devices.driver): it tests those units directly, below the public face.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nbaccel.devices import driver
from nbaccel.devices.gpu_use import GpuUse
from tests.devices.fakes import build_fake_nvml, write_use

pytestmark = pytest.mark.timeout(120)

GPUS = "NVIDIA H200|GPU-aa01|9|0|;NVIDIA H200|GPU-bb02|9|0|;NVIDIA H200|GPU-cc03|9|0|"


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One fake per set of exported calls (each its own file: NVML is opened once per path)."""
    folder = tmp_path_factory.mktemp("fake-nvml-use")
    return {
        "v3": build_fake_nvml(folder / "v3"),
        "v2": build_fake_nvml(folder / "v2", process_calls=("v2", "v1")),
        "v1": build_fake_nvml(folder / "v1", process_calls=("v1",)),
    }


@pytest.fixture
def use_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_NVML_GPUS", GPUS)
    monkeypatch.setenv("FAKE_NVML_USE", str(tmp_path / "use.txt"))
    monkeypatch.setenv("FAKE_NVML_CALLS", str(tmp_path / "calls.txt"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "use.txt"


@pytest.mark.parametrize(("version", "driver_version"), [("v3", "550.54.15"), ("v3", "530.30.02"), ("v2", "550.54.15"), ("v1", "550.54.15")])
def test_each_process_memory_and_the_utilisation_with_the_newest_call_the_library_has(
    version: str, driver_version: str, fake_nvml: dict[str, Path], use_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From driver R535 on, ``_v3`` fills a longer record under the same name (nvitop#75, pynvml#50:
    read with v2's layout every pid after the first is garbage); before it, v2's record."""
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(fake_nvml[version]))
    monkeypatch.setenv("FAKE_NVML_DRIVER", driver_version)
    write_use(use_file, {0: {101: 2**30, 102: 3 * 2**30, 103: None}, 2: {201: 5 * 2**30}}, {0: 37})
    use = GpuUse.open({0: 0, 1: 0, 2: 2})  # ranks 0 and 1 share cuda:0
    assert use is not None and use.devices == {0: 0, 1: 0, 2: 2}
    found = use.sample([0, 1, 2])
    # each record's length differs (v1 16, v2 24, v3 of R535+ 32 bytes): a wrong layout garbles the second pid
    assert found[0].memory == {101: 2**30, 102: 3 * 2**30}  # 103's memory is not available: left out
    assert found[0].utilisation == 37
    assert found[2].memory == {201: 5 * 2**30} and found[2].utilisation is None  # NVML does not say (a MIG instance)
    calls = (use_file.parent / "calls.txt").read_text().split("\n")
    assert sorted(c for c in calls if c) == sorted([f"{version} 0", "util 0", f"{version} 2", "util 2"])  # each device once per sample
    assert driver.driver_state() is driver.DriverState.NOT_LOADED  # NVML only: the CUDA driver never loaded


def test_more_processes_than_the_first_guess_are_all_listed(fake_nvml: dict[str, Path], use_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(fake_nvml["v3"]))
    many = {1000 + i: (i + 1) * 2**20 for i in range(100)}
    write_use(use_file, {1: many}, {1: 100})
    use = GpuUse.open({5: 1})
    assert use is not None
    assert use.sample([5])[1].memory == many


def test_cuda_visible_devices_maps_a_ranks_cuda_index_to_its_physical_gpu(fake_nvml: dict[str, Path], use_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(fake_nvml["v3"]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-aa")  # the kernel's cuda:0 is NVML's GPU 2, cuda:1 its GPU 0
    use = GpuUse.open({0: 0, 1: 1, 2: 5})  # cuda:5 names nothing this process sees: rank 2 is not sampled
    assert use is not None and use.devices == {0: 2, 1: 0}


def test_without_nvml_nothing_is_sampled_and_nothing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(tmp_path / "no-such-libnvidia-ml.so.1"))
    assert GpuUse.open({0: 0}) is None
    assert GpuUse.open({}) is None
