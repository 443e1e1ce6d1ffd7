"""Many processes on gloo (2, 3 and 4 CPU ranks): every attribute, method and seed example.

All checks of `_rank_checks.CHECKS` run in one launch per world size; each test below reads what
the ranks saw. A few launches of their own cover what needs a different start: torchrun's
environment, a process group the user made, a group that disagrees with the environment.

Imports internals (state, state.data, state.split): it tests those units directly, below the public face.
"""

from __future__ import annotations

import itertools
import os
from datetime import timedelta

import pytest

from nbaccel.state.data import padding_added
from nbaccel.state.split import padded_length, shard_bounds
from tests.state import _rank_checks
from tests.state._launch import launch

WORLD_SIZES = (2, 3, 4)
pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda n: f"{n}ranks")
def world(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    """One launch per world size running every check; (num_processes, results by rank)."""
    n = request.param
    return n, launch(_rank_checks.run_all, num_processes=n)


def seen(world: tuple[int, list[dict]], check: str) -> list:
    n, results = world
    values = [r[check] for r in results]
    failed = [v for v in values if isinstance(v, str) and v.startswith("check raised")]
    assert not failed, failed
    return values


# -- attributes ------------------------------------------------------------------------------------


def test_attributes_on_every_rank(world):
    n, _ = world
    for rank, got in enumerate(seen(world, "attributes")):
        assert got.pop("repr") == (
            f"Distributed environment: MULTI_CPU  Backend: gloo\nNum processes: {n}\nProcess index: {rank}\nLocal process index: {rank}\nDevice: cpu\n"
        )
        assert got == {
            "num_processes": n,
            "process_index": rank,
            "local_process_index": rank,
            "distributed_type": "MULTI_CPU",
            "backend": "gloo",
            "device": "cpu",
            "is_main_process": rank == 0,
            "is_local_main_process": rank == 0,
            "is_last_process": rank == n - 1,
            "use_distributed": True,
            "fork_launched": True,
            "initialized": True,
            "mixed_precision": "no",
            "debug": False,
            "torch": (n, rank, "gloo"),
            "shared": True,
        }


def test_accelerator_state_on_every_rank(world):
    for got in seen(world, "accelerator_state"):
        assert got == {"same_topology": True, "mixed_precision": "no", "repr_tail": "Mixed precision type: no", "initialized": True}


# -- the seed examples -------------------------------------------------------------------------------


def test_execution_process_tutorial_runs_each_snippet_once(world):
    for rank, got in enumerate(seen(world, "tutorial_examples")):
        assert got.pop("progress_bar") == (3, "shown" if rank == 0 else "disabled")  # one bar per machine
        if rank != 0:
            assert set(got.values()) == {""}, (rank, got)
            continue
        assert got == {
            "is_local_main_process": "Accelerate is the best\n",
            "is_main_process": "pushed to the hub\n",
            "on_local_main_process": "done once per server\n",
            "on_main_process": "done once\n",
            "on_process": "done on process index 0\n",
            "on_local_process": "done on local process index 0\n",
        }


def test_reference_decorator_examples_print_what_the_seed_says(world):
    n, _ = world
    for rank, got in enumerate(seen(world, "reference_decorators")):
        assert got == {
            "on_last_process": f"Printed on process {n - 1}\n" if rank == n - 1 else "",
            "on_local_main_process": "This will be printed by process 0 only on each server.\n" if rank == 0 else "",
            "on_local_process": "Printed on process 2\n" if rank == 2 else "",
            "on_main_process": "This will be printed by process 0 only.\n" if rank == 0 else "",
            "on_process": "Printed on process 2\n" if rank == 2 else "",
        }


def test_decorated_functions_return_their_value_where_they_run_and_none_elsewhere(world):
    n, _ = world
    for rank, got in enumerate(seen(world, "decorator_values")):
        main = rank == 0
        assert got == [
            "main" if main else None,
            "main()" if main else None,
            "local_main" if main else None,
            "last" if rank == n - 1 else None,
            "p1" if rank == 1 else None,
            "lp2" if rank == 2 else None,
            None,  # process_index=7 exists nowhere
        ]


def test_split_between_processes_examples(world):
    n, _ = world
    plain = {2: [["A", "B"], ["C"]], 3: [["A"], ["B"], ["C"]], 4: [["A"], ["B"], ["C"], []]}[n]
    padded = {2: [["A", "B"], ["C", "C"]], 3: [["A"], ["B"], ["C"]], 4: [["A"], ["B"], ["C"], ["C"]]}[n]
    for rank, got in enumerate(seen(world, "split_examples")):
        assert got == {
            "partial": f"{plain[rank]}\n",
            "partial_padded": f"{padded[rank]}\n",
            "accelerator": f"{plain[rank]}\n",
            "accelerator_padded": f"{padded[rank]}\n",
        }


def test_wait_for_everyone_example(world):
    results = seen(world, "wait_example")
    main_wakes = results[0]["started"] + _rank_checks.SLEEP_S
    for rank, got in enumerate(results):
        waiting = "" if rank == 0 else "I'm waiting for the main process to finish its sleep...\n"
        assert got["output"] == waiting + "Everyone is here\n"
        assert got["passed"] >= main_wakes - 0.02, "a rank passed the barrier before the main process woke"


@pytest.mark.parametrize("kind", ["main", "local"])
def test_first_examples_run_the_leader_first(world, kind):
    results = [r[kind] for r in seen(world, "first_examples")]
    for rank, got in enumerate(results):
        assert got["output"] == f"This will be printed by process {rank}\n"
        if rank:
            assert got["entered"] >= results[0]["left"] - 0.02, f"rank {rank} entered before process 0 left"


# -- more than the seeds: edge cases and exception safety --------------------------------------------


def check_split(pieces: list, data: list, n: int, pad: bool) -> None:
    """Pieces tile ``data`` in order; padding repeats its last element up to the longest piece."""
    kept = []
    for rank, piece in enumerate(pieces):
        start, stop = shard_bounds(len(data), n, rank)
        kept += piece[: stop - start]
        if pad:
            assert len(piece) == padded_length(len(data), n)
            assert all(x == data[-1] for x in piece[stop - start :])
        else:
            assert len(piece) == stop - start
    assert kept == data


def test_split_between_processes_edge_cases(world):
    n, _ = world
    got = seen(world, "split_pieces")
    unwrap = {"tuple": lambda v: v[1], "array": lambda v: v[1]}
    column = {name: [unwrap[r[name][0]](r[name]) if isinstance(r[name], tuple) else r[name] for r in got] for name in got[0]}
    check_split(column["range7"], list(range(7)), n, pad=False)
    check_split(column["range7_padded"], list(range(7)), n, pad=True)
    check_split(column["tuple_padded"], list("abcde"), n, pad=True)
    assert all(r["tuple_padded"][0] == "tuple" for r in got), "a tuple's pieces are tuples"
    check_split(column["tensor_padded"], list(range(5)), n, pad=True)
    check_split(column["matrix"], [[2 * i, 2 * i + 1] for i in range(5)], n, pad=False)
    check_split(column["two_items"], ["a", "b"], n, pad=False)
    check_split(column["two_items_padded"], ["a", "b"], n, pad=True)
    assert column["empty"] == column["empty_padded"] == [[]] * n
    dict_pieces = [r["dict_padded"] for r in got]
    check_split([d["prompt"] for d in dict_pieces], [f"p{i}" for i in range(5)], n, pad=True)
    check_split([d["ids"][1] for d in dict_pieces], list(range(5)), n, pad=True)
    check_split([d["meta"]["n"][1] for d in dict_pieces], list(range(5)), n, pad=True)
    assert column["dict_untouched"] == [True] * n
    assert all(s.startswith("TypeError: split_between_processes cannot split inputs='ABC' of type str") for s in column["str"])
    assert all(s.startswith("ValueError: split_between_processes needs every value") for s in column["unequal_dict"])


@pytest.mark.parametrize("kind", ["main", "local"])
def test_an_exception_in_the_leading_process_releases_the_others(world, kind):
    for rank, got in enumerate(r[kind] for r in seen(world, "first_failures")):
        assert got["seconds"] < 10, f"rank {rank} waited {got['seconds']:.1f} s"
        if rank == 0:
            assert got["outcome"] == "ValueError: download failed"
        else:
            leader = "the main process" if kind == "main" else "a local main process"
            assert got["outcome"].startswith(f"FirstProcessFailedError: {leader} raised an exception inside")
            assert f"so process {rank} does not run the block" in got["outcome"]


def test_print_set_device_and_destroy_process_group(world):
    n, _ = world
    for rank, got in enumerate(seen(world, "other_methods")):
        assert got == {
            "print": "printed once per machine\n" if rank == 0 else "",
            "default_alive": True,  # fork launched: destroy_process_group() leaves it to the launcher
            "subgroup_sum": float(n),
            "subgroup_alive": False,  # an explicit group is destroyed
            "device": "cpu",
        }


def test_prepared_loader_shards_the_main_processs_order(world):
    n, _ = world
    results = seen(world, "sharded_loader")
    everyone = results[0]["all_batches"]
    assert all(r["all_batches"] == everyone for r in results)
    assert [r["batches"] for r in results] == everyone
    steps = len(everyone[0])
    assert all(len(batches) == steps == r["len"] for batches, r in zip(everyone, results, strict=True))
    flat = [x for step in range(steps) for rank in range(n) for x in everyone[rank][step]]
    extra = padding_added(11, 2, False, n)
    assert sorted(flat[:11]) == list(range(11)), "every sample once, in one order shared by all ranks"
    assert flat[11:] == flat[:extra], "padding repeats the start of the order"
    assert flat[:11] != list(range(11)), "the loader was meant to shuffle"
    for r in results:
        assert r["ends"] == [False] * (steps - 1) + [True]
        assert r["remainders"] == [extra] * steps


def test_ddp_gradient_accumulation_equals_one_larger_batch(world):
    results = seen(world, "ddp_accumulation")
    for got in results:
        assert got["syncs"] == [False, False, True, False, False, True]
        assert got["ends"] == [False] * 5 + [True]
        for accumulated, large, single in zip(got["accumulated"], got["large_batch"], got["one_process"], strict=True):
            for a, b, c in zip(accumulated, large, single, strict=True):
                assert a == pytest.approx(b, abs=1e-5) and a == pytest.approx(c, abs=1e-5)
    first = [got["first_micro_grad"] for got in results]
    assert any(a != b for a, b in itertools.combinations(first, 2)), "gradients were all-reduced inside no_sync"


def test_gradient_state_at_the_end_of_an_uneven_dataloader(world):
    n, _ = world
    for got in seen(world, "end_of_uneven_dataloader"):
        # 4n+1 samples, batch 2 per rank: two full steps, then 1 sample padded to n (n-1 extra).
        assert got == {
            "seen": [(2, False, n - 1, False), (2, False, n - 1, True), (1, True, n - 1, True)],
            "remainder_after": -1,
        }


# -- launches of their own ----------------------------------------------------------------------------


def torchrun_style() -> dict:
    """No nbaccel variables (as under torchrun): the state still finds the ranks and owns teardown."""
    for name in ("NBACCEL_FORK_LAUNCHED", "FORK_LAUNCHED", "NBACCEL_DEVICE_TYPE", "ACCELERATE_USE_CPU"):
        os.environ.pop(name, None)
    import torch
    import torch.distributed as dist

    from nbaccel import InitProcessGroupKwargs, PartialState

    kwargs = InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=20)).to_kwargs()
    state = PartialState(**kwargs)
    total = torch.tensor([state.process_index + 1.0])
    dist.all_reduce(total)
    try:
        PartialState(timeout=timedelta(seconds=5))
        changed = "no error"
    except ValueError as exc:
        changed = str(exc)
    seen = {
        "type": state.distributed_type.value,
        "n": state.num_processes,
        "index": state.process_index,
        "fork_launched": state.fork_launched,
        "sum": total.item(),
        "changed_kwargs": changed,
    }
    state.wait_for_everyone()
    state.destroy_process_group()  # not fork launched: really destroys
    seen["initialized_after_destroy"] = dist.is_initialized()
    return seen


