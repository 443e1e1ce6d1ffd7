"""Many launches in one process leak no process, thread, fd, temp directory or port.

Imports internals (output.choose): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time

import psutil
import pytest

import nbaccel
from nbaccel.testing import CollectingSink

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def ok() -> int:
    return int(os.environ["RANK"])


def fails() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("planned")
    time.sleep(30)


def hangs() -> None:
    print("started", flush=True)
    time.sleep(30)


def with_process_group() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _resources() -> dict[str, object]:
    me = psutil.Process()
    return {
        "children": len(me.children(recursive=True)),
        "threads": me.num_threads(),
        "python threads": threading.active_count(),
        "fds": me.num_fds(),
        "listening": sorted(c.laddr.port for c in me.net_connections("tcp") if c.status == psutil.CONN_LISTEN),
        "temp entries": len(os.listdir(tempfile.gettempdir())),
    }


def _interrupted_launch() -> None:
    sink = CollectingSink()
    # Interrupt once the ranks are really running (their first line arrived), like a user would.
    original = sink.output

    def output(rank: int, stream: str, lines: list[str]) -> None:
        original(rank, stream, lines)
        if rank == 0:
            os.kill(os.getpid(), signal.SIGINT)

    sink.output = output  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        nbaccel.notebook_launcher(hangs, num_processes=2, output=sink)


def test_two_hundred_launches_leak_nothing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A private temp dir, so other programs' files do not count (and ours cannot hide among them).
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    nbaccel.notebook_launcher(with_process_group, num_processes=2, output=CollectingSink())  # warm-up: lazy imports
    before = _resources()
    for i in range(200):
        kind = i % 10
        if kind < 6:
            assert nbaccel.notebook_launcher(ok, num_processes=2, output=CollectingSink()) == [0, 1]
        elif kind < 8:
            assert nbaccel.notebook_launcher(with_process_group, num_processes=2, output=CollectingSink()) == [2.0, 2.0]
        elif kind == 8:
            with pytest.raises(nbaccel.RankFailedError):
                nbaccel.notebook_launcher(fails, num_processes=2, output=CollectingSink())
        else:
            _interrupted_launch()
    after = _resources()
    assert after == before


def all_reduce_on_workers() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)  # the workers' process group, made when they started
    return t.item()


class _Published:
    """A frontend stand-in: keeps what the widget view would display."""

    def __init__(self) -> None:
        self.bundles: list[dict] = []

    def show(self, bundle: dict, display_id: str) -> None:
        self.bundles.append(bundle)

    def update(self, bundle: dict, display_id: str) -> None:
        self.bundles.append(bundle)


def test_spawned_launches_pools_and_widget_views_leak_nothing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbaccel.output.choose import WidgetSink

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    logs = tmp_path / "logs"
    logs.mkdir()  # before counting: the kept launch logs are the point, not a leak
    nbaccel.notebook_launcher(with_process_group, num_processes=2, output=CollectingSink())  # warm-up: lazy imports
    with nbaccel.start_workers(2) as pool:
        pool.run(ok)
    before = _resources()
    for _ in range(3):
        assert nbaccel.notebook_launcher(ok, num_processes=2, start_method="spawn", output=CollectingSink()) == [0, 1]
    for _ in range(5):
        with nbaccel.start_workers(2) as pool:
            assert pool.run(all_reduce_on_workers) == [2.0, 2.0]
            with pytest.raises(nbaccel.RankFailedError):
                pool.run(fails)
            assert [s.summary for s in pool.stacks()] != []
    for _ in range(5):
        published = _Published()
        sink = WidgetSink(publisher=published, log_root=logs, keep_launches=2)
        assert nbaccel.notebook_launcher(ok, num_processes=2, output=sink) == [0, 1]
        assert published.bundles, "the view was shown"
    assert _resources() == before
    assert len(os.listdir(logs)) <= 2  # keep_launches
