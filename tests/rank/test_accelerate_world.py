"""Accelerate's own state objects see an nbaccel launch's world on CPU ranks, whichever comes first.

Accelerate (1.15) reports ``DistributedType.NO`` and one process on every CPU rank when
``PartialState()`` is made before an ``Accelerator`` (see ``nbaccel.rank.accelerate_world``).
Run with the pinned Accelerate and with the oldest supported one (see the module's report).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nbaccel import notebook_launcher

# Imported in the test process, so the ranks inherit it through the fork (the hook then patches
# the rank's copy at once); the fresh-interpreter test below covers an import inside the rank.
acc_state = pytest.importorskip("accelerate.state")

pytestmark = pytest.mark.timeout(90)


def world_seen_by_accelerate(first: str) -> dict:
    """Make ``first`` (PartialState, AcceleratorState or Accelerator), then read what Accelerate sees."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    refused = None
    if first == "PartialState":
        PartialState()
    elif first == "AcceleratorState":
        try:  # Accelerate's rule, under torchrun too: an AcceleratorState needs an Accelerator
            AcceleratorState()
        except ValueError as error:
            refused = str(error)
    else:
        Accelerator()
    state = PartialState()
    seen = {
        "type": str(state.distributed_type).split(".")[-1],
        "backend": state.backend,
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "local_process_index": state.local_process_index,
        "device": state.device.type,
        "torch_world": dist.get_world_size(),
        "refused": refused,
    }
    if refused is None:
        accelerator = Accelerator()
        seen.update(
            accelerator_processes=accelerator.num_processes,
            mixed_precision=AcceleratorState().mixed_precision,
            main=accelerator.is_main_process,
        )
    return seen


@pytest.mark.parametrize("first", ["PartialState", "AcceleratorState", "Accelerator"])
def test_accelerate_sees_the_launch_world_whichever_state_comes_first(first: str) -> None:
    results = notebook_launcher(world_seen_by_accelerate, args=(first,), num_processes=2, mixed_precision="bf16", cpu=True, timeout=60, output="text")
    for rank, seen in enumerate(results):
        assert (seen["type"], seen["backend"], seen["device"]) == ("MULTI_CPU", "gloo", "cpu"), seen
        assert (seen["num_processes"], seen["torch_world"]) == (2, 2), seen
        assert (seen["process_index"], seen["local_process_index"]) == (rank, rank), seen
        if first == "AcceleratorState":
            assert "Accelerator()" in seen["refused"]
        else:
            assert (seen["accelerator_processes"], seen["mixed_precision"], seen["main"]) == (2, "bf16", rank == 0), seen


def test_the_kernel_keeps_accelerate_unpatched() -> None:
    notebook_launcher(world_seen_by_accelerate, args=("PartialState",), num_processes=2, cpu=True, timeout=60, output="text")
    assert not hasattr(acc_state.PartialState.__init__, "_nbaccel_cpu_world")


IMPORTED_IN_THE_RANK = """
import sys
from nbaccel.launcher import notebook_launcher

def world():
    from accelerate import PartialState
    state = PartialState()
    return str(state.distributed_type).split(".")[-1], state.num_processes, state.process_index

results = notebook_launcher(world, num_processes=2, cpu=True, timeout=60, output="text")
assert "accelerate" not in sys.modules, "the kernel side imported accelerate"
print(results)
"""


@pytest.mark.slow
def test_accelerate_imported_first_inside_the_rank_sees_the_world_too() -> None:
    # A fresh interpreter: in this one accelerate is already imported (before every fork).
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(IMPORTED_IN_THE_RANK)], check=False, capture_output=True, text=True, timeout=80)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[('MULTI_CPU', 2, 0), ('MULTI_CPU', 2, 1)]"


@pytest.mark.slow
def test_spawned_ranks_see_the_world_too() -> None:
    results = notebook_launcher(world_seen_by_accelerate, args=("PartialState",), num_processes=2, cpu=True, start_method="spawn", timeout=80, output="text")
    assert [(r["type"], r["num_processes"], r["process_index"]) for r in results] == [("MULTI_CPU", 2, 0), ("MULTI_CPU", 2, 1)]
