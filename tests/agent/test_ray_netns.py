"""Ray across two "machines": a Ray head (``ray start --head``) and a worker (``ray start --address``)
in two network namespaces with their own addresses and files-only name look-ups
(scripts/cluster_fabric.py, without its sshd and Slurm), the notebook's side a Ray driver on the
head (as JupyterLab on a KubeRay head is). A launch and a pool across both, the worker's raylet
killed, close leaving nothing in Ray. Root only; every Ray process is ended by its pid.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbaccel.testing import scaled
from tests.agent.ray_fabric import RayOnFabric

ray = pytest.importorskip("ray", reason='Ray is the optional extra nbaccel[ray]: pip install "nbaccel[ray]"')

ROOT = Path(__file__).resolve().parents[2]
KERNEL = Path(__file__).with_name("ray_kernel.py")
pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.slow, pytest.mark.orphans, pytest.mark.timeout(scaled(400))]
_PORT = 6379


def _fabric_module() -> Any:
    spec = importlib.util.spec_from_file_location("cluster_fabric", ROOT / "scripts" / "cluster_fabric.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fabric_module = _fabric_module()
REASON = fabric_module.unavailable(slurm=False, ssh=False)


@pytest.fixture(scope="module")
def ray_on_fabric() -> Iterator[RayOnFabric]:
    if REASON:
        pytest.skip(REASON)
    with fabric_module.Fabric(nodes=2, slurm=False, ssh=False) as fabric:
        made = RayOnFabric(fabric)
        try:
            yield made
        finally:
            made.close()


def test_a_launch_a_pool_and_a_lost_raylet_across_two_namespaces(ray_on_fabric: RayOnFabric) -> None:
    fabric = ray_on_fabric.fabric
    argv = fabric.on_node(0, [sys.executable, str(KERNEL), "spread", ray_on_fabric.address, fabric.addresses[0]])
    kernel = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ray_on_fabric.env, cwd=ROOT)
    said: list[str] = []
    try:
        assert kernel.stdout is not None and kernel.stdin is not None
        for line in kernel.stdout:
            said.append(line.rstrip())
            if line.startswith("ASK lose "):
                lost = 1  # the worker's bundle: the head's raylet holds the Ray cluster's control store
                ray_on_fabric.raylet_of(fabric.addresses[1]).kill()
                kernel.stdin.write(f"{lost}\n")
                kernel.stdin.flush()
        code = kernel.wait(scaled(120))
        errors = kernel.stderr.read() if kernel.stderr else ""
    finally:
        for stream in (kernel.stdin, kernel.stdout, kernel.stderr):
            if stream is not None:
                stream.close()
        if kernel.poll() is None:
            kernel.kill()
        kernel.wait(10)
    reports = [line for line in said if line.startswith("REPORT ")]
    assert code == 0 and reports, "\n".join(said[-20:]) + errors[-4000:]
    report = json.loads(reports[-1].removeprefix("REPORT "))
    assert report["addresses"] == sorted(fabric.addresses)  # each agent dialled from its own namespace
    assert sorted(v["host"] for v in report["launch"]) == sorted(fabric.node_names)
    assert [v["sum"] for v in report["launch"]] == [2.0, 2.0]  # gloo across the namespaces
    assert report["pool"] == [[0, 1], 10]
    assert report["lost_after_s"] is not None and report["lost_after_s"] < scaled(5)
    assert report["after_restart"] == [0]
    assert report["after_close"] == {"actors": ["DEAD", "DEAD"], "group": "REMOVED"}
