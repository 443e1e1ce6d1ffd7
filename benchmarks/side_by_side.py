"""Two checkouts of nbaccel measured in one run: a kernel for each, driven round by round.

Kernels run as a user's do: nbaccel's fork server forked at ``import nbaccel``
(``NBACCEL_FORK_SERVER=eager``, unless the environment says otherwise).

A benchmark given ``--against DIR`` starts one kernel with this checkout first on its PYTHONPATH
(and as its working directory, which ipykernel puts on ``sys.path`` ahead of PYTHONPATH) and one
with DIR's, and measures both in turns, swapping which goes first each round, so that the load
other work puts on the machine falls on both alike. Each kernel checks which nbaccel it imported.

    with kernels({"new": HERE, "old": "/work/wt/base"}, env) as running:
        for label in turns(round_index, running): ...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import Kernel, running_kernel

HERE = str(Path(__file__).resolve().parents[1])


def checkout(text: str) -> str:
    """``--against``'s value: a folder holding another checkout's ``nbaccel`` package."""
    path = Path(text).expanduser().resolve()
    if not (path / "nbaccel" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"--against expects a checkout of nbaccel (a folder holding nbaccel/__init__.py); {text!r} has none. "
            "Make one with e.g. `git worktree add /tmp/base main`."
        )
    return str(path)


def trees(against: str | None) -> dict[str, str]:
    """Label -> checkout: this one alone, or ``new`` (this one) and ``old`` (``against``)."""
    return {"new": HERE} if against is None else {"new": HERE, "old": against}


@contextlib.contextmanager
def kernels(checkouts: dict[str, str], env: dict[str, str]) -> Iterator[dict[str, Kernel]]:
    """A fresh kernel per checkout, each importing its own nbaccel (checked), all shut down after."""
    with contextlib.ExitStack() as stack:
        running = {}
        for label, tree in checkouts.items():
            path = os.pathsep.join(part for part in (tree, os.environ.get("PYTHONPATH", "")) if part)  # the tree first
            # As a user's kernel runs: the fork server forked at `import nbaccel` (the test harness's default is "lazy").
            server = os.environ.get("NBACCEL_FORK_SERVER", "eager")
            kernel = stack.enter_context(running_kernel(env={"NBACCEL_FORK_SERVER": server, **env, "PYTHONPATH": path}, cwd=tree))
            where = kernel.execute("import nbaccel, os; print(os.path.dirname(os.path.dirname(nbaccel.__file__)))").stdout.strip()
            if os.path.realpath(where) != os.path.realpath(tree):
                raise SystemExit(f"the {label!r} kernel imported nbaccel from {where!r}, not from {tree!r}: PYTHONPATH did not take")
            running[label] = kernel
        yield running


def turns(round_index: int, labels: Sequence[str]) -> list[str]:
    """The order of the trees in round ``round_index``: swapped every round."""
    return list(labels) if round_index % 2 == 0 else list(reversed(labels))


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as /proc/loadavg says."""
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def compare(rows: Sequence[tuple[str, dict[str, float]]]) -> None:
    """One line per figure: new, old and new/old (below 1: the new tree is faster); a figure named
    ``... (x)`` or ``... (MiB)`` is in that unit, any other in ms."""
    width = max([len(name) for name, _ in rows] + [10])
    print(f"{'':<{width}} | {'new':>9} | {'old':>9} | {'new/old':>7}")
    for name, figure in rows:
        new, old = figure["new"], figure["old"]
        unit = "x " if name.endswith("(x)") else "M " if name.endswith("(MiB)") else "ms"
        ratio = f"{new / old:7.2f}" if old else f"{'-':>7}"
        print(f"{name:<{width}} | {new:7.2f}{unit} | {old:7.2f}{unit} | {ratio}")
