"""Sharded models on persistent workers through the real WorkerPool: pull gathers, push shards, DCP save/load.

Real forks, a real gloo process group, FSDP2's ``fully_shard``, tensor parallelism and
torch.distributed.checkpoint on CPU ranks. Imports internals (pool.sharded, rank.checkpoint, rank.gather):
it tests those units directly, below the public face.
"""

from __future__ import annotations

import os

import pytest
import torch

import nbaccel
from nbaccel import start_workers
from nbaccel.pool.sharded import GatherFetch, shard_tasks
from nbaccel.rank.gather import shard_bounds

pytestmark = pytest.mark.timeout(120)


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.ReLU(), torch.nn.Linear(9, 5))  # 9 and 5 rows: uneven over 2, 3 and 4 ranks
    model.register_buffer("scale", torch.tensor([1.5]))
    return model


INPUT = torch.linspace(-1, 1, 36).reshape(3, 12)


def shard_in_cell(namespace: dict) -> None:
    """What a cell does: build the model, ``fully_shard`` it, train one Adam step."""
    from torch.distributed.fsdp import fully_shard

    model = namespace["make_model"]()
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(INPUT).pow(2).mean().backward()
    optimizer.step()
    namespace.update(model=model, optimizer=optimizer, weight=model[0].weight, parts={"w": model[2].weight, "step": 1})


def forward(namespace: dict) -> torch.Tensor:
    with torch.no_grad():
        return namespace["model"](INPUT).detach() * namespace["model"].scale


def reference(namespace: dict) -> dict:
    """On the ranks: torch's own gathered state dicts (full_state_dict on rank 0's CPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(namespace["model"], options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def plain_leaves(value: object) -> list:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in plain_leaves(item)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in plain_leaves(item)]
    return [value]


@pytest.mark.slow  # the first to import FSDP2, DCP and Adam on the ranks: 5 to 25 s on this loaded machine
def test_pull_of_a_sharded_model_optimizer_tensor_and_dict_gathers_full_plain_tensors() -> None:
    with start_workers(2) as pool:
        pool.push(make_model=make_model)
        pool.run_task(shard_in_cell)
        expected = pool.run_task(reference)[0]
        full = pool.pull("model")
        assert list(full) == list(expected)
        for key, tensor in full.items():
            assert type(tensor) is torch.Tensor and torch.equal(tensor, expected[key]), key  # never a DTensor, never a shard
        via_gather = pool.run_task(GatherFetch("model", writer=1), ranks=[0, 1])[1]  # the path for ranks on other nodes
        assert list(via_gather) == list(expected) and all(torch.equal(via_gather[k], v) for k, v in expected.items())
        plain = make_model()
        plain.load_state_dict(full)  # a pulled module is its full state dict: it loads into the unsharded model
        assert torch.allclose(plain(INPUT) * plain.scale, pool.run_task(forward)[0])
        weight = pool.pull("weight")
        assert type(weight) is torch.Tensor and weight.shape == (9, 12) and torch.equal(weight, expected["0.weight"])
        parts = pool.pull("parts", rank=1)
        assert parts["step"] == 1 and type(parts["w"]) is torch.Tensor and torch.equal(parts["w"], expected["2.weight"])
        optim = pool.pull("optimizer")
        assert {k: tuple(v["exp_avg"].shape) for k, v in optim["state"].items()} == {0: (9, 12), 1: (9,), 2: (5, 9), 3: (5,)}
        assert all(type(leaf) is not type(pool) and "DeviceMesh" not in type(leaf).__name__ for leaf in plain_leaves(optim))
        loaded = torch.optim.Adam(plain.parameters(), lr=0.1)
        loaded.load_state_dict(optim)  # the layout of a plain optimizer's state_dict
        assert pool.run(lambda: 1 + 1) == [2, 2]


def _peak_growth(reset: bool) -> int:
    """Bytes of resident memory above the level at the last reset (VmHWM, reset by clear_refs 5)."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    hwm, rss = (int(fields[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS"))
    if reset:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return rss
    return hwm


def big_sharded(namespace: dict) -> int:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 512, bias=False) for _ in range(16)))  # 16 parameters of 2 MiB: 32 MiB
    fully_shard(model)
    namespace["big"] = model
    return _peak_growth(reset=True)


def gather_peak(namespace: dict) -> int:
    from nbaccel.rank.gather import gather

    gather(namespace["big"], writer=0)  # once first: malloc's arenas (gloo's threads have their own) grow on a first gather, then are reused
    base = _peak_growth(reset=True)
    namespace["_kept"] = gather(namespace["big"], writer=0)  # rank 0 holds memfds, not the tensors
    return _peak_growth(reset=False) - base