def test_torchrun_style_environment_with_init_kwargs():
    got = launch(torchrun_style, num_processes=2)
    for rank, g in enumerate(got):
        assert g.pop("changed_kwargs").startswith("PartialState was already set up with init_process_group arguments")
        assert g == {"type": "MULTI_CPU", "n": 2, "index": rank, "fork_launched": False, "sum": 3.0, "initialized_after_destroy": False}


def user_group() -> dict:
    """The user called init_process_group first: the state uses that group and refuses new kwargs."""
    import torch.distributed as dist

    from nbaccel import PartialState

    dist.init_process_group("gloo")
    world = dist.group.WORLD
    try:
        PartialState(timeout=timedelta(seconds=5))
        refused = "no error"
    except ValueError as exc:
        refused = str(exc)
    state = PartialState()
    state.wait_for_everyone()
    return {
        "refused": refused,
        "same_group": dist.group.WORLD is world,
        "n": state.num_processes,
        "index": state.process_index,
        "backend": state.backend,
        "type": state.distributed_type.value,
    }


def test_a_group_the_user_created_is_used():
    for rank, got in enumerate(launch(user_group, num_processes=2)):
        assert got.pop("refused").startswith("torch.distributed is already initialised (backend 'gloo', world size 2)")
        assert got == {"same_group": True, "n": 2, "index": rank, "backend": "gloo", "type": "MULTI_CPU"}


