"""A Ray cluster on the cluster fabric's namespaces (scripts/cluster_fabric.py): ``ray start --head``
on node 1, ``ray start --address`` on node 2, each ``--block`` so that ending it ends its node.
Used by tests/agent/test_ray_netns.py and benchmarks/ray_start_bench.py.

Example::

    with Fabric(nodes=2, slurm=False, ssh=False) as fabric:
        ray_nodes = RayOnFabric(fabric)
        try:
            subprocess.run(fabric.on_node(0, [sys.executable, "kernel.py", ray_nodes.address]), env=ray_nodes.env)
        finally:
            ray_nodes.close()
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from nbaccel.testing import scaled
from tests.leak_check import reap_zombie_children

ROOT = Path(__file__).resolve().parents[2]
_PORT = 6379


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
