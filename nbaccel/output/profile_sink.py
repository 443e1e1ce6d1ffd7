"""The sink of a profiled launch: each rank's trace to a file, the merged trace, and the summary in the cell.

Each rank sends its trace as a ``profile`` event (``nbaccel.rank.profiling``); across nodes the
kernel adds, as the launch ends, each rank's node's clock offset (a ``clock`` event). When the launch
ends, however it ended, ``ProfileSink`` writes ``DIR/rank{N}.json`` as received (on its machine's
clock), puts every trace on the kernel's clock, writes the merged ``DIR/trace.json``
(``profile_merge``), and shows the summary (``profile_summary``): a table by
rank, the straggler in words, a timeline picture where the frontend renders images, and the
merged trace's path. ``DIR`` is the one asked for, else the launch's log folder (the widget
view's, or a new one under ``nbaccel.output.logdir.default_root()``). It sits beside the launch's
own sink in a ``TeeSink`` (``with_profile``).

Example:
    >>> import tempfile
    >>> sink = ProfileSink(tempfile.mkdtemp(), show=lambda bundle: print(bundle["text/plain"]))
    >>> sink.launch_started(1, attempt=0)
    >>> trace = '{"baseTimeNanoseconds": 0, "traceEvents": []}'
    >>> sink.event(0, rich.profile_event(0, "host", 0, 2 * 10**9, trace))
    >>> sink.launch_finished([])  # doctest: +ELLIPSIS
    nbaccel profile: 1 rank, merged trace in .../trace.json (open it in https://ui.perfetto.dev)
    rank  wall    compute  collectives  waiting  other
    0     2.00 s  0.00 s   0.00 s       0.00 s   2.00 s
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbaccel.launch.notices import say
from nbaccel.launch.options import profile_folder
from nbaccel.launch.outcome import RankOutcome
from nbaccel.net.clock import offset_words
from nbaccel.output import frontend
from nbaccel.output.logdir import LaunchLogs
from nbaccel.output.profile_chart import timeline_svg
from nbaccel.output.profile_merge import merge_traces, on_kernel_clock
from nbaccel.output.profile_summary import RankTrace, analyse, straggler_words, table_rows
from nbaccel.output.sinks import Sink, TeeSink
from nbaccel.wire import rich
from nbaccel.wire.rank_calls import Profiled

Show = Callable[[dict[str, Any]], None]


def profiled(function: Callable[..., Any], sink: Sink, profile: bool | str) -> tuple[Profiled, Sink]:
    """What ``profile=`` turns a launch into: ``function`` under the profiler, ``sink`` with the summary."""
    return Profiled(function), with_profile(sink, profile_folder(profile))


def with_profile(sink: Sink, directory: str | Path | None) -> Sink:
    """``sink`` and a ``ProfileSink`` writing to ``directory`` (None: the launch's log folder)."""
    logs = getattr(sink, "logs", None)  # the widget view's log sink, whose folder is the launch's
    return TeeSink(sink, ProfileSink(directory, logs_folder=lambda: getattr(logs, "folder", None)))


class ProfileSink:
    """Collects ``profile`` events; at ``launch_finished`` writes the traces and shows the summary."""

    def __init__(self, directory: str | Path | None = None, logs_folder: Callable[[], Path | None] | None = None, show: Show | None = None) -> None:
        self.directory = None if directory is None else Path(directory).expanduser()
        self._logs_folder = logs_folder
        self._show = show or _display
        self._traces: dict[int, dict[str, Any]] = {}
        self._nodes: dict[int, str] = {}
        self._clocks: dict[int, dict[str, Any]] = {}  # rank -> its node's clock event
        self._ranks: list[int] = []
        self.written: Path | None = None  # the merged trace of the latest launch

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self._traces, self._clocks = {}, {}
        self._ranks = list(range(num_processes) if ranks is None else ranks)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        pass

    def event(self, rank: int, event: dict[str, Any]) -> None:
        if event.get("type") == rich.PROFILE:
            self._traces[rank] = event
        elif event.get("type") == rich.NODE:
            self._nodes[rank] = f"node {event.get('node')} ({event.get('host')})"
        elif event.get("type") == rich.CLOCK:
            self._clocks[rank] = event

    def rank_finished(self, outcome: RankOutcome) -> None:
        pass

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        """Write and show the profile; a failure to do so is said, never raised over the launch's own outcome."""
        try:
            self._write_and_show()
        except Exception as exc:  # noqa: BLE001 - a full disk or a malformed trace must not hide the ranks' results
            say(f"could not write the profile ({type(exc).__name__}: {exc}); the launch itself is unaffected")

    def _write_and_show(self) -> None:
        if not self._traces:
            self._show(_bundle_of([f"nbaccel profile: no rank sent a trace (each was killed before it could write one); ranks {self._ranks}"]))
            return
        folder = self._folder()
        folder.mkdir(parents=True, exist_ok=True)
        ranks = [self._write_rank(folder, rank, event) for rank, event in sorted(self._traces.items())]
        common = min(r.started_ns for r in ranks)
        merged = merge_traces({r.rank: r.trace for r in ranks}, common, self._lane_names(), self._lane_labels())
        self.written = folder / "trace.json"
        self.written.write_text(json.dumps(merged), encoding="utf-8")
        self._show(self._summary(ranks, common))

    def tick_in(self) -> float | None:
        return None

    def tick(self) -> None:
        pass

    # -- internals -------------------------------------------------------------------------------

    def _folder(self) -> Path:
        if self.directory is not None:
            return self.directory
        folder = self._logs_folder() if self._logs_folder is not None else None
        if folder is None:
            logs = LaunchLogs.create()
            if logs is None:
                raise OSError("could not make a folder for the profile; pass one: --profile DIR or profile='DIR'")
            logs.close()
            folder = logs.path
        return Path(folder)

    def _write_rank(self, folder: Path, rank: int, event: dict[str, Any]) -> RankTrace:
        """The rank's file as it came; its trace and span on the kernel's clock."""
        text = str(event.get("trace", "{}"))
        (folder / f"rank{rank}.json").write_text(text, encoding="utf-8")
        offset = int(self._clocks.get(rank, {}).get("offset_ns") or 0)
        return RankTrace(rank, on_kernel_clock(json.loads(text), offset), int(event["started_ns"]) - offset, int(event["ended_ns"]) - offset)

    def _lane_labels(self) -> dict[int, str]:
        """How each remote rank's lane was put on the kernel's clock, for the lane's label."""
        return {rank: f"clock {_clock_words(clock)}" for rank, clock in self._clocks.items() if rank in self._traces}

    def _clock_line(self) -> str | None:
        """Each node's offset once: how well the lanes line up (within half the round trip)."""
        nodes = {int(c.get("node", 0)): c for rank, c in sorted(self._clocks.items()) if rank in self._traces}
        if not nodes:
            return None
        words = ", ".join(f"node {node} {_clock_words(c)}" for node, c in sorted(nodes.items()))
        return f"lanes on the kernel's clock; each node's clock minus the kernel's: {words}"

    def _lane_names(self) -> dict[int, str]:
        hosts = {str(e.get("host")) for e in self._traces.values()}
        if len(hosts) < 2 and not self._nodes:
            return {}
        return {rank: f"rank {rank} · {self._nodes.get(rank) or e.get('host')}" for rank, e in self._traces.items()}

    def _summary(self, ranks: list[RankTrace], common_ns: int) -> dict[str, Any]:
        profiles = analyse(ranks)
        assert self.written is not None
        count = f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}"
        lines = [f"nbaccel profile: {count}, merged trace in {self.written} (open it in https://ui.perfetto.dev)"]
        missing = [r for r in self._ranks if r not in self._traces]
        if missing:
            lines.append(f"no trace from rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} (killed before it could write one)")
        clocks = self._clock_line()
        if clocks:
            lines.append(clocks)
        words = straggler_words(profiles)
        if words:
            lines.append(words)
        rows = table_rows(profiles)
        return _bundle_of(lines, rows, timeline_svg(profiles, common_ns))


