"""The rich-output events a rank sends to the kernel on its event stream (``events.Kind.RICH``).

Every event is a plain dict with a ``"type"`` key, so it pickles anywhere and a sink that does
not know a type can ignore it. The rank side builds them (``nbaccel.rank.display_hooks``), the
kernel side renders them (``WidgetSink`` in the rank's panel, ``RichTextSink`` as text lines).

Types:
    ``started``: the rank is up and its hooks are installed (``pid``).
    ``display``: IPython ``display()`` output: ``data`` (a mimebundle), ``metadata``,
        ``display_id`` (or None) and ``update`` (True: replace the output with that id).
    ``clear_output``: IPython ``clear_output(wait)``.
    ``node``: which node the rank runs on, when there are several: ``node`` (its node rank), ``host``.
    ``clock``: how the rank's node's clock stood to the kernel's at the launch's end (several nodes):
        ``node``, ``offset_ns`` (the node's clock minus the kernel's; None when not measured) and
        ``round_trip_ns`` of the probe it was measured with (``nbaccel.net.clock``).
    ``stack``: where the rank is: ``summary`` (one line), ``why`` it was asked, ``text`` (all stacks).
    ``progress``: one progress bar's state: ``bar`` (id, unique in the rank), ``n``, ``total``,
        ``left``/``right`` (the text around the bar), ``text`` (the whole meter as one line),
        ``closed``, ``leave`` and ``failed`` (the bar stopped short because of an error).
    ``profile``: a rank's torch.profiler trace (``--profile``): ``rank``, ``host``,
        ``started_ns``/``ended_ns`` (Unix-epoch ns of the profiled call), ``trace`` (Chrome JSON text).
    ``resources``: what the kernel (or a node's agent) sampled of the rank's process: ``cpu``
        (percent of one core), ``rss`` (bytes), ``peak_rss``, ``cpu_time`` (seconds of CPU used so
        far; absent from an older agent's samples), and for a rank on a GPU where NVML
        answers ``gpu_mem`` (bytes NVML lists for its pid; None: unknown), ``peak_gpu_mem`` and
        ``gpu_util`` (its GPU's utilisation, percent).

Example:
    >>> event = display_event({"text/plain": "<Figure>", "image/png": "iVBOR..."})
    >>> plain_text(event)
    '<Figure>'
"""

from __future__ import annotations

from typing import Any

STARTED = "started"
DISPLAY = "display"
CLEAR_OUTPUT = "clear_output"
PROGRESS = "progress"
STACK = "stack"
NODE = "node"
CLOCK = "clock"
PROFILE = "profile"
RESOURCES = "resources"

# A widget displayed inside a rank lives in the rank's process: the kernel has no such model, so
# a frontend would show "model not found". Its other representations are kept.
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def started_event(pid: int) -> dict[str, Any]:
    return {"type": STARTED, "pid": pid}


def profile_event(rank: int, host: str, started_ns: int, ended_ns: int, trace: str) -> dict[str, Any]:
    return {"type": PROFILE, "rank": rank, "host": host, "started_ns": started_ns, "ended_ns": ended_ns, "trace": trace}


def resources_event(sample: dict[str, Any]) -> dict[str, Any]:
    return {"type": RESOURCES, **sample}


def display_event(
    data: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    display_id: str | None = None,
    update: bool = False,
) -> dict[str, Any]:
    """A ``display()`` from a rank; ``data`` loses representations the kernel cannot show."""
    clean = {mime: value for mime, value in data.items() if mime != WIDGET_VIEW_MIME}
    if not clean:
        clean = {"text/plain": "<a widget displayed on a rank (not shown: widgets live in the kernel)>"}
    return {
        "type": DISPLAY,
        "data": clean,
        "metadata": dict(metadata or {}),
        "display_id": display_id,
        "update": bool(update),
    }


def clear_event(wait: bool = False) -> dict[str, Any]:
    return {"type": CLEAR_OUTPUT, "wait": bool(wait)}


def progress_event(
    bar: int,
    n: float,
    total: float | None,
    left: str,
    right: str,
    text: str,
    closed: bool = False,
    leave: bool = True,
    failed: bool = False,
) -> dict[str, Any]:
    return {
        "type": PROGRESS,
        "bar": bar,
        "n": n,
        "total": total,
        "left": left,
        "right": right,
        "text": text,
        "closed": closed,
        "leave": leave,
        "failed": failed,
    }


def node_event(node: int, host: str) -> dict[str, Any]:
    """The rank runs on node ``node`` (``host``): sent by the kernel for launches across nodes."""
    return {"type": NODE, "node": node, "host": host}


def clock_event(node: int, offset_ns: int | None, round_trip_ns: int | None) -> dict[str, Any]:
    """The rank's node's clock minus the kernel's (and the probe's round trip): sent by the kernel."""
    return {"type": CLOCK, "node": node, "offset_ns": offset_ns, "round_trip_ns": round_trip_ns}


def stack_event(summary: str, text: str, why: str) -> dict[str, Any]:
    """Where a rank is (``summary``, one line) and every thread's stack (``text``), and ``why`` it was asked."""
    return {"type": STACK, "summary": summary, "why": why, "text": f"{why}; {summary}\n{text.rstrip()}"}


def plain_text(event: dict[str, Any]) -> str | None:
    """What a text-only destination shows for ``event``; None when it shows nothing."""
    kind = event.get("type")
    if kind == DISPLAY:
        data = event.get("data") or {}
        text = data.get("text/plain")
        if text is not None:
            return str(text)
        return "[" + ", ".join(sorted(data)) + "]" if data else None
    if kind == PROGRESS:
        return str(event.get("text", ""))
    if kind in (STARTED, CLEAR_OUTPUT, NODE, CLOCK, PROFILE, RESOURCES):
        return None
    text = event.get("text")  # an event type from a newer nbaccel: show its text if it has one
    return str(text) if text else None


def progress_fraction(event: dict[str, Any]) -> float | None:
    """``n / total`` clipped to [0, 1], or None when the total is unknown."""
    total = event.get("total")
    if not total:
        return None
    return max(0.0, min(1.0, float(event.get("n", 0)) / float(total)))
