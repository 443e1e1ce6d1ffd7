"""What each rank runs in the multi-process state tests; every check returns what it saw.

`run_all` runs every check of `CHECKS` on one rank of one launch (so each world size costs one
launch), in the same order on every rank so that their collectives match.
"""

from __future__ import annotations

import contextlib
import copy
import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch._dynamo  # DDP imports it (800 modules, ~1-3 s) on first use; import once, before the fork
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from nbaccel import (
    AcceleratorState,
    GradientAccumulationPlugin,
    GradientState,
    PartialState,
    accumulate,
    prepare_data_loader,
)

SLEEP_S = 0.3  # how long a leading process dawdles in the ordering checks


def printed(function: Callable[[], Any]) -> str:
    """What ``function`` prints to stdout (and stderr, for tqdm)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        function()
    return out.getvalue()


def attributes(state: PartialState) -> dict[str, Any]:
    again = PartialState()
    return {
        "num_processes": state.num_processes,
        "process_index": state.process_index,
        "local_process_index": state.local_process_index,
        "distributed_type": state.distributed_type.value,
        "backend": state.backend,
        "device": str(state.device),
        "is_main_process": state.is_main_process,
        "is_local_main_process": state.is_local_main_process,
        "is_last_process": state.is_last_process,
        "use_distributed": state.use_distributed,
        "fork_launched": state.fork_launched,
        "initialized": state.initialized,
        "mixed_precision": state.mixed_precision,
        "debug": state.debug,
        "torch": (dist.get_world_size(), dist.get_rank(), dist.get_backend()),
        "shared": again._state is state._state and again.process_index == state.process_index,
        "repr": repr(state),
    }


def accelerator_state(state: PartialState) -> dict[str, Any]:
    accelerator = AcceleratorState()
    return {
        "same_topology": (accelerator.num_processes, accelerator.process_index) == (state.num_processes, state.process_index),
        "mixed_precision": accelerator.mixed_precision,
        "repr_tail": repr(accelerator).splitlines()[-1],
        "initialized": accelerator.initialized,
    }


def tutorial_examples(state: PartialState) -> dict[str, str]:
    """Every snippet of the "execution process" tutorial, as printed on this rank."""
    from tqdm.auto import tqdm

    # How the bar is drawn is the launcher's business (nbaccel relays it); the snippet's part is
    # that it runs everywhere and is disabled off the local main process.
    disabled = not state.is_local_main_process
    steps = sum(1 for _ in tqdm(range(3), disable=disabled))

    def wrapped_print() -> None:
        if state.is_local_main_process:
            print("Accelerate is the best")

    def push_to_hub() -> None:
        if state.is_main_process:
            print("pushed to the hub")

    @state.on_local_main_process
    def once_per_server() -> None:
        "Something done once per server"
        print("done once per server")

    @state.on_main_process
    def once() -> None:
        print("done once")

    @state.on_process(process_index=0)
    def on_index_zero() -> None:
        "Something done on process index 0"
        print("done on process index 0")

    @state.on_local_process(local_process_idx=0)
    def on_local_index_zero() -> None:
        "Something done on process index 0 on each server"
        print("done on local process index 0")

    seen = {
        "progress_bar": (steps, "disabled" if disabled else "shown"),
        "is_local_main_process": printed(wrapped_print),
        "is_main_process": printed(push_to_hub),
        "on_local_main_process": printed(once_per_server),
        "on_main_process": printed(once),
        "on_process": printed(on_index_zero),
        "on_local_process": printed(on_local_index_zero),
    }
    state.wait_for_everyone()
    return seen


def reference_decorators(state: PartialState) -> dict[str, str]:
    """The decorator examples of the "stateful classes" reference, as printed on this rank."""

    @state.on_last_process
    def last() -> None:
        print(f"Printed on process {state.process_index}")

    @state.on_local_main_process
    def local_main() -> None:
        print("This will be printed by process 0 only on each server.")

    @state.on_local_process(local_process_index=2)
    def local_two() -> None:
        print(f"Printed on process {state.local_process_index}")

    @state.on_main_process
    def main() -> None:
        print("This will be printed by process 0 only.")

    @state.on_process(process_index=2)
    def two() -> None:
        print(f"Printed on process {state.process_index}")

    names = ("on_last_process", "on_local_main_process", "on_local_process", "on_main_process", "on_process")
    return {name: printed(f) for name, f in zip(names, (last, local_main, local_two, main, two), strict=True)}


def decorator_values(state: PartialState) -> list[Any]:
    """Bare and called forms: the value where the function runs, None elsewhere."""
    return [
        state.on_main_process(lambda: "main")(),
        state.on_main_process()(lambda: "main()")(),
        state.on_local_main_process(lambda: "local_main")(),
        state.on_last_process()(lambda: "last")(),
        state.on_process(process_index=1)(lambda: "p1")(),
        state.on_local_process(local_process_index=2)(lambda: "lp2")(),
        state.on_process(process_index=7)(lambda: "p7")(),
    ]


def split_examples(state: PartialState) -> dict[str, str]:
    """The reference's split_between_processes examples, with PartialState and AcceleratorState."""
    seen = {}
    for name, holder in (("partial", state), ("accelerator", AcceleratorState())):
        with holder.split_between_processes(["A", "B", "C"]) as inputs:
            seen[name] = printed(lambda: print(inputs))
        with holder.split_between_processes(["A", "B", "C"], apply_padding=True) as inputs:
            seen[name + "_padded"] = printed(lambda: print(inputs))
    return seen


