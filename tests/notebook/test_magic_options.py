"""Each magic option is declared once: a one-shot cell and `%distributed start` share the launch options.

Imports internals (notebook, notebook.magic_options, notebook.magics): it tests those units directly, below the public face.
"""

from __future__ import annotations

import argparse

import pytest

from nbaccel.notebook import pool_commands
from nbaccel.notebook.magic_options import CELL_OPTIONS, LAUNCH_OPTIONS
from nbaccel.notebook.magics import DistributedMagics


def spellings(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    return [tuple(action.option_strings) for action in parser._actions if action.option_strings and action.dest != "help"]


def start_parser() -> argparse.ArgumentParser:
    [commands] = [a for a in pool_commands.parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices["start"]


def test_the_cell_takes_the_launch_options_then_its_own_in_the_declared_order() -> None:
    cell_parser = DistributedMagics.distributed_cell.parser
    assert spellings(cell_parser) == [o.flags for o in (*LAUNCH_OPTIONS, *CELL_OPTIONS)]


def test_start_takes_exactly_the_launch_options_with_the_same_help() -> None:
    start = start_parser()
    assert spellings(start) == [o.flags for o in LAUNCH_OPTIONS]
    cell_help = {a.dest: a.help for a in DistributedMagics.distributed_cell.parser._actions}
    assert {a.dest: a.help for a in start._actions if a.dest != "help"} == {o.dest: cell_help[o.dest] for o in LAUNCH_OPTIONS}


def test_no_option_is_spelled_twice() -> None:
    flags = [flag for o in (*LAUNCH_OPTIONS, *CELL_OPTIONS) for flag in o.flags]
    assert len(flags) == len(set(flags))


def option_lines(help_text: str) -> list[str]:
    """The first flag of every option the help describes (its lines start with two spaces and a dash)."""
    return [line.split()[0].rstrip(",") for line in help_text.splitlines() if line.startswith("  -")]


def test_each_help_describes_every_option_once() -> None:
    cell_help = DistributedMagics.distributed_cell.__doc__ or ""
    assert option_lines(cell_help) == [o.flags[0] for o in (*LAUNCH_OPTIONS, *CELL_OPTIONS)]
    assert cell_help.lstrip(":\n ").startswith("%%distributed [-n N]")
    workers_help = pool_commands.help_text()
    cluster = [
        "--via",
        "--hosts",
        "--nproc-per-node",
        "--agent",
        "--ssh-config",
        "--ssh-option",
        "--nodes",
        "--gpus-per-node",
        "--cpus-per-node",
        "--strategy",
        "--ray-address",
        "--time",
        "--partition",
        "--sbatch-option",
        "--token-dir",
        "--wait-timeout",
        "-o",
    ]
    assert option_lines(workers_help) == [
        *(o.flags[0] for o in LAUNCH_OPTIONS),
        "--wait-for",
        "--settle",
        "--watch",
        "--rank",
        "--shard",
        "--mesh",
        "--rank",
        "-o",
        *cluster,
        *(o.flags[0] for o in pool_commands.PLAN_OPTIONS),
    ]  # start's, restart's, debug's, push's, pull's, cluster's, plan's


def test_wait_for_takes_a_node_count_or_a_range() -> None:
    from nbaccel.notebook.magic_options import node_count

    assert node_count("2") == 2 and node_count("2:4") == "2:4"
    for wrong in ("0", "4:2", "2:", "a:b"):
        with pytest.raises(argparse.ArgumentTypeError):
            node_count(wrong)


def test_stall_report_takes_seconds_or_off() -> None:
    from nbaccel.notebook.magic_options import STALL_REPORT_OFF, stall_seconds

    assert stall_seconds("60") == 60.0
    assert stall_seconds("off") == STALL_REPORT_OFF and stall_seconds("None") == STALL_REPORT_OFF
    with pytest.raises(argparse.ArgumentTypeError, match="positive number of seconds"):
        stall_seconds("0")
