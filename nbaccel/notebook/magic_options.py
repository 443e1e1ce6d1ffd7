"""The options of the ``%%distributed`` / ``%distributed`` magics, each declared once, and their checks.

`LAUNCH_OPTIONS` (how ranks start: -n, --gpus, --cpu, --mixed-precision, --start-method) are
taken by a one-shot ``%%distributed`` cell and by ``%distributed start``; `CELL_OPTIONS` by the
cell only. Both magics build nbaccel's `LaunchOptions` from what was given (`launch_options`),
so options are checked together, as ``notebook_launcher`` and ``start_workers`` check them. `add_options` puts them on a parser, `options_decorator` on a magic. The argparse
types turn a wrong value into one line naming it (IPython's parser raises it as a
``UsageError``); the checks below refuse options that mean nothing in the mode that runs: a
one-shot launch (no workers running) or the running workers.

Example:
    >>> rank_list("2,0")
    (0, 2)
    >>> ns = argparse.Namespace(num_processes=2, gpus=None, mixed_precision=None, start_method=None,
    ...     timeout=None, max_restarts=None, cpu=False, text=True, widgets=False, out=None)
    >>> launcher_arguments(ns)
    {'num_processes': 2, 'output': 'text'}
"""

from __future__ import annotations

import argparse
import keyword
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from IPython.core import magic_arguments
from IPython.core.error import UsageError

from nbaccel.launch.options import MIXED_PRECISIONS, START_METHODS, LaunchOptions

F = TypeVar("F", bound=Callable[..., Any])


def positive_int(text: str) -> int:
    return _whole_number_at_least(text, 1)


