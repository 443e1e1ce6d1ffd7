"""The profile sink puts a remote rank's trace on the kernel's clock by its node's measured offset.

Imports internals (output.profile_sink, output.profile_merge, wire.rich): it tests those units
directly, below the public face; tests/agent/test_profile_across_nodes.py does it end to end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nbaccel.output.profile_merge import on_kernel_clock
from nbaccel.output.profile_sink import ProfileSink
from nbaccel.wire import rich

pytestmark = pytest.mark.timeout(20)

KERNEL_START = 1_796_000_000 * 10**9  # Unix-epoch ns on the kernel's clock
SKEW = 5 * 10**9  # rank 1's node is 5 s ahead
MS = 1000  # trace ``ts``/``dur`` are microseconds


def _trace(base_ns: int, compute_ms: int) -> str:
    """One rank: ``compute_ms`` of matmul, then an all_reduce that ends at 300 ms (with its peer)."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": float(compute_ms * MS)},
        {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": float(compute_ms * MS), "dur": float((300 - compute_ms) * MS)},
    ]
    return json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": events})


def _profiled(folder: Path, clocks: bool) -> tuple[dict[str, Any], str]:
    shown: list[dict[str, Any]] = []
    sink = ProfileSink(folder, show=shown.append)
    sink.launch_started(2, attempt=0)
    for rank, (node, base, compute_ms) in enumerate([(0, KERNEL_START, 100), (1, KERNEL_START + SKEW, 290)]):
        sink.event(rank, rich.node_event(node, f"host{node}"))
        sink.event(rank, rich.profile_event(rank, f"host{node}", base, base + 300 * 10**6, _trace(base, compute_ms)))
        if clocks:  # what the cluster's group sends when the launch ends
            sink.event(rank, rich.clock_event(node, SKEW if node else 0, 200_000))
    sink.launch_finished([])
    return json.loads((folder / "trace.json").read_text()), shown[-1]["text/plain"]


def _all_reduce(trace: dict[str, Any], rank: int) -> tuple[float, float]:
    (event,) = [e for e in trace["traceEvents"] if e["pid"] == rank and e.get("name") == "gloo:all_reduce"]
    return event["ts"], event["ts"] + event["dur"]


def test_the_merge_shifts_a_rank_by_its_nodes_offset_and_says_how_far_it_may_be_off(tmp_path: Path) -> None:
    trace, text = _profiled(tmp_path, clocks=True)
    assert _all_reduce(trace, 0) == (100 * MS, 300 * MS) and _all_reduce(trace, 1) == (290 * MS, 300 * MS)
    labels = {e["pid"]: e["args"]["labels"] for e in trace["traceEvents"] if e.get("name") == "process_labels"}
    assert labels == {0: "clock +0.000 ms ± 0.100 ms", 1: "clock +5000.000 ms ± 0.100 ms"}
    assert "each node's clock minus the kernel's: node 0 +0.000 ms ± 0.100 ms, node 1 +5000.000 ms ± 0.100 ms" in text
    assert "rank 1 spent 0.2 s more in compute; rank 0 waited 0.2 s in all_reduce" in text, text
    assert json.loads((tmp_path / "rank1.json").read_text())["baseTimeNanoseconds"] == KERNEL_START + SKEW  # as the rank wrote it


def test_without_a_measured_offset_the_lanes_stay_on_their_own_clocks(tmp_path: Path) -> None:
    trace, text = _profiled(tmp_path, clocks=False)
    assert _all_reduce(trace, 1)[1] - _all_reduce(trace, 0)[1] == SKEW / 1000  # 5 s apart: what the offset repairs
    assert "clock minus the kernel's" not in text


def test_a_node_whose_clock_was_not_measured_is_said(tmp_path: Path) -> None:
    sink = ProfileSink(tmp_path, show=lambda bundle: shown.append(bundle["text/plain"]))
    shown: list[str] = []
    sink.launch_started(1, attempt=0)
    sink.event(0, rich.profile_event(0, "host1", KERNEL_START, KERNEL_START + 10**6, _trace(KERNEL_START, 100)))
    sink.event(0, rich.clock_event(1, None, None))
    sink.launch_finished([])
    assert "node 1 not measured (its lanes are on its own clock)" in shown[-1]


def test_on_kernel_clock_leaves_a_trace_without_offset_as_it_is() -> None:
    trace = {"baseTimeNanoseconds": 7, "traceEvents": []}
    assert on_kernel_clock(trace, None) is trace and on_kernel_clock(trace, 0) is trace
    assert on_kernel_clock(trace, -3) == {"baseTimeNanoseconds": 10, "traceEvents": []}
