"""Rank side of ``%distributed save`` / ``load``: torch.distributed.checkpoint (DCP) over a namespace.

Every rank writes its own shards (DCP); a checkpoint saved on N ranks loads on M (DCP reshards
by each tensor's global offsets). Modules go through ``get_model_state_dict`` /
``set_model_state_dict``, optimizers through ``get_optimizer_state_dict`` /
``set_optimizer_state_dict`` (with the module in the namespace that owns their parameters),
tensors in place, and anything else (a step count, a config dict) as a pickled object.

Atomic: the ranks write into a hidden sibling folder, and rank 0 renames it to the target only
after every rank finished; a save that fails or is interrupted leaves no folder at the target
(a previous checkpoint there stays whole until the rename). Every check that can refuse
(an unwritable path, a folder without a checkpoint, keys or shapes that do not match) is made
by rank 0 and shared with one collective before any other, so every rank raises the same
refusal (``nbaccel.wire.sharded.Refusal``; the kernel raises ``nbaccel.CheckpointError``) having issued the same collectives: the workers stay in step and keep running.

Example (what ``pool.save("ckpt", "model", "optimizer")`` runs on every rank)::

    save(namespace, "/data/ckpt", ["model", "optimizer"], "/data/.ckpt.partial-1a2b")
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from nbaccel.wire.sharded import Refusal

_METADATA = ".metadata"  # DCP's FileSystemWriter writes it last, on the coordinator


class Refused(Exception):
    """A check that refuses on this rank (its message goes to every rank with one collective)."""


def save(namespace: dict[str, Any], directory: str, names: list[str], partial: str) -> list[str] | Refusal:
    """Write ``names`` of ``namespace`` to ``directory`` (via ``partial``, then a rename); the names."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    state: dict[str, Any] = {}
    refused = _agree(lambda: state.update({name: _state_of(namespace, name) for name in names}), lambda: _prepare(directory, partial))
    if refused is not None:
        return refused
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    try:
        dcp_save(state, checkpoint_id=partial)  # every rank's shards; rank 0 writes .metadata last
        dist.barrier()
    except (Exception, CheckpointException) as error:  # noqa: BLE001 - DCP raises on every rank alike (it gathers each rank's failure)
        refused = Refusal(f"saving to {directory!r} failed, and nothing was saved there: {type(error).__name__}: {_first_line(error)}")
    except BaseException:  # interrupted: the partial folder goes, the target was never touched
        if _rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    else:
        refused = _agree(lambda: None, lambda: _commit(partial, directory))
    if refused is not None and _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    return names if refused is None else refused


def load(namespace: dict[str, Any], directory: str, names: list[str]) -> list[str] | Refusal:
    """Read ``names`` from the checkpoint in ``directory`` into ``namespace`` (resharded as it is now)."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    present = [name for name in names if name in namespace]
    state: dict[str, Any] = {}
    refused = _agree(lambda: state.update({name: _state_of(namespace, name) for name in present}), lambda: _check_loadable(directory, names, state))
    if refused is not None:
        return refused
    try:
        if state:
            dcp_load(state, checkpoint_id=directory)
        for name in present:
            _apply(namespace, name, state[name])
        missing = sorted(set(names) - set(present))
        if missing:  # not on the ranks yet: whole values, the same on every rank
            namespace.update(_whole_values(directory, missing))
    except (Exception, CheckpointException) as error:  # noqa: BLE001 - DCP raises on every rank alike
        return Refusal(f"loading from {directory!r} failed: {type(error).__name__}: {_first_line(error)}")
    return names


def _first_line(error: BaseException) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), repr(error))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _agree(local: Any, on_rank_0: Any) -> Refusal | None:
    """Run ``local`` on every rank, then ``on_rank_0`` on rank 0 (when nothing refused there), and
    share every refusal with one collective: every rank answers the same, in step."""
    import torch.distributed as dist

    message = _refusal(local)
    if message is None and _rank() == 0:
        message = _refusal(on_rank_0)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, message)
    said = [(rank, m) for rank, m in enumerate(everyone) if m is not None]
    if not said:
        return None
    rank, first = said[0]
    return Refusal(first if all(m == first for _, m in said) and (len(said) == len(everyone) or rank == 0) else f"rank {rank}: {first}")


def _refusal(check: Any) -> str | None:
    try:
        check()
    except (Refused, NameError) as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - whatever a check raises, every rank must still reach the collective
        return f"{type(error).__name__}: {_first_line(error)}"
    return None


def _state_of(namespace: dict[str, Any], name: str) -> Any:
    """What DCP writes for ``name``: a module's or optimizer's state dict, else the value itself."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    if name not in namespace:
        raise NameError(f"name {name!r} is not defined on this rank; define it in a %%distributed cell first")
    value = namespace[name]
    if isinstance(value, torch.nn.Module):
        return get_model_state_dict(value)
    if isinstance(value, torch.optim.Optimizer):
        return get_optimizer_state_dict(_owner(namespace, name, value), value)
    return value


def _apply(namespace: dict[str, Any], name: str, loaded: Any) -> None:
    import torch
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    value = namespace[name]
    if isinstance(value, torch.nn.Module):
        set_model_state_dict(value, loaded)
    elif isinstance(value, torch.optim.Optimizer):
        set_optimizer_state_dict(_owner(namespace, name, value), value, loaded)
    elif not isinstance(value, torch.Tensor):  # tensors were loaded in place; objects are replaced
        namespace[name] = loaded


