"""``%%distributed --profile`` in a real ipykernel: one-shot and on persistent workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kernel_harness import Execution, Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

UNEVEN = """import torch, torch.distributed as dist
a = torch.randn(400, 400)
t = torch.zeros(4)
for _ in range(4):
    for _ in range(25 if state.process_index == 0 else 100):
        a = torch.mm(a, a).clamp_(-1, 1)
    dist.all_reduce(t)
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "%load_ext nbaccel\nimport torch"


def ok(kernel: Kernel, code: str, **kwargs: float) -> Execution:
    run = kernel.execute(code, **kwargs)
    assert run.status == "ok", (run.error or run.reply["content"], run.stderr)
    return run


def summary_of(run: Execution) -> str:
    shown = [m["content"]["data"] for m in run.of_type("display_data") if "nbaccel-profile-summary" in m["content"]["data"].get("text/html", "")]
    assert shown, run.stdout
    return str(shown[-1]["text/plain"])


def check_traces(folder: Path) -> None:
    trace = json.loads((folder / "trace.json").read_text())
    lanes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert lanes == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        assert any(e["pid"] == rank and e.get("name") == "gloo:all_reduce" for e in trace["traceEvents"])
        assert (folder / f"rank{rank}.json").exists()


def test_a_one_shot_cell_with_profile_names_the_straggler(kernel: Kernel, tmp_path: Path) -> None:
    run = ok(kernel, f"%%distributed -n 2 --profile {tmp_path}\nstate = __import__('nbaccel').PartialState()\n{UNEVEN}", timeout=120)
    assert "rank 1 spent" in summary_of(run)
    check_traces(tmp_path)


def test_a_cell_on_workers_with_profile_names_the_straggler(kernel: Kernel, tmp_path: Path) -> None:
    ok(kernel, "%distributed start -n 2", timeout=60)
    try:
        run = ok(kernel, f"%%distributed --profile {tmp_path}\n{UNEVEN}", timeout=120)
        assert "rank 1 spent" in summary_of(run)
        check_traces(tmp_path)
    finally:
        kernel.execute("%distributed stop")