def node_count(text: str) -> int | str:
    """A node count (``2``) or a range (``2:4``), as ``cluster.wait(nodes=...)`` takes it."""
    if ":" not in text:
        return positive_int(text)
    low, _, high = text.partition(":")
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
        raise argparse.ArgumentTypeError(f"expected a node count N or a range MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return text


def non_negative_int(text: str) -> int:
    return _whole_number_at_least(text, 0)


def _whole_number_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


STALL_REPORT_OFF = "off"


def stall_seconds(text: str) -> float | str:
    """``--stall-report 60`` (seconds) or ``--stall-report off``."""
    if text.strip().lower() in (STALL_REPORT_OFF, "none"):
        return STALL_REPORT_OFF
    return seconds(text)


def gpu_list(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected device indices separated by commas, e.g. --gpus 0,2,3; got {text!r}")
    return tuple(int(part) for part in parts)


def rank_list(text: str) -> tuple[int, ...]:
    """``"2,0"`` -> ``(0, 2)``: sorted, without repeats."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected rank numbers separated by commas, e.g. --ranks 0,2; got {text!r}")
    return tuple(sorted({int(part) for part in parts}))


def variable_name(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"expected a Python variable name, got {text!r}")
    return text


@dataclass(frozen=True)
class Option:
    """One magic option: its spellings and what argparse needs to parse it.

    ``one_shot``: it means something only to a one-shot launch (with workers running, the
    workers fixed it when they started, so a cell on them refuses it).
    """

    flags: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    one_shot: bool = False

    @property
    def dest(self) -> str:
        return self.flags[-1].lstrip("-").replace("-", "_")

    @property
    def spelled(self) -> str:
        return self.flags[0]


LAUNCH_OPTIONS: tuple[Option, ...] = (
    Option(
        ("-n", "--num-processes"),
        {"type": positive_int, "metavar": "N", "help": "ranks to start (default: one per visible GPU, or 2 CPU ranks on gloo)"},
        one_shot=True,
    ),
    Option(("--gpus",), {"type": gpu_list, "metavar": "0,2,3", "help": "CUDA devices to use, one rank each (default: the first N)"}, one_shot=True),
    Option(("--cpu",), {"action": "store_true", "help": "run CPU ranks on gloo even where GPUs are visible"}, one_shot=True),
    Option(("--mixed-precision",), {"choices": MIXED_PRECISIONS, "help": "exported to nbaccel's state and Accelerate (default: no)"}, one_shot=True),
    Option(
        ("--start-method",),
        {
            "choices": START_METHODS,
            "help": "fork the kernel (ranks start with the notebook's variables), forkserver (forked from nbaccel's fork server: fast, empty namespaces), or spawn fresh interpreters (empty namespaces); default: auto, fork when safe, else forkserver",
        },
        one_shot=True,
    ),
    Option(
        ("--stall-report",),
        {
            "type": stall_seconds,
            "metavar": "SECONDS",
            "help": "when no rank prints for this long, show each rank's stack once, stopping nothing; 'off' turns it off (default: 300)",
        },
        one_shot=True,
    ),
    Option(
        ("--cluster",),
        {
            "type": variable_name,
            "metavar": "NAME",
            "help": "run on every rank of every node of the nbaccel.Cluster bound to NAME (empty namespaces on workers; docs/multinode.md)",
        },
        one_shot=True,
    ),
)

CELL_OPTIONS: tuple[Option, ...] = (
    Option(("--timeout",), {"type": seconds, "metavar": "SECONDS", "help": "stop the cell after this many seconds (running workers stay)"}),
    Option(
        ("--max-restarts",),
        {"type": non_negative_int, "metavar": "K", "help": "relaunch every rank after a failure, up to K times (default: 0)"},
        one_shot=True,
    ),
    Option(
        ("--ranks",),
        {"type": rank_list, "metavar": "0,2", "help": "with running workers: run the cell on these ranks only; its result is the lowest one's value"},
    ),
    Option(
        ("-o", "--out"),
        {"type": variable_name, "metavar": "NAME", "help": "store every rank's value in NAME: a list by rank (with --ranks, a dict rank -> value)"},
    ),
    Option(("--pdb",), {"action": "store_true", "help": "when a rank raises, open a post-mortem prompt in its frame in this cell (default: IPython's %%pdb)"}),
    Option(
        ("--profile",),
        {
            "nargs": "?",
            "const": True,
            "default": None,
            "metavar": "DIR",
            "help": "run each rank under torch.profiler; write DIR/rank{N}.json, the merged DIR/trace.json and a summary (default DIR: the launch's log folder)",
        },
    ),
    Option(("--text",), {"action": "store_true", "help": "show output as text lines labelled [rank N]"}),
    Option(("--widgets",), {"action": "store_true", "help": "show output in per-rank widgets (default: NBACCEL_OUTPUT, else auto)"}),
)

# The LaunchOptions fields a magic's options set (-o, --ranks, --text, --widgets are the cell's own).
_LAUNCH_DESTS = tuple(field.name for field in fields(LaunchOptions))
_NOT_GIVEN = (None, False)  # an option left out; "is" compared: --max-restarts 0 is given


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    """Declare ``options`` on ``parser``, in their order."""
    for option in options:
        parser.add_argument(*option.flags, **option.settings)


def options_decorator(options: Sequence[Option]) -> Callable[[F], F]:
    """``@magic_arguments.argument(...)`` for each of ``options``, listed in their order in the help."""

    def decorate(function: F) -> F:
        for option in reversed(options):  # IPython lists decorators bottom-up; this keeps the declared order
            function = magic_arguments.argument(*option.flags, **option.settings)(function)  # type: ignore[no-untyped-call]  # IPython's magic_arguments is unannotated
        return function

    return decorate


def launch_options(args: argparse.Namespace, command: str) -> tuple[LaunchOptions, tuple[str, ...]]:
    """The checked `LaunchOptions` that the launch options in ``args`` stand for, and which were given.

    Options left out keep LaunchOptions' defaults, and are not among the names returned, so the
    launcher's or pool's defaults decide for them. A contradiction between options (``--gpus``
    with ``--cpu``) is a one-line UsageError naming ``command``, before anything starts.
    """
    given = {dest: getattr(args, dest) for dest in _LAUNCH_DESTS if not any(getattr(args, dest, None) is absent for absent in _NOT_GIVEN)}
    if given.get("stall_report") == STALL_REPORT_OFF:
        given["stall_report"] = None  # given, and off
    try:
        return LaunchOptions(**given), tuple(given)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{command}: {error}") from None


def start_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``start_workers`` keyword arguments of ``%distributed start``'s options (via `LaunchOptions`)."""
    options, given = launch_options(args, "%distributed start")
    return {name: getattr(options, name) for name in given}


def unsplittable(command: str, line: str, error: ValueError) -> UsageError:
    """The UsageError for a magic line that shell-style splitting refuses (an unclosed quote)."""
    return UsageError(f"{command} {line.strip()}: {error}, so the line cannot be split into options; close every quote, or escape a lone one with a backslash.")


def output_mode(args: argparse.Namespace) -> str | None:
    """``"text"``, ``"widgets"`` or None (let ``NBACCEL_OUTPUT`` decide) from --text / --widgets."""
    if args.text and args.widgets:
        raise UsageError("--text and --widgets contradict each other: pass one of them (or neither, to choose by itself).")
    if args.text or args.widgets:
        return "text" if args.text else "widgets"
    return None


def launcher_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The ``notebook_launcher`` keyword arguments that parsed ``%%distributed`` options stand for.

    The options are checked together as a `LaunchOptions` first. Options left out are left out
    here too, so the launcher's defaults (and ``NBACCEL_OUTPUT``) decide.
    """
    output = output_mode(args)
    options, given = launch_options(args, "%%distributed")
    kwargs: dict[str, Any] = {name: getattr(options, name) for name in given}
    if output is not None:
        kwargs["output"] = output
    return kwargs


def with_cluster(kwargs: dict[str, Any], args: argparse.Namespace, user_ns: dict[str, Any], command: str) -> dict[str, Any]:
    """``kwargs`` plus the ``nbaccel.Cluster`` that ``--cluster NAME`` names in the notebook, if given.

    On a cluster the nodes' agents fix the ranks (``--nproc-per-node``), so -n, --gpus and
    --start-method are refused with it.
    """
    name = getattr(args, "cluster", None)
    if name is None:
        return kwargs
    from nbaccel.cluster.cluster import Cluster

    cluster = user_ns.get(name)
    if not isinstance(cluster, Cluster):
        raise UsageError(
            f"{command} --cluster {name}: {name!r} is not an nbaccel.Cluster in the notebook (it is {type(cluster).__name__}); make one first: {name} = nbaccel.Cluster('HOST:PORT')."
        )
    clashing = [f"--{option.replace('_', '-')}" for option in ("num_processes", "gpus", "start_method") if option in kwargs]
    if clashing:
        raise UsageError(f"{command} --cluster {name} takes its ranks from the nodes' agents (--nproc-per-node there): drop {', '.join(clashing)}.")
    return {**kwargs, "cluster": cluster}


def check_one_shot(args: argparse.Namespace) -> None:
    """Refuse what needs running workers (``--ranks``) when the cell is a one-shot launch."""
    if getattr(args, "ranks", None) is not None:
        ranks = ",".join(map(str, args.ranks))
        raise UsageError(
            f"--ranks {ranks} needs running workers, and none are running: start them with "
            "%distributed start -n N (a one-shot launch runs the cell on every rank)."
        )


def check_for_workers(args: argparse.Namespace, num_processes: int) -> None:
    """Refuse launch options the running workers fixed when they started, and ranks outside them."""
    one_shot = (o for o in (*LAUNCH_OPTIONS, *CELL_OPTIONS) if o.one_shot)
    given = [o.spelled for o in one_shot if getattr(args, o.dest, None) not in (None, False)]
    if given:
        raise UsageError(
            f"{', '.join(given)} only apply to one-shot launches, but {num_processes} workers are running "
            "and the cell runs on them: drop the option(s), or %distributed stop (or restart) first."
        )
    outside = [rank for rank in args.ranks or () if rank >= num_processes]
    if outside:
        raise UsageError(
            f"--ranks {','.join(map(str, args.ranks))}: rank(s) {', '.join(map(str, outside))} are outside the "
            f"{num_processes} running workers (ranks 0..{num_processes - 1})."
        )
