"""Counting GPUs through NVML: CUDA_VISIBLE_DEVICES read as CUDA reads it, and the driver never touched.

Imports internals (devices.nvml): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbaccel.devices.nvml import Gpu, parse_visible_devices, physical_name, supports_bf16, visible
from tests.devices.fakes import build_fake_cuda, build_fake_nvml

pytestmark = pytest.mark.timeout(120)

A100 = Gpu(0, "GPU-aaaa1111-0000", "NVIDIA A100-SXM4-80GB", (8, 0), ("MIG-a1", "MIG-a2"))
V100 = Gpu(1, "GPU-bbbb2222-0000", "Tesla V100-SXM2-16GB", (7, 0))
H200 = Gpu(2, "GPU-cccc3333-0000", "NVIDIA H200", (9, 0))
MACHINE = [A100, V100, H200]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [A100, V100, H200]),  # unset: every GPU
        ("", []),  # empty: none
        ("2,0", [H200, A100]),  # CUDA's order is the variable's
        ("1,7,2", [V100]),  # stops at the first index that names nothing
        ("0,0", []),  # a repeated device hides them all
        ("1,x,2", [V100]),  # and at the first entry that is not a device
        ("-1", []),
        ("GPU-cccc", [H200]),  # a UUID prefix
        ("GPU-cccc3333-0000,GPU-aaaa1111-0000", [H200, A100]),
        ("GPU-", []),  # ambiguous: names nothing
        ("MIG-a2", [A100]),  # a MIG instance counts as one device on its GPU
        ("MIG-a1,MIG-a2", [A100, A100]),
        ("MIG-zz", []),
        (" 1 , 2 ", [V100, H200]),
    ],
)
def test_visible_devices_as_cuda_reads_them(value: str | None, expected: list[Gpu]) -> None:
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible(MACHINE, environ) == expected


def test_parse_and_physical_names() -> None:
    assert parse_visible_devices("03,1") == ["3", "1"]
    assert physical_name("cuda:0", {"CUDA_VISIBLE_DEVICES": "GPU-cccc"}) == "cuda:0 (GPU GPU-cccc)"
    assert physical_name("cuda:0", {"CUDA_VISIBLE_DEVICES": "0,1"}) == "cuda:0"
    assert physical_name("cpu", {"CUDA_VISIBLE_DEVICES": "3"}) == "cpu"
    assert supports_bf16(H200.capability) and not supports_bf16(V100.capability)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fake-nvidia")
    return {"cuda": build_fake_cuda(folder), "nvml": build_fake_nvml(folder)}


COUNT = """
import json, os
from nbaccel.devices import driver, nvml
answers = {"unset" if v is None else v: nvml.visible_count({} if v is None else {"CUDA_VISIBLE_DEVICES": v}) for v in (None, "", "1", "1,0", "MIG-b", "GPU-ff", "GPU-zz")}
gpus = nvml.visible_gpus({})
print(json.dumps({"counts": answers, "names": [g.name for g in gpus or []], "capability": nvml.lowest_capability({}),
                  "driver": nvml.driver_version(), "driver_state": driver.driver_state().value, "pid": os.getpid()}))
"""


def test_counting_through_a_fake_nvml(fakes: dict[str, Path], tmp_path: Path) -> None:
    record = tmp_path / "cuinit.log"
    env = {
        "NBACCEL_NVML_LIBRARY": str(fakes["nvml"]),
        "NBACCEL_CUDA_DRIVER_LIBRARY": str(fakes["cuda"]),
        "FAKE_CUDA_RECORD": str(record),
        "FAKE_NVML_GPUS": "NVIDIA A100-SXM4-40GB|GPU-aa01|8|0|MIG-b1,MIG-b2;NVIDIA GeForce RTX 4090|GPU-ff02|8|9|",
        "FAKE_NVML_DRIVER": "535.104.05",
    }
    seen = subprocess_json(COUNT, env)
    assert seen["counts"] == {"unset": 2, "": 0, "1": 1, "1,0": 2, "MIG-b": 0, "GPU-ff": 1, "GPU-zz": 0}  # "MIG-b" is ambiguous
    assert seen["names"] == ["NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090"]
    assert seen["capability"] == [8, 0]
    assert seen["driver"] == "535.104.05"
    assert seen["driver_state"] == "not loaded"
    assert not record.exists()  # NVML answered: no cuInit anywhere


def test_without_nvml_the_driver_counts_in_a_child_process(fakes: dict[str, Path], tmp_path: Path) -> None:
    record = tmp_path / "cuinit.log"
    env = {
        "NBACCEL_NVML_LIBRARY": str(tmp_path / "no-nvml.so"),
        "NBACCEL_CUDA_DRIVER_LIBRARY": str(fakes["cuda"]),
        "FAKE_CUDA_RECORD": str(record),
        "FAKE_CUDA_DEVICES": "3",
    }
    seen = subprocess_json(COUNT, env)
    assert seen["counts"]["unset"] == 3 and seen["counts"][""] == 0
    assert seen["names"] == [] and seen["capability"] is None and seen["driver"] is None
    assert seen["driver_state"] == "uninitialised"  # loaded to see that it exists, never initialised
    pids = record.read_text().split()
    assert pids and str(seen["pid"]) not in pids  # cuInit ran, but only in the counting children


def test_no_nvml_and_no_driver_means_no_gpu(tmp_path: Path) -> None:
    env = {"NBACCEL_NVML_LIBRARY": str(tmp_path / "none.so"), "NBACCEL_CUDA_DRIVER_LIBRARY": str(tmp_path / "none-cuda.so")}
    assert subprocess_json(COUNT, env)["counts"] == {"unset": 0, "": 0, "1": 0, "1,0": 0, "MIG-b": 0, "GPU-ff": 0, "GPU-zz": 0}


def subprocess_json(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
