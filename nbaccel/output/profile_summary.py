"""Where each rank spent a profiled launch: wall, compute, collectives, waiting; the straggler in words.

From one rank's trace: *collectives* are the spans of its backend's collective events
(``gloo:all_reduce`` on gloo's run-loop thread, ``nccl:*`` on NCCL; both include the wait for the
slowest peer), *compute* the union of its other operator spans (``aten::*``, CUDA kernels) outside
them, *waiting* the part of each collective before the last rank entered it: the k-th collective
of one name is the same call on every rank, so a rank that entered it early waited for the latest.

Example:
    >>> fast = RankProfile(0, wall=3.0, compute=1.0, collectives=1.9, waiting={"all_reduce": 1.8})
    >>> slow = RankProfile(1, wall=3.0, compute=2.9, collectives=0.1, waiting={})
    >>> straggler_words([fast, slow])
    'rank 1 spent 1.9 s more in compute; rank 0 waited 1.8 s in all_reduce'
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbaccel.output.profile_merge import event_ns

Span = tuple[int, int]  # (start ns, end ns), Unix epoch on the kernel's clock (``profile_merge.on_kernel_clock``)
_COLLECTIVE_PREFIXES = ("gloo:", "nccl:")
_NOT_COMPUTE_PREFIXES = ("c10d::", "record_param_comms", "ProfilerStep", "gloo:", "nccl:", "nbaccel")
_COMPUTE_CATEGORIES = ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset")
_STRAGGLER_MIN_S = 0.05  # a compute gap below this is noise, not a straggler
_STRAGGLER_FRACTION = 0.1  # ... and one below a tenth of the median compute too


@dataclass
class RankProfile:
    """One rank's figures, in seconds; ``waiting``: seconds by collective name (``all_reduce``)."""

    rank: int
    wall: float
    compute: float
    collectives: float
    waiting: dict[str, float] = field(default_factory=dict)
    compute_spans: list[Span] = field(default_factory=list)
    collective_spans: list[Span] = field(default_factory=list)

    @property
    def waited(self) -> float:
        return sum(self.waiting.values())


@dataclass
class RankTrace:
    """What the kernel received from one rank: its trace and the span of its profiled call."""

    rank: int
    trace: Mapping[str, Any]
    started_ns: int
    ended_ns: int


def collective_calls(trace: Mapping[str, Any]) -> list[tuple[str, Span]]:
    """Every collective span of ``trace``, in order: (name without backend prefix, span)."""
    base = int(trace.get("baseTimeNanoseconds", 0))
    calls = []
    for event in _spans(trace):
        name = str(event.get("name", ""))
        if name.startswith(_COLLECTIVE_PREFIXES):
            start = event_ns(event, base)
            calls.append((name.split(":", 1)[1], (start, start + int(float(event.get("dur", 0)) * 1000))))
    return sorted(calls, key=lambda call: call[1][0])


def analyse(ranks: Sequence[RankTrace]) -> list[RankProfile]:
    """Every rank's figures, waits matched across ranks."""
    calls = {r.rank: collective_calls(r.trace) for r in ranks}
    waits = _waits(calls)
    profiles = []
    for r in ranks:
        collective_spans = union(span for _, span in calls[r.rank])
        compute_spans = subtract(union(_compute_spans(r.trace)), collective_spans)
        profiles.append(
            RankProfile(
                r.rank,
                (r.ended_ns - r.started_ns) / 1e9,
                total(compute_spans) / 1e9,
                total(collective_spans) / 1e9,
                waits.get(r.rank, {}),
                compute_spans,
                collective_spans,
            )
        )
    return profiles


def _spans(trace: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    return (e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e)


def _compute_spans(trace: Mapping[str, Any]) -> Iterable[Span]:
    base = int(trace.get("baseTimeNanoseconds", 0))
    for event in _spans(trace):
        name = str(event.get("name", ""))
        if event.get("cat") in _COMPUTE_CATEGORIES and not name.startswith(_NOT_COMPUTE_PREFIXES):
            start = event_ns(event, base)
            yield (start, start + int(float(event.get("dur", 0)) * 1000))


def _waits(calls: Mapping[int, list[tuple[str, Span]]]) -> dict[int, dict[str, float]]:
    """Seconds each rank spent in its collectives before the last peer entered the same call."""
    by_name: dict[str, dict[int, list[Span]]] = {}
    for rank, rank_calls in calls.items():
        for name, span in rank_calls:
            by_name.setdefault(name, {}).setdefault(rank, []).append(span)
    waits: dict[int, dict[str, float]] = {}
    for name, spans in by_name.items():
        for k in range(min(len(s) for s in spans.values())) if len(spans) == len(calls) else ():
            latest = max(s[k][0] for s in spans.values())
            for rank, rank_spans in spans.items():
                start, end = rank_spans[k]
                waited = (min(latest, end) - start) / 1e9
                waits.setdefault(rank, {})[name] = waits.get(rank, {}).get(name, 0.0) + waited
    return waits


def union(spans: Iterable[Span]) -> list[Span]:
    """Overlapping spans joined, sorted."""
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def subtract(spans: list[Span], holes: list[Span]) -> list[Span]:
    """``spans`` minus ``holes`` (both sorted and disjoint)."""
    out: list[Span] = []
    i = 0
    for start, end in spans:
        while i < len(holes) and holes[i][1] <= start:
            i += 1
        j, cursor = i, start
        while j < len(holes) and holes[j][0] < end:
            if holes[j][0] > cursor:
                out.append((cursor, holes[j][0]))
            cursor = max(cursor, holes[j][1])
            j += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def total(spans: Iterable[Span]) -> int:
    return sum(end - start for start, end in spans)


def straggler_words(profiles: Sequence[RankProfile]) -> str | None:
    """ "rank 1 spent 1.9 s more in compute; rank 0 waited 1.8 s in all_reduce", or None when balanced."""
    if len(profiles) < 2:
        return None
    slow = max(profiles, key=lambda p: p.compute)
    others = [p for p in profiles if p is not slow]
    gap = slow.compute - statistics.median(p.compute for p in others)
    if gap < max(_STRAGGLER_MIN_S, _STRAGGLER_FRACTION * statistics.median(p.compute for p in profiles)):
        return None
    words = f"rank {slow.rank} spent {gap:.1f} s more in compute"
    waiters = [p for p in others if p.waited >= gap / 2]
    if waiters:
        name = max(waiters[0].waiting, key=lambda n: waiters[0].waiting[n])
        seconds = statistics.median(p.waiting.get(name, 0.0) for p in waiters)
        who = f"rank {waiters[0].rank}" if len(waiters) == 1 else "ranks " + ", ".join(str(p.rank) for p in waiters)
        words += f"; {who} waited {seconds:.1f} s in {name}"
    return words


def table_rows(profiles: Sequence[RankProfile]) -> list[list[str]]:
    """Header and one row per rank, in seconds."""
    rows = [["rank", "wall", "compute", "collectives", "waiting", "other"]]
    for p in sorted(profiles, key=lambda p: p.rank):
        other = max(0.0, p.wall - p.compute - p.collectives)
        rows.append([str(p.rank), *(f"{v:.2f} s" for v in (p.wall, p.compute, p.collectives, p.waited, other))])
    return rows