def test_pull_streams_one_parameter_at_a_time_on_the_ranks_and_the_kernel() -> None:
    model_bytes = 16 * 1024 * 512 * 4
    with start_workers(2) as pool:
        pool.push(_peak_growth=_peak_growth)
        pool.run_task(big_sharded)
        pool.pull("big")  # once first: malloc's arenas (gloo's threads have their own) grow on a first gather, then are reused
        bases = pool.run_task(lambda ns: _peak_growth(reset=True))
        base = _peak_growth(reset=True)
        full = pool.pull("big")  # every rank writes its shards into the kernel's shared region
        assert sum(float(t.sum()) for t in full.values()) != 0  # every page read here: the kernel's peak counts them
        kernel_growth = _peak_growth(reset=False) - base
        ranks_growth = [peak - b for peak, b in zip(pool.run_task(lambda ns: _peak_growth(reset=False)), bases, strict=True)]
        assert sum(t.nbytes for t in full.values()) == model_bytes
        assert kernel_growth <= 1.5 * model_bytes, (kernel_growth, model_bytes)
        # One full parameter is 1/16 of the model; malloc's slack adds a little: gathering the
        # whole model (torch's full_state_dict) would add all 32 MiB on rank 0.
        assert all(g < model_bytes / 2 for g in ranks_growth), (ranks_growth, model_bytes)
        growth = pool.run_task(gather_peak)  # the path for ranks on another node: one full tensor at a time, into memfds
        assert all(g < model_bytes / 2 for g in growth), (growth, model_bytes)


def test_push_shard_gives_each_rank_its_slices_and_the_same_outputs() -> None:
    model = make_model()
    tasks = shard_tasks("model", model, 3)
    for fqn, param in model.named_parameters():  # every rank receives only its slice: together, each parameter once
        assert sum(tasks[r].shards[fqn].numel() for r in range(3)) == param.numel()
        assert all(tasks[r].skeleton[0].weight.device.type == "meta" for r in range(3))
    with start_workers(3) as pool:
        pool.push(model=model, shard=True)
        shapes = pool.run_task(lambda ns: tuple(ns["model"][0].weight.to_local().shape))
        assert shapes == [(3, 12), (3, 12), (3, 12)]
        assert all(torch.allclose(out, model(INPUT) * 1.5) for out in pool.run_task(forward))
        held = [s.shards["model"] for s in pool.status()]
        full = sum(p.nbytes for p in model.parameters())
        assert all(f == full for _, f in held) and sum(h for h, _ in held) == full
        pulled = pool.pull("model")
        assert all(torch.equal(pulled[k], v) for k, v in model.state_dict().items())


def test_push_shard_on_a_2d_mesh_is_hsdp() -> None:
    model = make_model()
    with start_workers(4) as pool:
        pool.push(model=model, shard=True, mesh=(2, 2))
        placements = pool.run_task(lambda ns: str(ns["model"][0].weight.placements))
        assert placements == ["(Replicate(), Shard(dim=0))"] * 4
        assert all(torch.allclose(out, model(INPUT) * 1.5) for out in pool.run_task(forward))


def test_push_shard_refuses_a_non_module_and_a_mesh_that_does_not_fit() -> None:
    with start_workers(2) as pool:
        with pytest.raises(TypeError, match="cannot push 'data' with shard=True: a list is not a torch.nn.Module"):
            pool.push(data=[1, 2], shard=True)
        with pytest.raises(ValueError, match=r"mesh \(3,\) does not fit the 2 workers"):
            pool.push(model=make_model(), shard=True, mesh=(3,))
        assert pool.run_task(lambda ns: "data" in ns or "model" in ns) == [False, False]


def save_state(namespace: dict) -> None:
    namespace.update(step=7, config={"lr": 0.1, "name": "tiny"}, table=torch.arange(6.0))


def fresh_sharded(namespace: dict) -> None:
    """A model of the same shape with other weights, sharded over these ranks, and its optimizer."""
    from torch.distributed.fsdp import fully_shard

    model = namespace["make_model"](seed=5)
    fully_shard(model)
    namespace.update(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.1), table=torch.zeros(6))