def swapped_group() -> str:
    """A group whose ranks disagree with RANK: the state must refuse it rather than mislabel ranks."""
    import torch.distributed as dist

    from nbaccel import PartialState

    dist.init_process_group("gloo", rank=1 - int(os.environ["RANK"]), world_size=2)
    try:
        PartialState()
        return "no error"
    except ValueError as exc:
        return str(exc)


def test_a_group_that_disagrees_with_the_environment_is_refused():
    for rank, message in enumerate(launch(swapped_group, num_processes=2)):
        assert message.startswith(f"The process group has world size 2 and rank {1 - rank}, but the environment says WORLD_SIZE=2 and RANK={rank}")


def print_once() -> None:
    from nbaccel import PartialState

    PartialState().print("Accelerate is the best")


def test_state_print_reaches_the_notebook_once(capsys):
    launch(print_once, num_processes=2)
    out = capsys.readouterr().out
    assert "[rank 0] Accelerate is the best" in out and "[rank 1]" not in out


def two_machines() -> dict:
    """4 ranks posing as 2 machines of 2 processes (as a 2-node launch sets LOCAL_RANK)."""
    import time

    rank = int(os.environ["RANK"])
    os.environ.update(LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", NODE_RANK=str(rank // 2), GROUP_RANK=str(rank // 2))
    from nbaccel import PartialState
    from tests.state._rank_checks import printed

    state = PartialState()

    @state.on_local_main_process
    def once_per_server() -> None:
        print("This will be printed by process 0 only on each server.")

    @state.on_local_process(local_process_index=1)
    def local_one() -> None:
        print(f"Printed on process {state.local_process_index}")

    seen = {
        "local_index": state.local_process_index,
        "is_local_main": state.is_local_main_process,
        "is_main": state.is_main_process,
        "on_local_main_process": printed(once_per_server),
        "on_local_process": printed(local_one),
        "print": printed(lambda: state.print("once per machine")),
    }
    with state.local_main_process_first():
        seen["entered"] = time.time()
        if state.is_local_main_process:
            time.sleep(0.2)
        seen["left"] = time.time()
    try:
        with state.local_main_process_first():
            if state.process_index == 2:  # the second machine's leader fails
                raise OSError("disk full")
            seen["failure"] = "ran the block"
    except Exception as exc:
        seen["failure"] = type(exc).__name__
    return seen


def test_two_machines_have_a_local_main_process_each():
    got = launch(two_machines, num_processes=4)
    for rank, g in enumerate(got):
        leader = rank % 2 == 0
        assert (g["local_index"], g["is_local_main"], g["is_main"]) == (rank % 2, leader, rank == 0)
        assert g["on_local_main_process"] == ("This will be printed by process 0 only on each server.\n" if leader else "")
        assert g["on_local_process"] == ("" if leader else "Printed on process 1\n")
        assert g["print"] == ("once per machine\n" if leader else "")
        if not leader:
            assert g["entered"] >= got[rank - 1]["left"] - 0.02, f"rank {rank} entered before its machine's leader left"
    assert [g["failure"] for g in got] == ["ran the block", "FirstProcessFailedError", "OSError", "FirstProcessFailedError"]


def under_accelerate_debug_launcher() -> None:
    """Accelerate's debug_launcher creates the group itself (FileStore) and sets WORLD_SIZE but no RANK."""
    import torch.distributed as dist

    from nbaccel import PartialState

    state = PartialState()
    assert (state.num_processes, state.process_index) == (dist.get_world_size(), dist.get_rank()) == (2, dist.get_rank())
    assert state.distributed_type == "MULTI_CPU" and state.fork_launched
    assert state.local_process_index == state.process_index
    state.wait_for_everyone()
    state.destroy_process_group()  # fork launched: left to the launcher


def test_state_under_accelerates_debug_launcher():
    accelerate = pytest.importorskip("accelerate")
    accelerate.debug_launcher(under_accelerate_debug_launcher, num_processes=2)


# -- a launched rank alone (issue 14, item 3) -------------------------------------------------------


def ddp_alone(request_cpu: str) -> dict:
    """One launched CPU rank: nbaccel's state (and Accelerate's) make a group of one; DDP works."""
    import os

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from nbaccel import PartialState
    from nbaccel.state import reset_all_states

    if request_cpu == "none":  # a CPU launch that did not ask for the CPU: no group, as in Accelerate
        for name in ("ACCELERATE_USE_CPU", "NBACCEL_DEVICE_TYPE"):
            os.environ.pop(name)
    state = PartialState(cpu=request_cpu == "argument")
    seen = {
        "type": state.distributed_type.value,
        "backend": state.backend,
        "n": state.num_processes,
        "group": dist.is_initialized(),
        "use_distributed": state.use_distributed,
    }
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(nn.Linear(2, 1))
        model(torch.ones(3, 2)).sum().backward()  # the gradients' all-reduce, on the group of one
        seen["grad_shape"] = tuple(model.module.weight.grad.shape)
        state.wait_for_everyone()
    accelerate = __import__("importlib").util.find_spec("accelerate")
    if accelerate is not None and request_cpu != "none":
        from accelerate import PartialState as AcceleratePartialState

        reset_all_states()
        theirs = AcceleratePartialState(cpu=True)
        seen["accelerate"] = (str(theirs.distributed_type).split(".")[-1], theirs.backend, theirs.num_processes)
    return seen


@pytest.mark.parametrize("request_cpu", ["launch", "argument", "none"])
def test_a_launched_rank_alone_gets_a_group_of_one_as_under_accelerate(request_cpu):
    [got] = launch(ddp_alone, args=(request_cpu,), num_processes=1)
    if request_cpu == "none":
        assert got == {"type": "NO", "backend": None, "n": 1, "group": False, "use_distributed": False}
        return
    accelerate_saw = got.pop("accelerate", None)
    assert got == {"type": "MULTI_CPU", "backend": "gloo", "n": 1, "group": True, "use_distributed": False, "grad_shape": (1, 2)}
    if accelerate_saw is not None:
        assert accelerate_saw == ("MULTI_CPU", "gloo", 1)
