"""The driver probe against a fake ``libcuda.so.1``: it tells initialised from not, and never runs cuInit.

Each check runs in its own interpreter: a fake driver loaded into the test process would answer
for ``libcuda.so.1`` there for good (the loader matches it by soname) and every later fork test
would see "CUDA initialised".

Imports internals (devices): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.devices.fakes import build_fake_cuda

pytestmark = pytest.mark.timeout(120)


def run_python(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_cuda(tmp_path_factory.mktemp("fake-cuda"))


PROBE = """
import ctypes, json, os
from nbaccel.devices import driver
from nbaccel.launch.preflight import fork_hazards
seen = {"unloaded": driver.driver_state().value, "present": driver.driver_present()}
seen["loaded"] = driver.driver_state().value            # driver_present() loaded it, without cuInit
seen["hazards_before"] = [h.kind for h in fork_hazards()]
ctypes.CDLL(os.environ["NBACCEL_CUDA_DRIVER_LIBRARY"]).cuInit(0)   # what torch.cuda.is_available() does
seen["after_cuinit"] = driver.driver_state().value
seen["hazards_after"] = [h.kind for h in fork_hazards()]
seen["reason"] = fork_hazards()[0]
seen["pid"] = os.getpid()
print(json.dumps(seen))
"""


def test_the_probe_sees_cuinit_and_never_runs_it(fake_cuda: Path, tmp_path: Path) -> None:
    record = tmp_path / "cuinit.log"
    seen = run_python(PROBE, {"NBACCEL_CUDA_DRIVER_LIBRARY": str(fake_cuda), "FAKE_CUDA_RECORD": str(record)})
    assert seen["unloaded"] == "not loaded"  # nothing loaded, nothing asked
    assert seen["present"] is True
    assert seen["loaded"] == "uninitialised"
    assert seen["hazards_before"] == []
    assert seen["after_cuinit"] == "initialised"
    assert seen["hazards_after"] == ["cuda"]
    assert "torch.cuda.is_available()" in seen["reason"]
    assert record.read_text().split() == [str(seen["pid"])]  # the one cuInit was the test's own


def test_no_driver_library_means_absent(tmp_path: Path) -> None:
    seen = run_python(
        "import json; from nbaccel.devices import driver; print(json.dumps([driver.driver_state().value, driver.driver_state(load=True).value, driver.cuda_initialised()]))",
        {"NBACCEL_CUDA_DRIVER_LIBRARY": str(tmp_path / "missing" / "libcuda.so.1")},
    )
    assert seen == ["not loaded", "absent", False]


def test_this_process_has_not_initialised_cuda() -> None:
    from nbaccel.devices import driver

    assert driver.cuda_initialised() is False