@pytest.mark.slow
@pytest.mark.parametrize(("saved_on", "loaded_on"), [(2, 3)])
def test_a_checkpoint_saved_on_n_ranks_loads_on_m_with_equal_outputs(tmp_path, saved_on: int, loaded_on: int) -> None:
    folder = tmp_path / "ckpt"
    with start_workers(saved_on) as pool:
        pool.push(make_model=make_model)
        pool.run_task(shard_in_cell)
        pool.run_task(save_state)
        before = pool.run_task(forward)[0]
        optim_before = pool.pull("optimizer")
        assert pool.save(folder, "model", "optimizer", "step", "config", "table") == str(folder)
    assert (folder / ".metadata").is_file() and [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no partial folder left
    with start_workers(loaded_on) as pool:
        pool.push(make_model=make_model)
        pool.run_task(fresh_sharded)
        assert not torch.allclose(pool.run_task(forward)[0], before)
        pool.load(folder, "model", "optimizer", "step", "config", "table")
        assert all(torch.allclose(out, before) for out in pool.run_task(forward))
        assert pool.run_task(lambda ns: (ns["step"], ns["config"]["name"], ns["table"].tolist())) == [(7, "tiny", list(map(float, range(6))))] * loaded_on
        optim_after = pool.pull("optimizer")
        for index, state in optim_before["state"].items():
            assert torch.allclose(state["exp_avg"], optim_after["state"][index]["exp_avg"])


def make_interrupting(namespace: dict) -> None:
    class Interrupting:
        def __reduce__(self) -> tuple:
            raise KeyboardInterrupt("stop pressed while saving")

    namespace["boom"] = Interrupting()


def test_save_is_atomic_and_bad_paths_fail_at_once_naming_them(tmp_path) -> None:
    folder = tmp_path / "ckpt"
    with start_workers(2) as pool:
        pool.push(model=make_model(), shard=True)
        pool.save(folder, "model")
        pool.push(unpicklable=(lambda: 1,))  # cloudpickle carried it; DCP's torch.save cannot
        with pytest.raises(nbaccel.CheckpointError, match=f"saving to '{folder}' failed, and nothing was saved there"):
            pool.save(folder, "model", "unpicklable")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # the failed save left nothing, the old one is whole
        pool.run_task(make_interrupting)
        with pytest.raises(nbaccel.CheckpointError, match=f"saving to '{folder}' failed"):
            pool.save(folder, "model", "boom")  # a KeyboardInterrupt in the middle of DCP's write
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
        pool.load(folder, "model")
        afile = tmp_path / "afile"
        afile.write_text("x")
        with pytest.raises(nbaccel.CheckpointError, match=f"cannot save to '{afile}/ckpt'"):
            pool.save(afile / "ckpt", "model")
        with pytest.raises(nbaccel.CheckpointError, match=f"cannot load from '{tmp_path}/nowhere': it does not exist"):
            pool.load(tmp_path / "nowhere", "model")
        with pytest.raises(nbaccel.CheckpointError, match="holds no checkpoint"):
            pool.load(tmp_path, "model")
        other = torch.nn.Sequential(torch.nn.Linear(12, 4))
        pool.push(model=other, shard=True)
        with pytest.raises(
            nbaccel.CheckpointError,
            match=r"checkpoint of something else.*in the checkpoint but not here: model.scale, model.2.weight.*shapes differ: model.0.weight: saved \(9, 12\), here \(4, 12\)",
        ):
            pool.load(folder, "model")
        assert pool.run(lambda: 1 + 1) == [2, 2]  # refused on every rank in step: the workers stay


def tensor_parallel(namespace: dict) -> None:
    """The pushed plain model, tensor parallel over tp and FSDP over dp, on a (dp=2, tp=2) mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = namespace["model"]
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    namespace["tp_mesh"] = (tuple(model[0].weight.device_mesh.shape), len(model[0].weight.placements), tuple(model[0].weight.to_local().shape))


def make_even_model(seed: int = 0) -> torch.nn.Module:
    """Sizes that split evenly over tp and then dp (torch's FSDP over TP's shards needs it)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model.register_buffer("scale", torch.tensor([1.5]))
    return model


def tp_recipe(model: torch.nn.Module, mesh: object) -> None:
    """A push's recipe: tensor parallel over the mesh's tp, then FSDP over its dp."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])


def test_push_with_a_tensor_parallel_recipe_on_a_2d_mesh() -> None:
    model = make_even_model()
    with start_workers(4) as pool:
        pool.push(model=model, shard=tp_recipe, mesh=(2, 2))
        shapes = pool.run_task(lambda ns: (tuple(ns["model"][0].weight.to_local().shape), tuple(ns["model"][2].weight.to_local().shape)))
        assert shapes == [((2, 12), (2, 4))] * 4  # 0.weight: rows over tp then dp; 2.weight: columns over tp, rows over dp
        assert all(torch.allclose(out, model(INPUT) * 1.5, atol=1e-6) for out in pool.run_task(forward))
        pulled = pool.pull("model")
        assert all(torch.equal(pulled[k], v) for k, v in model.state_dict().items())
        with pytest.raises(TypeError, match="shard='tp' is neither True nor a callable"):
            pool.push(model=model, shard="tp")


@pytest.mark.slow
def test_tensor_parallel_on_a_2d_mesh_pulls_saves_and_loads_on_two_ranks(tmp_path) -> None:
    model = make_even_model()
    with start_workers(4) as pool:
        pool.push(model=model)
        pool.run_task(tensor_parallel)
        assert pool.run_task(lambda ns: ns["tp_mesh"])[0] == ((2, 2), 2, (2, 12))  # 8 rows over tp, then over dp
        assert all(torch.allclose(out, model(INPUT) * 1.5, atol=1e-6) for out in pool.run_task(forward))
        pulled = pool.pull("model")
        assert all(type(pulled[k]) is torch.Tensor and torch.equal(pulled[k], v) for k, v in model.state_dict().items())
        pool.save(tmp_path / "tp", "model")
    with start_workers(2) as pool:  # 4 -> 2: from (dp, tp) to FSDP over 2
        pool.push(model=make_even_model(seed=3), shard=True)
        pool.load(tmp_path / "tp", "model")
        assert all(torch.allclose(out, model(INPUT) * 1.5, atol=1e-6) for out in pool.run_task(forward))


def test_load_of_a_name_not_on_the_ranks_brings_the_whole_value(tmp_path) -> None:
    with start_workers(2) as pool:
        pool.run_task(save_state)
        pool.save(tmp_path / "c", "step", "config")
        pool.run_task(lambda ns: [ns.pop(k) for k in ("step", "config")] and None)
        pool.load(tmp_path / "c", "step", "config")
        assert pool.run_task(lambda ns: (ns["step"], ns["config"])) == [(7, {"lr": 0.1, "name": "tiny"})] * 2
        with pytest.raises(nbaccel.CheckpointError, match="not in the checkpoint: nothing"):
            pool.load(tmp_path / "c", "nothing")
    assert os.listdir(tmp_path) == ["c"]


def nested_tensors(namespace: dict) -> None:
    namespace["stats"] = {"mean": torch.arange(6.0).reshape(2, 3), "parts": [torch.ones(2, dtype=torch.int64), {"deep": torch.zeros(1)}], "shape": (2, 3)}


def test_load_of_a_name_not_on_the_ranks_rebuilds_its_tensors_lists_and_leaves(tmp_path) -> None:
    """DCP keeps tensors (with their dtype), lists of tensors and other leaves apart: all come back as saved."""
    with start_workers(2) as pool:
        pool.run_task(nested_tensors)
        pool.save(tmp_path / "n", "stats")
        pool.run_task(lambda ns: ns.pop("stats") and None)
        pool.load(tmp_path / "n", "stats")
        for stats in pool.run_task(lambda ns: ns["stats"]):
            assert torch.equal(stats["mean"], torch.arange(6.0).reshape(2, 3)) and stats["shape"] == (2, 3)
            ones, deep = stats["parts"]
            assert ones.dtype == torch.int64 and torch.equal(ones, torch.ones(2, dtype=torch.int64)) and torch.equal(deep["deep"], torch.zeros(1))


@pytest.mark.parametrize("size", [1, 5, 8, 9, 13])
@pytest.mark.parametrize("parts", [2, 3, 4])
def test_a_ranks_block_is_where_torch_chunk_puts_it(size: int, parts: int) -> None:
    """DTensor's Shard splits as torch.chunk does (some parts empty when size < parts): the pull writes each block there."""
    whole = torch.arange(size * 3).reshape(size, 3)
    chunks = list(torch.chunk(whole, parts, dim=0))
    chunks += [whole[size:]] * (parts - len(chunks))  # torch.chunk returns fewer parts; DTensor pads with empty ones
    for part, chunk in enumerate(chunks):
        shape, start = shard_bounds((size, 3), [(0, parts, part)])
        assert shape == tuple(chunk.shape) and torch.equal(whole[start[0] : start[0] + shape[0]], chunk)
