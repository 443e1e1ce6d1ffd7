"""The stop button still works after nbaccel ran: a real ipykernel's SIGINT handling, before and after.

What the kernel has (read from ``/proc`` between cells: SIGINT caught, ignored or blocked, as the
kernel process holds it; and inside a cell: the handler and the main thread's mask) is the same
after a launch, a pool started, used, interrupted and stopped, an interrupted launch and a
debugger session; then an interrupt of a plain cell still raises KeyboardInterrupt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernel_harness import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(240)]

DEFINE = """
import json, os, signal, time
import nbaccel

def handling():
    print(json.dumps({"SIGINT": repr(signal.getsignal(signal.SIGINT)), "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ()))}))

def nap():
    print("napping", flush=True)
    time.sleep(30)

def break_on_rank_one():
    if os.environ["RANK"] == "1":
        breakpoint()
    return int(os.environ["RANK"])
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return DEFINE


def _between_cells(pid: int) -> dict[str, bool]:
    """SIGINT as the kernel process holds it while idle: caught, ignored, blocked (its main thread)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Sig"))
    bit = 1 << 1  # SIGINT is signal 2: bit 1 of each mask
    return {name: bool(int(fields[name].strip(), 16) & bit) for name in ("SigCgt", "SigIgn", "SigBlk")}


def _both_nap(output: str) -> bool:
    return output.count("napping") == 2


def _ran(kernel: Kernel, code: str, **options: object) -> str:
    run = kernel.execute(code, **options)  # type: ignore[arg-type]
    return run.error["ename"] if run.status == "error" else run.status


def test_after_every_way_nbaccel_runs_code_the_kernels_sigint_handling_is_as_before(kernel: Kernel) -> None:
    idle, in_cell = _between_cells(kernel.pid), kernel.execute("handling()").stdout
    # ipykernel ignores SIGINT between cells and installs Python's handler while one runs.
    assert idle == {"SigCgt": False, "SigIgn": True, "SigBlk": False}, idle
    assert '"SIGINT": "<built-in function default_int_handler>"' in in_cell and '"blocked": []' in in_cell, in_cell
    assert _ran(kernel, "nbaccel.notebook_launcher(lambda: 1, num_processes=2)") == "ok"
    assert _ran(kernel, "pool = nbaccel.start_workers(2)\npool.run(lambda: 2)") == "ok"
    assert _ran(kernel, "pool.run(nap)", interrupt_on=_both_nap) == "KeyboardInterrupt"
    assert _ran(kernel, "assert pool.run(lambda: 3) == [3, 3]\npool.stop()") == "ok"
    assert _ran(kernel, "nbaccel.notebook_launcher(nap, num_processes=2)", interrupt_on=_both_nap) == "KeyboardInterrupt"
    assert _ran(kernel, "nbaccel.notebook_launcher(break_on_rank_one, num_processes=2)", answers=["c"], timeout=90) == "ok"
    assert kernel.children() == []
    assert _between_cells(kernel.pid) == idle
    assert kernel.execute("handling()").stdout == in_cell
    # The stop button, on a cell of the user's own.
    assert _ran(kernel, "print('sleeping', flush=True)\ntime.sleep(30)", interrupt_on="sleeping") == "KeyboardInterrupt"
