"""Where the milliseconds of a trivial launch go: timers wrapped around the launch's own pieces.

Used by ``launch_bench.py`` inside the benchmark's kernel. Nothing in nbaccel knows about it:
``install()`` replaces the module attributes the launch path looks up (``make_plan``,
``open_rank_pipes``, ``ForkStarter.start``, the rank's bootstrap steps...) with wrappers that
append ``(label, start_ns, end_ns)`` to ``PHASES``, and ``uninstall()`` puts the originals back,
so the headline figures are measured on the untouched code. ``time.perf_counter_ns`` is
CLOCK_MONOTONIC, one clock for the kernel and its forked ranks: a rank's timestamps (returned as
its value by ``traced_trivial``) line up with the kernel's.

    install(); values = nbaccel.notebook_launcher(traced_trivial, num_processes=2); uninstall()
    row = breakdown(kernel_phases(), values, call_ns, return_ns)
"""

from __future__ import annotations

import functools
import importlib
import statistics
import time
from typing import Any

PHASES: list[tuple[str, int, int]] = []
_SAVED: list[tuple[Any, str, Any]] = []

# (module, attribute, label): the kernel's side of a launch, in the order it runs.
KERNEL_STEPS = [
    ("nbaccel.launcher", "make_plan", "plan: make_plan"),
    ("nbaccel.launcher", "choose_starter", "plan: choose_starter"),
    ("nbaccel.launcher", "make_sink", "plan: make_sink"),
    ("nbaccel.launcher", "debuggable_job", "plan: debuggable_job"),
    ("nbaccel.launcher", "run_launch", "run_launch"),
    ("nbaccel.launch.group", "LoopbackRendezvous", "store port"),
    ("nbaccel.launch.group", "StackFiles", "stack files"),
    ("nbaccel.launch.group", "_environment", "rank env"),
    ("nbaccel.launch.group", "open_rank_pipes", "pipes"),
    ("nbaccel.launch.group", "close_child_ends", "pipes"),
    ("nbaccel.launch.starters.fork.ForkStarter", "start", "fork"),
    ("nbaccel.launch.starters.fork.ForkStarter", "release", "starter release"),
    ("nbaccel.launch.group.LocalRankGroup", "start", None),  # a classmethod: wrapped below
    ("nbaccel.launch.rendezvous.LoopbackRendezvous", "start_store", "store start"),
    ("nbaccel.launch.loop.EventLoop", "run", "loop"),
    ("nbaccel.launch.group.LocalRankGroup", "close", "teardown"),
    ("nbaccel.launch.group.LocalRankGroup", "kill", "teardown: kill and reap"),
    ("nbaccel.launch.rendezvous.LoopbackRendezvous", "close", "teardown: store"),
    ("nbaccel.launch.stacks.StackFiles", "close", "teardown: stack folder"),
    ("nbaccel.launch.pipes.RankPipes", "close", "teardown: pipes"),
    ("nbaccel.launch.warm", "import_noted", "after"),
]
# The rank's side: each step of nbaccel.rank.bootstrap.run_rank before the function is called.
RANK_STEPS = [
    ("nbaccel.rank.bootstrap", "_detach_from_kernel", "detach"),
    ("nbaccel.rank.process_title", "set_encoded", "process title"),  # its words made by the fork starter, in the kernel
    ("nbaccel.rank.bootstrap", "redirect_stdio", "stdio"),
    ("nbaccel.rank.bootstrap.faulthandler", "enable", "faulthandler"),
    ("nbaccel.rank.stack_dump", "install", "stack dump hook"),
    ("nbaccel.rank.collective_count", "start_answering", "stack dump hook: count hook"),
    ("nbaccel.rank.bootstrap", "_forget_kernel_state", "forget kernel state"),
    ("nbaccel.rank.exit_hooks", "start", "exit hooks"),
    ("nbaccel.rank.bootstrap", "_pin_device", "pin device"),
    ("nbaccel.rank.cpu_threads", "share_cores", "cpu threads"),
    ("nbaccel.rank.accelerate_world", "install", "accelerate world"),
    ("nbaccel.rank.display_hooks", "install", "display hooks"),
    ("nbaccel.rank.debugger", "install", "debugger"),
    ("nbaccel.rank.process_identity", "become_rank", "process identity"),
    ("nbaccel.wire.shm", "use_rank_mailbox", "shm mailbox"),
    ("nbaccel.rank.heavy_imports", "present_at_start", "warm modules noted"),  # by the parent, before the fork
]


