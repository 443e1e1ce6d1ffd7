"""Option values of the ``%%distributed`` / ``%distributed`` magics, and what each mode accepts.

The argparse types turn a wrong value into one line naming it (IPython's parser raises it as a
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
from typing import Any

from IPython.core.error import UsageError

# Options the workers fixed when they started (dest -> how the user spelled it).
ONE_SHOT_OPTIONS = {
    "num_processes": "-n",
    "gpus": "--gpus",
    "cpu": "--cpu",
    "mixed_precision": "--mixed-precision",
    "start_method": "--start-method",
    "max_restarts": "--max-restarts",
}


def positive_int(text: str) -> int:
    return _whole_number_at_least(text, 1)


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


def output_mode(args: argparse.Namespace) -> str | None:
    """``"text"``, ``"widgets"`` or None (let ``NBACCEL_OUTPUT`` decide) from --text / --widgets."""
    if args.text and args.widgets:
        raise UsageError("--text and --widgets contradict each other: pass one of them (or neither, to choose by itself).")
    if args.text or args.widgets:
        return "text" if args.text else "widgets"
    return None


def launcher_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The ``notebook_launcher`` keyword arguments that parsed ``%%distributed`` options stand for.

    Options left out are left out here too, so the launcher's defaults (and ``NBACCEL_OUTPUT``)
    decide.
    """
    output = output_mode(args)
    kwargs: dict[str, Any] = {}
    for option in ("num_processes", "gpus", "mixed_precision", "start_method", "timeout", "max_restarts"):
        value = getattr(args, option)
        if value is not None:
            kwargs[option] = value
    if args.cpu:
        kwargs["cpu"] = True
    if output is not None:
        kwargs["output"] = output
    return kwargs


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
    given = [spelled for dest, spelled in ONE_SHOT_OPTIONS.items() if getattr(args, dest, None) not in (None, False)]
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
