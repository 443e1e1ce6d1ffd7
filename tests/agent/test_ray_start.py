"""``start_agents(via="ray")`` refusals that need no Ray cluster: Ray missing, no Ray cluster to
attach to, options that do not fit. (tests/agent/test_ray.py runs the real thing.) It imports the internal ``bundles``: what each actor reserves,
checked without Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nbaccel import Cluster
from nbaccel.cluster.starters.ray import bundles

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)


def test_without_ray_installed_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    with Cluster("127.0.0.1:0") as cluster, pytest.raises(ImportError, match=r'pip install "nbaccel\[ray\]"'):
        cluster.start_agents(via="ray", nodes=2)
    assert cluster.starts == []


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({}, r"say how many nodes \(nodes=2\)"),
        ({"nodes": 2, "hosts": ["a"]}, "give nodes=N, not hosts"),
        ({"nodes": 2, "strategy": "EVERYWHERE"}, r"strategy='EVERYWHERE': one of STRICT_SPREAD, PACK"),
        ({"nodes": 0}, "nodes=0: give how many Ray nodes"),
        ({"nodes": 2, "time": "01:00:00"}, "via='ray' takes nodes, gpus_per_node, cpus_per_node, strategy and ray_address, not time_limit"),
    ],
)
def test_options_that_do_not_fit_are_refused_before_ray_is_asked(options: dict, words: str) -> None:
    with Cluster("127.0.0.1:0") as cluster, pytest.raises((ValueError, TypeError), match=words):
        cluster.start_agents(via="ray", **options)


def test_ray_options_given_to_slurm_are_named() -> None:
    with Cluster("127.0.0.1:0") as cluster, pytest.raises(TypeError, match="Ray's options, not Slurm's"):
        cluster.start_agents(via="slurm", nodes=2, strategy="PACK")


def test_bundles_ask_gpus_only_when_given() -> None:
    assert bundles(2, 0, 2) == [{"CPU": 2}, {"CPU": 2}]
    assert bundles(1, 8, 16) == [{"CPU": 16, "GPU": 8}]


@pytest.mark.ray
def test_no_ray_cluster_to_attach_to_says_ray_init() -> None:
    pytest.importorskip("ray")
    script = (
        "import nbaccel\n"
        "with nbaccel.Cluster('127.0.0.1:0') as cluster:\n"
        "    try:\n"
        "        cluster.start_agents(via='ray', nodes=1)\n"
        "    except ConnectionError as error:\n"
        "        print('REFUSED', error)\n"
    )
    with tempfile.TemporaryDirectory(prefix="nbaccel-ray-") as empty:  # no Ray session to find there
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": empty, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50, env=env, cwd=ROOT)
    assert "REFUSED via=\"ray\" found no Ray cluster to attach to at 'auto'" in done.stdout, done.stdout + done.stderr[-2000:]
    assert 'ray.init(address="auto")' in done.stdout
