"""Ray across two "machines": a Ray head (``ray start --head``) and a worker (``ray start --address``)
in two network namespaces with their own addresses and files-only name look-ups
(scripts/cluster_fabric.py, without its sshd and Slurm), the notebook's side a Ray driver on the
head (as JupyterLab on a KubeRay head is). A launch and a pool across both, the worker's raylet
killed, close leaving nothing in Ray. Root only; every Ray process is ended by its pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nbaccel.testing import scaled
from tests.leak_check import reap_zombie_children

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


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


class RayOnFabric:
    """``ray start --block`` on node 1 (head) and node 2 (worker); ended by their pids."""

    def __init__(self, fabric: Any) -> None:
        self.fabric = fabric
        self.temp = tempfile.mkdtemp(prefix="nbr-")  # short: Ray's socket paths must fit 107 bytes
        self.env = {**fabric.env(), "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
        head, worker = fabric.addresses
        common = ["--block", "--num-cpus=2", "--object-store-memory=80000000", "--disable-usage-stats"]
        self.starts = [
            self._start(0, ["--head", f"--node-ip-address={head}", f"--port={_PORT}", "--include-dashboard=false", f"--temp-dir={self.temp}", *common]),
        ]
        self._wait_for_nodes(1)
        self.starts.append(self._start(1, [f"--address={head}:{_PORT}", f"--node-ip-address={worker}", *common]))
        self._wait_for_nodes(2)

    @property
    def address(self) -> str:
        return f"{self.fabric.addresses[0]}:{_PORT}"

    def _start(self, node: int, options: list[str]) -> subprocess.Popen[bytes]:
        log = open(Path(self.temp) / f"ray-start-{node}.log", "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(self.fabric.on_node(node, [_ray_cli(), "start", *options]), stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        return process

    def _wait_for_nodes(self, count: int) -> None:
        # Asked only once its `ray start` said it started: a driver started before the GCS listens waits on it for minutes.
        log = Path(self.temp) / f"ray-start-{count - 1}.log"
        deadline = time.monotonic() + scaled(120)
        while "Ray runtime started" not in log.read_text(errors="replace") and time.monotonic() < deadline:
            assert self.starts[-1].poll() is None, log.read_text()[-2000:]
            time.sleep(0.2)
        script = f"import ray; ray.init(address={self.address!r}); print(sum(1 for n in ray.nodes() if n['Alive']))"
        deadline = time.monotonic() + scaled(120)
        while time.monotonic() < deadline:
            done = subprocess.run(self.fabric.on_node(0, [sys.executable, "-c", script]), capture_output=True, text=True, env=self.env, timeout=scaled(60))
            if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
                return
            time.sleep(1)
        raise RuntimeError(f"the Ray cluster on the fabric did not show {count} node(s): {(Path(self.temp) / 'ray-start-0.log').read_text()[-2000:]}")

    def raylet_of(self, address: str) -> psutil.Process:
        for process in psutil.Process().children(recursive=True):
            try:
                if process.name() == "raylet" and any(f"--node_ip_address={address}" in word for word in process.cmdline()):
                    return process
            except psutil.NoSuchProcess:
                continue
        raise LookupError(f"no raylet for {address}")

    def close(self) -> None:
        ours = [p for p in psutil.Process().children(recursive=True) if p.pid not in {os.getpid()}]
        for start in self.starts:
            start.terminate()  # `ray start --block` ends its node's processes on SIGTERM
        for start in self.starts:
            try:
                start.wait(scaled(30))
            except subprocess.TimeoutExpired:
                start.kill()
                start.wait(10)
        _, alive = psutil.wait_procs([p for p in ours if p.is_running()], timeout=scaled(10))
        for process in alive:  # what outlived its `ray start`: ours, by pid
            process.kill()
        psutil.wait_procs(alive, timeout=10)
        reap_zombie_children()
        shutil.rmtree(self.temp, ignore_errors=True)


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