def split_pieces(state: PartialState) -> dict[str, Any]:
    """This rank's piece of every kind of input the issue lists, and what was left of the input."""
    nested = {"prompt": ["p0", "p1", "p2", "p3", "p4"], "ids": torch.arange(5), "meta": {"n": (0, 1, 2, 3, 4)}}
    original = copy.deepcopy(nested)
    inputs = {
        "range7": (list(range(7)), False),
        "range7_padded": (list(range(7)), True),
        "tuple_padded": (tuple("abcde"), True),
        "tensor_padded": (torch.arange(5), True),
        "matrix": (np.arange(10).reshape(5, 2), False),
        "empty": ([], False),
        "empty_padded": ([], True),
        "two_items": (["a", "b"], False),
        "two_items_padded": (["a", "b"], True),
        "dict_padded": (nested, True),
    }
    pieces: dict[str, Any] = {}
    for name, (value, pad) in inputs.items():
        with state.split_between_processes(value, apply_padding=pad) as piece:
            pieces[name] = _plain(piece)
    pieces["dict_untouched"] = _plain(nested) == _plain(original)
    for name, value in (("str", "ABC"), ("unequal_dict", {"a": [1, 2], "b": [1]})):
        try:
            with state.split_between_processes(value):
                pieces[name] = "no error"
        except (TypeError, ValueError) as exc:
            pieces[name] = f"{type(exc).__name__}: {exc}"
    return pieces


def _plain(value: Any) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return ("array", value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return ("tuple", [_plain(v) for v in value])
    return value


def wait_example(state: PartialState) -> dict[str, Any]:
    """The reference's wait_for_everyone example (the main process sleeps, the others wait)."""
    started = time.time()

    def body() -> None:
        if state.is_main_process:
            time.sleep(SLEEP_S)
        else:
            print("I'm waiting for the main process to finish its sleep...")
        state.wait_for_everyone()
        print("Everyone is here")

    output = printed(body)
    return {"output": output, "started": started, "passed": time.time()}


def first_examples(state: PartialState) -> dict[str, Any]:
    """main_process_first / local_main_process_first examples, with when each rank ran the block."""
    seen: dict[str, Any] = {}
    accelerator = AcceleratorState()  # the reference shows main_process_first on the Accelerator
    for name, context, index in (
        ("main", accelerator.main_process_first, lambda: accelerator.process_index),
        ("local", state.local_main_process_first, lambda: state.local_process_index),
    ):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), context():
            entered = time.time()
            if index() == 0:
                time.sleep(SLEEP_S)
            print(f"This will be printed by process {index()}")
            left = time.time()
        seen[name] = {"output": out.getvalue(), "entered": entered, "left": left}
    return seen


def first_failures(state: PartialState) -> dict[str, Any]:
    """The leading process raises inside the block: nobody may be left waiting."""
    seen: dict[str, Any] = {}
    for name, context, leads in (
        ("main", state.main_process_first, state.is_main_process),
        ("local", state.local_main_process_first, state.is_local_main_process),
    ):
        started = time.time()
        try:
            with context():
                if leads:
                    raise ValueError("download failed")
                outcome = "ran the block"
        except Exception as exc:  # what each rank saw is the result
            outcome = f"{type(exc).__name__}: {exc}"
        seen[name] = {"outcome": outcome, "seconds": time.time() - started}
    state.wait_for_everyone()  # the group still works afterwards
    return seen


def other_methods(state: PartialState) -> dict[str, Any]:
    state.set_device()
    output = printed(lambda: state.print("printed once per machine"))
    state.destroy_process_group()  # fork launched: the launcher owns teardown, nothing happens
    default_alive = dist.is_initialized()
    subgroup = dist.new_group(list(range(state.num_processes)))
    total = torch.ones(1)
    dist.all_reduce(total, group=subgroup)
    state.destroy_process_group(subgroup)  # an explicit group is destroyed even so
    try:
        dist.get_process_group_ranks(subgroup)  # torch forgets a destroyed group's ranks
        subgroup_alive = True
    except (KeyError, RuntimeError, ValueError):
        subgroup_alive = False
    state.wait_for_everyone()
    return {
        "print": output,
        "default_alive": default_alive,
        "subgroup_sum": total.item(),
        "subgroup_alive": subgroup_alive,
        "device": str(state.device),
    }


