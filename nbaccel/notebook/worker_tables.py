"""The tables ``%distributed status`` and ``%distributed free`` print: one row per rank.

``%distributed status`` shows a `StatusTable`: the same rows as text (terminal IPython, papermill's
saved text) and as an HTML table (JupyterLab, VS Code, Colab, GitHub), so the workers' state is
legible where nbaccel's extension and its workers panel are not.

Example:
    >>> from nbaccel.pool import WorkerStatus
    >>> print(status_table([WorkerStatus(0, 4242, "cpu", "idle", 310.4, None, "x = 1", cpu_percent=12.0, peak_memory_mb=400.0)]))
    rank  pid   device  state  cpu  memory   peak     last cell
    0     4242  cpu     idle   12%  310 MiB  400 MiB  x = 1
    >>> print(free_table({0: {"before": {"rss": 2**30, "device_reserved": None}, "after": {"rss": 2**29, "device_reserved": None}, "collected": 12}}))
    rank  resident                       gpu cache  objects collected
    0     1.0 GiB -> 512 MiB (-512 MiB)  -          12
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nbaccel.wire.sizes import gib

if TYPE_CHECKING:
    from nbaccel.pool import WorkerStatus  # types only: %load_ext does not import the pool

_MIB = 2**20


def status_table(statuses: Iterable[WorkerStatus]) -> str:
    """Per rank: pid, device, state, CPU use, resident memory and its peak, GPU memory, last cell.

    The gpu column (allocated / reserved by torch / used on the whole device) shows only when a
    rank uses CUDA; the gpu use column (what NVML lists for the rank's pid, its peak, and the GPU's
    utilisation, sampled by the kernel) only where NVML answers; the sharded column (each sharded
    module's parameters on the rank, of the full size) only where a rank holds one.

    >>> from nbaccel.pool import WorkerStatus
    >>> gpu = WorkerStatus(0, 7, "cuda:0", "idle", 900.0, 512.0, "-", gpu_held_mb=1024.0, gpu_peak_mb=2048.0, gpu_util=88)
    >>> print(status_table([gpu]).splitlines()[1])
    0     7    cuda:0  idle   -    900 MiB  -     512 MiB / - / -                  1.0 GiB / 2.0 GiB / 88%   -
    """
    return _table(status_rows(statuses))


def status_rows(statuses: Iterable[WorkerStatus]) -> list[tuple[str, ...]]:
    """The status table's rows, headings first (see `status_table`)."""
    statuses = list(statuses)
    gpu = any(s.device_memory_mb is not None for s in statuses)
    nvml = any(s.gpu_util is not None or s.gpu_held_mb is not None for s in statuses)
    gpu_heads = (*(("gpu (allocated/reserved/device)",) if gpu else ()), *(("gpu use (held/peak/busy)",) if nvml else ()))
    sharded = any(s.shards for s in statuses)
    heads = (*gpu_heads, *(("sharded (held / full)",) if sharded else ()))
    rows: list[tuple[str, ...]] = [("rank", "pid", "device", "state", "cpu", "memory", "peak", *heads, "last cell")]
    for s in statuses:
        cpu = "-" if s.cpu_percent is None else f"{s.cpu_percent:.0f}%"
        peak = "-" if s.peak_memory_mb is None else gib(int(s.peak_memory_mb * _MIB))
        cells = (*((_gpu_cell(s),) if gpu else ()), *((_nvml_cell(s),) if nvml else ()), *((shards_cell(s.shards),) if sharded else ()))
        rows.append((str(s.rank), str(s.pid), s.device, s.state, cpu, gib(int(s.memory_mb * _MIB)), peak, *cells, s.last_cell or "-"))
    return rows


class StatusTable:
    """The workers' status as Jupyter shows it: ``text/html`` and ``text/plain`` of the same rows.

    ``note`` is a line under the table (a watched table says when it was last read).

    >>> from nbaccel.pool import WorkerStatus
    >>> table = StatusTable([WorkerStatus(1, 42, "cpu", "idle", 100.0, None, "x = 1")])
    >>> "<td>idle</td>" in table._repr_html_(), repr(table).splitlines()[1].split()[:4]
    (True, ['1', '42', 'cpu', 'idle'])
    """

    def __init__(self, statuses: Iterable[WorkerStatus], note: str = "") -> None:
        self.rows = status_rows(statuses)
        self.note = note

    def __repr__(self) -> str:
        return _table(self.rows) + (f"\n{self.note}" if self.note else "")

    def _repr_html_(self) -> str:
        head, *body = self.rows
        cells = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in head)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
        note = f"<div style='color:#5f6368;font-size:12px'>{html.escape(self.note)}</div>" if self.note else ""
        return f"<table class='nbaccel-status'><thead><tr>{cells}</tr></thead><tbody>{rows}</tbody></table>{note}"


def shards_cell(shards: Mapping[str, tuple[int, int]]) -> str:
    """Each sharded module of a rank: the bytes of parameters it holds, of the full model's.

    >>> shards_cell({"model": (2**29, 2**30)})
    'model 512 MiB / 1.0 GiB'
    """
    return ", ".join(f"{name} {_size(held)} / {_size(full)}" for name, (held, full) in sorted(shards.items())) or "-"


def _size(size: int) -> str:
    """Like ``gib``, and ``12.5 KiB`` or ``420 B`` under 1 MiB: small models are sharded too."""
    if size >= _MIB:
        return gib(size)
    return f"{size / 1024:.1f} KiB" if size >= 1024 else f"{size} B"


def _nvml_cell(s: WorkerStatus) -> str:
    """What NVML lists for the rank's pid, its peak, and its GPU's utilisation: ``1.0 GiB / 2.0 GiB / 88%``."""
    held = "-" if s.gpu_held_mb is None else gib(int(s.gpu_held_mb * _MIB))
    peak = "-" if s.gpu_peak_mb is None else gib(int(s.gpu_peak_mb * _MIB))
    return f"{held} / {peak} / {'-' if s.gpu_util is None else f'{s.gpu_util:.0f}%'}"


def _gpu_cell(s: WorkerStatus) -> str:
    figures = (s.device_memory_mb, s.device_reserved_mb, s.device_used_mb)
    return " / ".join("-" if f is None else gib(int(f * _MIB)) for f in figures)


def free_table(freed: Mapping[int, Mapping[str, Any]]) -> str:
    """Per rank: resident memory and torch's GPU cache before -> after, and objects collected."""
    rows = [("rank", "resident", "gpu cache", "objects collected")]
    for rank, answer in sorted(freed.items()):
        before, after = answer["before"], answer["after"]
        cache = _change(before.get("device_reserved"), after.get("device_reserved"))
        rows.append((str(rank), _change(before["rss"], after["rss"]), cache, str(answer.get("collected", 0))))
    return _table(rows)


def _change(before: int | None, after: int | None) -> str:
    if before is None or after is None:
        return "-"
    delta = after - before
    sign = "-" if delta < 0 else "+"
    return f"{gib(before)} -> {gib(after)} ({sign}{gib(abs(delta))})"


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    # the last column is not padded: zip stops at the widths
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1] for row in rows)