def _owner(namespace: dict[str, Any], name: str, optimizer: Any) -> Any:
    """The module of the namespace whose parameters ``optimizer`` updates (DCP keys its state by their names)."""
    import torch

    mine = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for value in namespace.values():
        if isinstance(value, torch.nn.Module) and mine <= {id(p) for p in value.parameters()}:
            return value
    raise Refused(
        f"optimizer {name!r}: no module on the ranks owns all of its parameters, so its state cannot be keyed by parameter names; "
        "keep the model in a variable of the same namespace"
    )


def _prepare(directory: str, partial: str) -> None:
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise Refused(f"cannot save to {directory!r}: it is a file, not a folder; choose a folder path")
    if os.path.isdir(directory) and os.listdir(directory) and not os.path.exists(os.path.join(directory, _METADATA)):
        raise Refused(f"cannot save to {directory!r}: it is a folder that holds something other than a checkpoint; choose a new or empty folder")
    try:
        os.makedirs(os.path.dirname(partial) or ".", exist_ok=True)
        os.mkdir(partial)
    except OSError as error:
        raise Refused(f"cannot save to {directory!r}: {error.strerror or error} ({error.filename or partial}); choose a path you can write") from None


def _commit(partial: str, directory: str) -> None:
    """The rename that makes the checkpoint exist; an older one at the target goes only after it."""
    if not os.path.exists(os.path.join(partial, _METADATA)):
        raise Refused(f"the save to {directory!r} did not complete (no {_METADATA} was written); nothing was saved")
    old = None
    try:
        if os.path.isdir(directory):
            old = partial + ".old"
            os.rename(directory, old)
        os.rename(partial, directory)
    except OSError as error:
        raise Refused(
            f"cannot save to {directory!r}: the finished checkpoint could not be moved there ({error.strerror or error}); nothing was saved"
        ) from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _check_loadable(directory: str, names: list[str], state: dict[str, Any]) -> None:
    """Refuse a folder without a checkpoint, and names, keys or shapes that are not in it."""
    if not os.path.isfile(os.path.join(directory, _METADATA)):
        why = "does not exist" if not os.path.exists(directory) else f"holds no checkpoint (no {_METADATA})"
        raise Refused(f"cannot load from {directory!r}: it {why}; give the folder that %distributed save wrote")
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    saved: dict[str, Any] = dict(FileSystemReader(directory).read_metadata().state_dict_metadata)
    flat = dict(_flat_leaves(state))
    absent = [name for name in names if name not in state and not any(key == name or key.startswith(name + ".") for key in saved)]
    missing = [key for key in flat if key not in saved]
    unexpected = [key for key in saved if key.split(".")[0] in state and key not in flat]
    shapes = [f"{key}: saved {tuple(saved[key].size)}, here {tuple(value.shape)}" for key, value in flat.items() if _shape_differs(saved.get(key), value)]
    problems = [
        *([f"not in the checkpoint: {', '.join(absent)}"] if absent else []),
        *([f"missing from the checkpoint: {_few(missing)}"] if missing else []),
        *([f"in the checkpoint but not here: {_few(unexpected)}"] if unexpected else []),
        *([f"shapes differ: {_few(shapes)}"] if shapes else []),
    ]
    if problems:
        raise Refused(f"cannot load from {directory!r}: it is a checkpoint of something else ({'; '.join(problems)}); load the names it was saved with")


def _flat_leaves(state: dict[str, Any]) -> Any:
    """``(key, leaf)`` of a state dict under the keys DCP's default planner saves it with: a path
    joined by dots, into mappings always and into lists that hold tensors or mappings (tuples and
    other lists are leaves)."""
    import torch

    def holds_more(value: list[Any]) -> bool:
        return any(isinstance(item, (Mapping, torch.Tensor)) or (isinstance(item, list) and holds_more(item)) for item in value)

    def walk(path: tuple[Any, ...], value: Any) -> Any:
        if isinstance(value, Mapping):
            for key, item in value.items():
                yield from walk((*path, key), item)
        elif isinstance(value, list) and holds_more(value):
            for index, item in enumerate(value):
                yield from walk((*path, index), item)
        else:
            yield ".".join(map(str, path)), value

    for key, value in state.items():
        yield from walk((key,), value)


def _whole_values(directory: str, names: list[str]) -> dict[str, Any]:
    """``names`` as saved in ``directory``, whole (not resharded onto anything): a skeleton of
    empty tensors and placeholders built from the checkpoint's own metadata, filled by DCP's load."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    metadata = FileSystemReader(directory).read_metadata()
    paths = metadata.planner_data or {}
    skeleton: dict[Any, Any] = {}
    for key, stored in metadata.state_dict_metadata.items():
        path = tuple(paths.get(key, (key,)))
        if path[0] in names:
            leaf = torch.empty(stored.size, dtype=stored.properties.dtype) if isinstance(stored, TensorStorageMetadata) else None
            _place(skeleton, path, leaf)
    values = {name: _as_lists(value) for name, value in skeleton.items()}
    dcp_load(values, checkpoint_id=directory)
    return values


def _place(tree: dict[Any, Any], path: tuple[Any, ...], leaf: Any) -> None:
    for step in path[:-1]:
        tree = tree.setdefault(step, {})
    tree[path[-1]] = leaf


def _as_lists(tree: Any) -> Any:
    """Mappings whose keys are the indices 0..n-1 (a saved list's) made lists again."""
    if not isinstance(tree, dict):
        return tree
    items = {key: _as_lists(value) for key, value in tree.items()}
    if items and all(isinstance(key, int) for key in items) and sorted(items) == list(range(len(items))):
        return [items[index] for index in range(len(items))]
    return items


def _shape_differs(saved: Any, value: Any) -> bool:
    torch = sys.modules["torch"]
    size = getattr(saved, "size", None)
    return size is not None and isinstance(value, torch.Tensor) and tuple(size) != tuple(value.shape)


def _few(keys: list[str]) -> str:
    return ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
