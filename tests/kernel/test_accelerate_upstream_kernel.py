"""Accelerate's own test scripts pass under nbaccel.notebook_launcher in a real kernel, 2 ranks each.

``test_ops`` starts from ``PartialState()``: before nbaccel's Accelerate hook every rank of it
"passed" alone (``DistributedType.NO``, one process). Each rank here must report the world of 2.

``test_distributed_data_loop`` is left out: it deadlocks on CPU under torchrun too. Its
``test_can_join_uneven_inputs`` gives rank 0 two batches and rank 1 one (``even_batches=False``)
inside ``accelerator.join_uneven_inputs``, which is a no-op unless ``Accelerator.multi_device``
(GPU-like types only, not MULTI_CPU: it warns "only supported for multi-GPU training"). Without
torch's ``Join``, rank 0's second batch waits in DDP's forward (``_pre_forward``, a collective
rank 1 never joins) while rank 1 waits in ``wait_for_everyone()``'s barrier, until the process
group's 30-minute timeout (seen in both ranks' faulthandler stacks, under nbaccel on 2 CPU ranks).
"""

from __future__ import annotations

import pytest

from tests.kernel_harness import Kernel

pytest.importorskip("accelerate")

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.timeout(180)]

DEFINE = """
import importlib
import nbaccel

def upstream(name):
    from accelerate.state import PartialState
    importlib.import_module(f"accelerate.test_utils.scripts.{name}").main()
    state = PartialState()
    return state.num_processes, state.process_index, str(state.distributed_type).split(".")[-1]
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return DEFINE


@pytest.mark.parametrize("script", ["test_ops", "test_sync", "test_script"])
def test_upstream_script_passes_with_every_rank_in_a_world_of_two(kernel: Kernel, script: str) -> None:
    run = kernel.execute(f"nbaccel.notebook_launcher(upstream, args=({script!r},), num_processes=2, timeout=120)", timeout=150)
    assert run.status == "ok", (run.error, run.stdout[-3000:], run.stderr[-3000:])
    [result] = run.of_type("execute_result")
    assert result["content"]["data"]["text/plain"] == "[(2, 0, 'MULTI_CPU'), (2, 1, 'MULTI_CPU')]"
    assert "Num processes: 1" not in run.stdout
    if script in ("test_ops", "test_script"):  # both print the state: Accelerate's own word for it
        assert "Num processes: 2" in run.stdout
    assert kernel.children() == []
