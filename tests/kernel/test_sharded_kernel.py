"""Sharded models through the real magics in a real ipykernel: push --shard, status, pull, save, load, bad input.

The notebook builds a model, shards it onto the workers, trains it in a cell, saves it, reloads
it on another number of workers and pulls it back: every step is a magic, as a user types it.
"""

from __future__ import annotations

import psutil
import pytest

from tests.kernel.test_pool_magic_kernel import ok, usage_error
from tests.kernel_harness import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(150)]

SETUP = """\
%load_ext nbaccel
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))
x = torch.linspace(-1, 1, 64).reshape(4, 16)
expected = model(x).detach()
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return SETUP


@pytest.mark.slow
def test_a_model_sharded_from_the_notebook_trains_saves_reloads_on_three_and_pulls_back(kernel: Kernel, tmp_path) -> None:
    folder = tmp_path / "ckpt"
    try:
        ok(kernel, "%distributed start -n 2")
        ok(kernel, "%distributed push model --shard")
        run = ok(kernel, "%%distributed -o outs\nprint(type(model[0].weight).__name__, tuple(model[0].weight.to_local().shape))\nmodel(x).detach()")
        # A cell sampled (a second or more under load) ends with each rank's figures: not its output.
        printed = [line for line in run.stdout.splitlines() if not line.startswith("nbaccel: rank ")]
        assert sorted(printed) == ["[rank 0] DTensor (5, 16)", "[rank 1] DTensor (4, 16)"]
        assert ok(kernel, "print(all(torch.allclose(o, expected) for o in outs))").stdout == "True\n"
        status = ok(kernel, "%distributed status").shown.splitlines()  # the displayed table's text
        assert "sharded (held / full)" in status[0], status
        assert "model 420 B / 732 B" in status[1] and "model 312 B / 732 B" in status[2], status
        ok(kernel, "%%distributed\nopt = torch.optim.SGD(model.parameters(), lr=0.5)\nmodel(x).pow(2).mean().backward()\nopt.step()\nafter = model(x).detach()")
        saved = ok(kernel, f"%distributed save {folder} model opt")
        assert saved.stdout == f"nbaccel: saved model, opt to {folder} on 2 ranks\n"
        ok(kernel, "%distributed pull after -o trained_out")
        ok(kernel, "%distributed pull model -o trained")
        assert ok(kernel, "print(sorted(trained), type(trained['0.weight']).__name__, tuple(trained['0.weight'].shape))").stdout == (
            "['0.bias', '0.weight', '2.bias', '2.weight'] Tensor (9, 16)\n"
        )
        ok(kernel, "%distributed stop")
        ok(kernel, "%distributed start -n 3")
        ok(kernel, "torch.manual_seed(1)\nother = torch.nn.Sequential(torch.nn.Linear(16, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))")
        ok(kernel, "%distributed push other --shard")
        ok(kernel, "%%distributed\nmodel = other\nopt = torch.optim.SGD(model.parameters(), lr=0.5)")
        loaded = ok(kernel, f"%distributed load {folder} model opt")
        assert loaded.stdout == f"nbaccel: loaded model, opt from {folder} onto 3 ranks\n"
        ok(kernel, "%%distributed -o reloaded\nmodel(x).detach()")
        ok(kernel, "%distributed pull model -o back")
        check = "plain = torch.nn.Sequential(torch.nn.Linear(16, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))\nplain.load_state_dict(back)\n"
        check += "print(all(torch.allclose(o, trained_out) for o in reloaded), torch.allclose(plain(x), trained_out))"
        assert ok(kernel, check).stdout == "True True\n"
    finally:
        kernel.execute("%distributed stop")
    assert psutil.Process(kernel.pid).children() == []


def test_bad_input_is_a_usage_error_naming_it_and_the_workers_stay(kernel: Kernel, tmp_path) -> None:
    try:
        ok(kernel, "%distributed start -n 2")
        assert "cannot push 'x' with shard=True: a Tensor is not a torch.nn.Module" in usage_error(kernel.execute("%distributed push x --shard"))
        assert "mesh (3,) does not fit the 2 workers" in usage_error(kernel.execute("%distributed push model --shard --mesh 3"))
        assert "--mesh shapes a sharded push" in usage_error(kernel.execute("%distributed push model --mesh 2"))
        assert "expected a mesh shape such as 4 or 2x2, got '2y2'" in usage_error(kernel.execute("%distributed push model --shard --mesh 2y2"))
        missing = usage_error(kernel.execute(f"%distributed load {tmp_path}/none model"))
        assert missing == f"%distributed load: cannot load from '{tmp_path}/none': it does not exist; give the folder that %distributed save wrote"
        assert "name 'nothing' is not defined on this rank" in usage_error(kernel.execute(f"%distributed save {tmp_path}/c nothing"))
        (tmp_path / "file").write_text("x")
        assert f"cannot save to '{tmp_path}/file/c'" in usage_error(kernel.execute(f"%distributed save {tmp_path}/file/c model"))
        assert "'nothing' is not a function in the notebook" in usage_error(kernel.execute("%distributed push model --shard nothing"))
        recipe = "def per_layer(module, mesh):\n    from torch.distributed.fsdp import fully_shard\n    fully_shard(module[0], mesh=mesh)\n    fully_shard(module, mesh=mesh)"
        ok(kernel, recipe)
        ok(kernel, "%distributed push model --shard per_layer")  # a notebook function shards it on each rank
        run = ok(kernel, "%%distributed -o outs\ntype(model[0]).__name__, type(model[0].weight).__name__")
        assert "('FSDPLinear', 'DTensor')" in run.of_type("execute_result")[0]["content"]["data"]["text/plain"]
        ok(kernel, "%distributed push model")
        ok(kernel, f"%distributed save {tmp_path}/plain model")  # an unsharded module saves too
        assert ok(kernel, "%%distributed\n1 + 1").of_type("execute_result")[0]["content"]["data"]["text/plain"] == "2"
    finally:
        kernel.execute("%distributed stop")
