"""scripts/gpu-check's plumbing, here without a GPU: results.json, the table, skips with reasons, failures contained.

Imports internals (devices): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbaccel.devices import nvml  # noqa: F401 - read by the skipif condition
from nbaccel.testing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]  # runs scripts/gpu-check (a dry run): minutes
ROOT = Path(__file__).resolve().parent.parent


def run(command: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "NBACCEL_GPU_CHECK_SITE": str(out / "site")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=scaled(300), check=False)


@pytest.mark.skipif("nvml.visible_count() > 0", reason="the dry run is for machines without a GPU")
def test_the_dry_run_writes_results_and_a_table_and_skips_gpu_checks_with_reasons(tmp_path: Path) -> None:
    done = run(["scripts/gpu-check"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    by_name = {row["check"]: row for row in results["checks"]}
    assert by_name["environment"]["status"] == "pass" and by_name["environment"]["figures"]["nvml_visible_gpus"] == 0
    assert by_name["environment"]["figures"]["driver_state_in_kernel"] in ("not loaded", "absent")
    assert by_name["cpu-launch"]["status"] == "pass"
    gpu_checks = [row for row in results["checks"] if row["needs_gpus"] > 0]
    assert len(gpu_checks) >= 12 and all(row["status"] == "skip" and "visible" in row["reason"] for row in gpu_checks)
    assert by_name["distributed-free"]["needs_feature"]
    for name in by_name:
        assert name in done.stdout  # every check has its row in the table
    assert "needs 2 GPU(s); 0 visible" in done.stdout
    assert (tmp_path / "gpu-check.log").exists()


def test_a_failing_check_is_reported_and_the_others_still_run(tmp_path: Path) -> None:
    # Pretend a GPU is there: the GPU check fails (no CUDA) in its own process, the run goes on.
    done = run([sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path), "--gpus", "1", "--only", "driver-probe,cpu-launch"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    statuses = {row["check"]: row["status"] for row in results["checks"]}
    assert statuses == {"cpu-launch": "pass", "driver-probe": "fail"} and results["failed"] == ["driver-probe"]
    assert "driver-probe" in (tmp_path / "gpu-check.log").read_text()


def test_a_check_past_its_budget_is_skipped_not_run(tmp_path: Path) -> None:
    done = run([sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path), "--budget", "5", "--only", "environment"], tmp_path)
    assert done.returncode == 0
    [row] = json.loads((tmp_path / "results.json").read_text())["checks"]
    assert row["status"] == "skip" and "out of time" in row["reason"]