def _clock_words(event: dict[str, Any]) -> str:
    offset, round_trip = event.get("offset_ns"), event.get("round_trip_ns")
    if offset is None or round_trip is None:
        return "not measured (its lanes are on its own clock)"
    return offset_words(int(offset), int(round_trip))


def _bundle_of(lines: list[str], rows: list[list[str]] | None = None, svg: str | None = None) -> dict[str, Any]:
    text = list(lines)
    if rows:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        text += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    bundle: dict[str, Any] = {"text/plain": "\n".join(text)}
    parts = [f"<div>{html.escape(line)}</div>" for line in lines]
    if rows:
        head = "".join(f"<th style='text-align:right;padding:0 8px'>{html.escape(c)}</th>" for c in rows[0])
        body = "".join("<tr>" + "".join(f"<td style='text-align:right;padding:0 8px'>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
        parts.append(f"<table class='nbaccel-profile'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    if svg is not None:
        parts.append(f"<div class='nbaccel-profile-timeline' role='img' aria-label='timeline of each rank'>{svg}</div>")
    bundle["text/html"] = "<div class='nbaccel-profile-summary'>" + "".join(parts) + "</div>"
    return bundle


def _display(bundle: dict[str, Any]) -> None:
    """Into the cell in a kernel (html with the picture); the text elsewhere."""
    if frontend.in_kernel():
        from IPython.display import display

        display(bundle, raw=True)  # type: ignore[no-untyped-call]  # IPython is unannotated
    else:
        print(bundle["text/plain"])
