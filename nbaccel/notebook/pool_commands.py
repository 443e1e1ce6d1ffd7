"""The parser of the ``%distributed`` line magic: one subcommand per action on persistent workers.

Built on IPython's ``MagicArgumentParser`` (a wrong option raises a one-line ``UsageError``
instead of exiting), with argparse subcommands; ``help_text()`` is what ``%distributed?`` shows.

Example:
    >>> parse("start -n 4 --cpu").num_processes
    4
    >>> parse("pull weights --rank 1 -o w").out
    'w'
"""

from __future__ import annotations

import argparse
import functools
from typing import cast

from IPython.core.error import UsageError
from IPython.core.magic_arguments import MagicArgumentParser

from nbaccel.notebook import cluster_command
from nbaccel.notebook.magic_options import (
    CELL_OPTIONS,
    LAUNCH_OPTIONS,
    add_options,
    node_count,
    non_negative_int,
    seconds,
    unsplittable,
    variable_name,
)

PLAN_OPTIONS = (*LAUNCH_OPTIONS, *(o for o in CELL_OPTIONS if o.dest in ("timeout", "max_restarts")))

COMMANDS = ("start", "stop", "restart", "status", "free", "stacks", "debug", "push", "pull", "save", "load", "cluster", "plan")

_DESCRIPTION = """\
Persistent workers for %%distributed cells: ranks that keep their process group, their GPU memory
and their variables from one cell to the next.

After `%distributed start`, every %%distributed cell runs on the workers: each rank keeps its own
namespace, so a variable a cell defines is there in the next cell. Without workers, a
%%distributed cell is a one-shot launch, as before. Examples:

    %distributed start -n 2
    %distributed push data labels
    %distributed pull model_state --rank 0 -o weights
    %distributed push model --shard                   (FSDP2 over every rank; --mesh 2x2 for HSDP)
    %distributed push model --shard tp_plan --mesh 2x2 (tp_plan(module, mesh): your own sharding)
    %distributed save ckpt model optimizer            (torch.distributed.checkpoint; loads on any number of ranks)
    %distributed load ckpt model optimizer
    %distributed status
    %distributed status --watch                       (a table kept up to date after every cell)
    %distributed free
    %distributed stacks
    %distributed debug --rank 1
    %distributed stop
    %distributed restart --wait-for 2                 (a pool across nodes, after one was lost)
    %distributed restart --wait-for 2:4 --settle 30   (2 nodes, and up to 4 that join within 30 s)
    %distributed cluster 10.0.0.1 --via ssh --hosts node1 node2   (agents on several machines)
    %distributed plan -n 2 --cpu                      (what a launch would do; nothing starts)
"""


