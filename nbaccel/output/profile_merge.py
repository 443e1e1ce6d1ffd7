"""Every rank's torch.profiler trace merged into one Chrome/Perfetto trace: a lane per rank, one clock.

A torch 2.13 trace gives ``ts`` in microseconds from ``baseTimeNanoseconds`` (Unix-epoch ns on
the realtime clock of the rank's machine, computed once per process, so it is added per file). A
rank on another node is first put on the kernel's clock (``on_kernel_clock``: its base less its
node's measured offset, ``nbaccel.net.clock``). The merge puts every
event at ``ts*1000 + base - common`` (``common``: the earliest rank's start), folds every pid of
a rank's file (its process, kineto's string pids for GPU streams) into one process lane with
``pid = rank``, named ``rank N`` (``rank N · node M (host)`` across nodes) and sorted by rank,
and keeps each thread apart (its ``tid``, renumbered where two pids of one file share one).
Flow ids are made unique per rank, so arrows never join two ranks' events.

On one node every rank reads the same clock (``gloo:barrier`` ends agree within 18 us, measured);
across nodes the lanes are as aligned as the offset's measurement: within half its probe's round
trip, which each lane's label says (``clock +5000.012 ms ± 0.150 ms``), see docs/profiling.md.

Example:
    >>> t0 = {"baseTimeNanoseconds": 1000, "traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 2.0, "dur": 1.0}]}
    >>> t1 = {"baseTimeNanoseconds": 3000, "traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 9, "tid": 9, "ts": 1.0, "dur": 1.0}]}
    >>> merged = merge_traces({0: t0, 1: t1}, common_ns=1000)
    >>> [(e["pid"], e["ts"]) for e in merged["traceEvents"] if e["ph"] == "X"]
    [(0, 2.0), (1, 3.0)]
    >>> [e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"]
    ['rank 0', 'rank 1']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_DROPPED_METADATA = ("process_name", "process_labels", "process_sort_index")
_FLOW_PHASES = ("s", "t", "f")
_FLOW_ID_STRIDE = 10**12  # flow ids of rank N start at N * stride
_TID_STRIDE = 1_000_000  # threads of a file's other pids: renumbered above this


def event_ns(event: Mapping[str, Any], base_ns: int) -> int:
    """The Unix-epoch ns of a trace event's ``ts`` (microseconds from the file's base)."""
    return round(float(event["ts"]) * 1000) + base_ns


def on_kernel_clock(trace: Mapping[str, Any], offset_ns: int | None) -> Mapping[str, Any]:
    """``trace`` with its base moved onto the kernel's clock (``offset_ns``: its node's clock minus the kernel's).

    Example:
        >>> on_kernel_clock({"baseTimeNanoseconds": 5_000_000_100, "traceEvents": []}, 5_000_000_000)["baseTimeNanoseconds"]
        100
    """
    if not offset_ns:
        return trace
    return {**trace, "baseTimeNanoseconds": int(trace.get("baseTimeNanoseconds", 0)) - offset_ns}


def merge_traces(
    traces: Mapping[int, Mapping[str, Any]], common_ns: int, lane_names: Mapping[int, str] | None = None, lane_labels: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """One trace of every rank's ``traces`` (rank -> parsed Chrome trace, on one clock), on ``common_ns`` as zero.

    ``lane_labels``: a label shown beside a rank's lane name (how its clock was aligned)."""
    events: list[dict[str, Any]] = []
    for rank in sorted(traces):
        name = (lane_names or {}).get(rank, f"rank {rank}")
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        if lane_labels and rank in lane_labels:
            events.append({"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": lane_labels[rank]}})
        events.extend(_rank_events(rank, traces[rank], common_ns))
    return {"displayTimeUnit": "ms", "baseTimeNanoseconds": common_ns, "traceEvents": events, "traceName": "nbaccel merged trace"}


def _rank_events(rank: int, trace: Mapping[str, Any], common_ns: int) -> list[dict[str, Any]]:
    base = int(trace.get("baseTimeNanoseconds", 0))
    main_pid = _main_pid(trace)
    tids: dict[tuple[Any, Any], Any] = {}
    out: list[dict[str, Any]] = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "M" and event.get("name") in _DROPPED_METADATA:
            continue
        moved = dict(event)
        moved["pid"] = rank
        moved["tid"] = _lane_tid(tids, main_pid, event.get("pid"), event.get("tid", 0))
        if "ts" in event:
            moved["ts"] = (event_ns(event, base) - common_ns) / 1000
        if event.get("ph") in _FLOW_PHASES and isinstance(event.get("id"), int):
            moved["id"] = event["id"] + rank * _FLOW_ID_STRIDE
        out.append(moved)
    return out


def _main_pid(trace: Mapping[str, Any]) -> Any:
    """The rank's own process id in its file: the pid of most of its events."""
    counts: dict[Any, int] = {}
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "X":
            counts[event.get("pid")] = counts.get(event.get("pid"), 0) + 1
    return max(counts, key=lambda pid: counts[pid]) if counts else None


def _lane_tid(tids: dict[tuple[Any, Any], Any], main_pid: Any, pid: Any, tid: Any) -> Any:
    """The process's own threads keep their tid; another pid's threads get fresh ones above them."""
    if pid == main_pid:
        return tid
    key = (pid, tid)
    if key not in tids:
        tids[key] = _TID_STRIDE + len(tids)
    return tids[key]