def sharded_loader(state: PartialState) -> dict[str, Any]:
    """Each rank shuffles with its own seed; the main rank's order must win, and shards must tile it."""
    torch.manual_seed(100 + state.process_index)
    loader = prepare_data_loader(DataLoader(list(range(11)), batch_size=2, shuffle=True))
    gradient_state = GradientState()
    batches, ends, remainders = [], [], []
    for batch in loader:
        batches.append(batch.tolist())
        ends.append(gradient_state.end_of_dataloader)
        remainders.append(gradient_state.remainder)
    order = torch.tensor([x for b in batches for x in b])
    everyone = [None] * state.num_processes
    dist.all_gather_object(everyone, batches)
    return {"batches": batches, "all_batches": everyone, "ends": ends, "remainders": remainders, "len": len(loader), "order_sum": int(order.sum())}


def ddp_accumulation(state: PartialState) -> dict[str, Any]:
    """k accumulated micro-batches under DDP == one k-times larger batch == one process on it all."""
    k, batch, world = 3, 2, state.num_processes
    generator = torch.Generator().manual_seed(7)  # the same data on every rank
    features = torch.randn(2 * k * batch * world, 4, generator=generator)
    targets = torch.randn(2 * k * batch * world, 1, generator=generator)
    dataset = TensorDataset(features, targets)
    torch.manual_seed(3)  # the same initial model on every rank, for the one-process reference
    reference = torch.nn.Linear(4, 1)
    loss_fn = torch.nn.MSELoss()

    GradientState(GradientAccumulationPlugin(num_steps=k))
    accumulated = DDP(copy.deepcopy(reference))
    syncs, ends, steps, first_micro_grad = [], [], [], None
    for x, y in prepare_data_loader(DataLoader(dataset, batch_size=batch)):
        with accumulate(accumulated) as sync:
            (loss_fn(accumulated(x), y) / k).backward()
        syncs.append(sync)
        ends.append(GradientState().end_of_dataloader)
        if first_micro_grad is None:
            first_micro_grad = accumulated.module.weight.grad.clone().tolist()
        if sync:
            steps.append(_grads(accumulated.module))
            accumulated.zero_grad()

    large = DDP(copy.deepcopy(reference))
    large_steps = []
    for x, y in prepare_data_loader(DataLoader(dataset, batch_size=k * batch)):
        loss_fn(large(x), y).backward()
        large_steps.append(_grads(large.module))
        large.zero_grad()

    single_steps = []
    for step in range(2):
        model = copy.deepcopy(reference)
        rows = slice(step * k * batch * world, (step + 1) * k * batch * world)
        loss_fn(model(features[rows]), targets[rows]).backward()
        single_steps.append(_grads(model))
    return {
        "syncs": syncs,
        "ends": ends,
        "accumulated": steps,
        "large_batch": large_steps,
        "one_process": single_steps,
        "first_micro_grad": first_micro_grad,
    }


def _grads(model: torch.nn.Module) -> list[list[float]]:
    return [p.grad.detach().flatten().tolist() for p in model.parameters()]


def end_of_uneven_dataloader(state: PartialState) -> dict[str, Any]:
    """A dataset that does not fill the last step: padding is counted and the last batch syncs."""
    GradientState(GradientAccumulationPlugin(num_steps=2))
    length = 2 * state.num_processes * 2 + 1  # two full steps of batch 2, then one sample
    loader = prepare_data_loader(DataLoader(list(range(length)), batch_size=2))
    seen = []
    for batch in loader:
        with accumulate() as sync:
            gradient_state = GradientState()
            seen.append((len(batch), gradient_state.end_of_dataloader, gradient_state.remainder, sync))
    return {"seen": seen, "remainder_after": GradientState().remainder}


CHECKS: dict[str, Callable[[PartialState], Any]] = {
    "attributes": attributes,
    "accelerator_state": accelerator_state,
    "tutorial_examples": tutorial_examples,
    "reference_decorators": reference_decorators,
    "decorator_values": decorator_values,
    "split_examples": split_examples,
    "split_pieces": split_pieces,
    "wait_example": wait_example,
    "first_examples": first_examples,
    "first_failures": first_failures,
    "other_methods": other_methods,
    "sharded_loader": sharded_loader,
    "ddp_accumulation": ddp_accumulation,
    "end_of_uneven_dataloader": end_of_uneven_dataloader,
}


def run_all() -> dict[str, Any]:
    """Every check on this rank; a check that raises records its error instead of a value."""
    state = PartialState()  # no arguments: must find 2-4 CPU ranks on gloo by itself
    results: dict[str, Any] = {}
    for name, check in CHECKS.items():
        try:
            results[name] = check(state)
        except Exception as exc:  # reported per check by the tests
            results[name] = f"check raised {type(exc).__name__}: {exc}"
    return results