def _add_start(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    start = commands.add_parser("start", help="fork N workers and join their process group (returns when every rank is ready)")
    add_options(start, LAUNCH_OPTIONS)  # the same options, declared once, as a one-shot %%distributed cell's


def _add_transfers(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    push = commands.add_parser("push", help="send notebook variables to every rank (by value, with cloudpickle)")
    push.add_argument("names", nargs="+", type=variable_name, metavar="NAME", help="notebook variables to send")
    push.add_argument(
        "--shard",
        nargs="?",
        const=True,
        default=False,
        type=variable_name,
        metavar="RECIPE",
        help="modules only: shard each over the ranks with FSDP2's fully_shard (each rank receives its slices), or with RECIPE(module, mesh), a notebook function",
    )
    push.add_argument(
        "--mesh", type=mesh_shape, metavar="DPxTP", help="with --shard: the DeviceMesh shape, e.g. 4 or 2x2 (dims dp, tp; fully_shard on 2x2: HSDP)"
    )
    pull = commands.add_parser(
        "pull", help="bring a rank's variable into the notebook (tensors on CPU, a module as its state_dict; sharded values gathered in full)"
    )
    pull.add_argument("name", type=variable_name, metavar="NAME", help="the variable on the rank")
    pull.add_argument("--rank", type=non_negative_int, default=0, metavar="R", help="the rank to take it from (default: 0)")
    pull.add_argument("-o", "--out", type=variable_name, metavar="TARGET", help="the notebook variable to store it in (default: NAME)")


def _add_checkpoints(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    save = commands.add_parser("save", help="save rank variables (modules, optimizers, tensors, objects) with torch.distributed.checkpoint, atomically")
    save.add_argument("directory", metavar="DIR", help="the checkpoint's folder (written whole, or not at all)")
    save.add_argument("names", nargs="+", type=variable_name, metavar="NAME", help="variables on the ranks")
    load = commands.add_parser("load", help="load rank variables from a checkpoint saved on any number of ranks (resharded)")
    load.add_argument("directory", metavar="DIR", help="a folder %%distributed save wrote")
    load.add_argument("names", nargs="+", type=variable_name, metavar="NAME", help="variables on the ranks")


def mesh_shape(text: str) -> tuple[int, ...]:
    """``--mesh``: ``4`` or ``2x2``.

    >>> mesh_shape("2x2")
    (2, 2)
    """
    try:
        shape = tuple(int(part) for part in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected a mesh shape such as 4 or 2x2, got {text!r}")
    return shape


@functools.lru_cache(maxsize=1)
def parser() -> MagicArgumentParser:
    """The ``%distributed`` parser (built once)."""
    main = MagicArgumentParser(prog="distributed", description=_DESCRIPTION)  # type: ignore[no-untyped-call]  # IPython's magic_arguments is unannotated
    commands = main.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    _add_start(commands)
    commands.add_parser("stop", help="stop the workers: every rank leaves its process group and exits")
    restart = commands.add_parser("restart", help="fresh workers with empty namespaces and the same options (after a crash, or a lost node)")
    restart.add_argument(
        "--wait-for",
        type=node_count,
        metavar="N",
        help="a pool across nodes: wait until N nodes are joined (a replacement agent), then start; MIN:MAX waits --settle S more for up to MAX",
    )
    restart.add_argument("--settle", type=seconds, default=0.0, metavar="S", help="with --wait-for MIN:MAX: seconds to wait for more than MIN nodes")
    status = commands.add_parser(
        "status", help="per rank: pid, device, idle or ended, CPU use, memory in use and its peak (GPU: allocated, reserved, device), last cell"
    )
    status.add_argument("--watch", action="store_true", help="keep this table up to date: it is read again after every later cell, until the workers stop")
    commands.add_parser("free", help="on every rank: collect garbage and return torch's cached GPU memory; shows what each rank freed")
    commands.add_parser("stacks", help="where each worker is now: one line per rank, then every thread's Python stack")
    debug = commands.add_parser("debug", help="post-mortem of a rank's last failed cell, in its frames (prompt in this cell; q ends it)")
    debug.add_argument("--rank", type=non_negative_int, default=None, metavar="R", help="the rank to look at (default: the rank that failed last)")
    _add_transfers(commands)
    _add_checkpoints(commands)
    cluster_command.add_parser(commands)
    plan = commands.add_parser(
        "plan", help="what a %%distributed launch with these options would do, starting nothing: ranks, devices, start method and why, environment"
    )
    add_options(plan, PLAN_OPTIONS)
    return main


def parse(line: str) -> argparse.Namespace:
    """The parsed ``%distributed`` line; a one-line ``UsageError`` for anything wrong."""
    if not line.strip():
        raise UsageError(f"%distributed needs a command: {', '.join(COMMANDS)} (%distributed? explains each).")
    try:
        parsed: argparse.Namespace = parser().parse_argstring(line)  # type: ignore[no-untyped-call]  # unannotated: argparse's Namespace
        return parsed
    except ValueError as error:  # shlex: "No closing quotation"
        raise unsplittable("%distributed", line, error) from None


def help_text() -> str:
    """The overview, then the usage and options of every command that has options."""
    main = parser()
    parts = [main.format_help()]
    for action in main._subparsers._group_actions:  # type: ignore[union-attr]
        # Commands without options (stop, restart, status) are fully described in the overview.
        parts.extend(sub.format_help() for sub in cast("dict[str, argparse.ArgumentParser]", action.choices).values() if sub._actions)
    return "\n".join(parts)