def _owner(path: str) -> Any:
    """The module or class at ``path`` (``pkg.module.Class``)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            owner = getattr(owner, attr)
        return owner
    raise ImportError(path)


def _timed(original: Any, label: str) -> Any:
    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            PHASES.append((label, start, time.perf_counter_ns()))

    return timed


def _wrap(path: str, name: str, label: str | None) -> None:
    try:
        owner = _owner(path)
    except (ImportError, AttributeError):
        return  # another checkout (launch_bench --against) may lack a step: its phase reads 0
    if name not in (owner.__dict__ if isinstance(owner, type) else vars(owner)):
        return
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    _SAVED.append((owner, name, original))
    if isinstance(original, classmethod):
        setattr(owner, name, classmethod(_timed(original.__func__, "group start")))
    else:
        setattr(owner, name, _timed(original, label or name))


def install() -> None:
    """Wrap every step (idempotent); the fork's child clears PHASES and marks when it runs."""
    if _SAVED:
        return
    for path, name, label in KERNEL_STEPS + RANK_STEPS:
        _wrap(path, name, label)
    fork = _owner("nbaccel.launch.starters.fork")
    original_run_rank = fork.run_rank
    _SAVED.append((fork, "run_rank", original_run_rank))

    def run_rank(*args: Any, **kwargs: Any) -> Any:
        PHASES.clear()  # the child's copy: only what this rank does from here
        now = time.perf_counter_ns()
        PHASES.append(("child runs", now, now))
        return original_run_rank(*args, **kwargs)

    fork.run_rank = run_rank
    loop = _owner("nbaccel.launch.loop.EventLoop")
    for name, label in (("event", "answer seen"), ("exited", "exit seen")):
        original = loop.__dict__[name]
        _SAVED.append((loop, name, original))
        setattr(loop, name, _marking(original, label))


def _marking(original: Any, label: str) -> Any:
    def marked(self: Any, rank: int, *args: Any) -> Any:
        now = time.perf_counter_ns()
        PHASES.append((f"{label} {rank}", now, now))
        return original(self, rank, *args)

    return marked


def uninstall() -> None:
    while _SAVED:
        owner, name, original = _SAVED.pop()
        setattr(owner, name, original)
    PHASES.clear()


def traced_trivial() -> list[tuple[str, int, int]]:
    """A trivial function that returns what its rank's bootstrap did, and when it was called."""
    now = time.perf_counter_ns()
    return [*PHASES, ("function", now, now)]


def breakdown(kernel: list[tuple[str, int, int]], ranks: list[list[tuple[str, int, int]]], call_ns: int, return_ns: int) -> dict[str, float]:
    """One launch's phases in ms: kernel steps summed over ranks, rank steps as the median rank."""
    ms: dict[str, float] = {"total": (return_ns - call_ns) / 1e6}
    spans: dict[str, float] = {}
    for label, start, end in kernel:
        if not label.startswith(("answer seen", "exit seen")):
            spans[label] = spans.get(label, 0.0) + (end - start) / 1e6
    launch = next(p for p in kernel if p[0] == "run_launch")
    group = next(p for p in kernel if p[0] == "group start")
    loop = next(p for p in kernel if p[0] == "loop")
    close = next(p for p in kernel if p[0] == "teardown")
    ms["plan"] = (launch[1] - call_ns) / 1e6  # checks, options, plan, starter, sink
    ms.update({label: value for label, value in spans.items() if label.startswith("plan: ")})
    ms["sink session"] = (group[1] - launch[1]) / 1e6
    for label in ("store port", "stack files", "rank env", "pipes", "fork"):
        ms[label] = spans.get(label, 0.0)
    ms["gc freeze/other group"] = (group[2] - group[1]) / 1e6 - sum(ms[k] for k in ("store port", "stack files", "rank env", "pipes", "fork"))
    ms["store start"] = spans.get("store start", 0.0)
    ms["loop"] = (loop[2] - loop[1]) / 1e6
    ms["teardown"] = (close[2] - close[1]) / 1e6
    ms.update({label: value for label, value in spans.items() if label.startswith("teardown: ")})
    ms["after"] = (return_ns - close[2]) / 1e6
    # Inside the loop: until the last rank calls the function, answers, and its exit is seen.
    function_at = max(dict((p[0], p[1]) for p in rank)["function"] for rank in ranks)
    answers = [p[1] for p in kernel if p[0].startswith("answer seen")]
    exits = [p[1] for p in kernel if p[0].startswith("exit seen")]
    ms["loop: to last function call"] = (function_at - loop[1]) / 1e6
    ms["loop: to last answer"] = ((max(answers) if answers else loop[2]) - function_at) / 1e6
    ms["loop: to last exit"] = ((max(exits) if exits else loop[2]) - (max(answers) if answers else loop[2])) / 1e6
    forks = sorted(p[1] for p in kernel if p[0] == "fork")
    per_rank: dict[str, list[float]] = {}
    for fork_ns, rank in zip(forks, sorted(ranks, key=lambda r: r[0][1]), strict=False):
        marks = {p[0]: p for p in rank}
        per_rank.setdefault("rank: fork to child", []).append((marks["child runs"][1] - fork_ns) / 1e6)
        for label, start, end in rank:
            if label not in ("child runs", "function"):
                per_rank.setdefault(f"rank: {label}", []).append((end - start) / 1e6)
        per_rank.setdefault("rank: child to function", []).append((marks["function"][1] - marks["child runs"][1]) / 1e6)
    ms.update({label: statistics.median(values) for label, values in per_rank.items()})
    return ms


def kernel_phases() -> list[tuple[str, int, int]]:
    taken = list(PHASES)
    PHASES.clear()
    return taken
