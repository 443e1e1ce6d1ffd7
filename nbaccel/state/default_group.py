"""The default torch process group behind the state: joined lazily, used for barriers, destroyed on request.

nbaccel's launcher does not create the group; the first ``PartialState()`` in a rank does, with
the env:// rendezvous (MASTER_ADDR/MASTER_PORT, and the launcher's store when
TORCHELASTIC_USE_AGENT_STORE=True). A group the user already created is used as it is.

Example:
    >>> from nbaccel.state.launch_env import LaunchEnvironment
    >>> join_default_group(LaunchEnvironment(), "gloo", {}) is None  # one process: no group
    True

A launched rank gets a group even alone (world size 1), as under Accelerate: ``launched_alone``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nbaccel.state.launch_env import LaunchEnvironment


@dataclass(frozen=True)
class GroupInfo:
    """What the default process group reports about this process."""

    world_size: int
    rank: int
    backend: str


def default_backend(device_type: str) -> str:
    """The backend for a device type: nccl for CUDA (RCCL on a ROCm torch, under the same name),
    xccl for Intel XPUs (built into torch), gloo for everything else (CPU).

    >>> default_backend("cuda"), default_backend("xpu"), default_backend("cpu")
    ('nccl', 'xccl', 'gloo')
    """
    return {"cuda": "nccl", "xpu": "xccl"}.get(device_type, "gloo")


def current_group() -> GroupInfo | None:
    """The default group's size, this rank and its backend, or None when there is no group."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return GroupInfo(dist.get_world_size(), dist.get_rank(), str(dist.get_backend()))


def launched_alone(env: LaunchEnvironment, device_type: str, cpu_requested: bool) -> bool:
    """Whether this is the one rank of a launch (world size 1) that still gets a process group.

    Accelerate creates the group whenever ``LOCAL_RANK`` is set, on an accelerator or with
    ``cpu=True`` (``accelerate/state.py``, ``_prepare_backend``), so a single launched rank can
    wrap its model in ``DistributedDataParallel``. On a CPU without ``cpu=True`` it creates
    none; nbaccel's CPU launch exports ``ACCELERATE_USE_CPU``, which counts as the request here.

    Example:
        >>> one = LaunchEnvironment(world_size=1, rank=0, local_rank=0)
        >>> launched_alone(one, "cuda", False), launched_alone(one, "cpu", True), launched_alone(one, "cpu", False)
        (True, True, False)
    """
    launched = env.local_rank is not None and env.world_size == 1
    return launched and (device_type in ("cuda", "xpu") or cpu_requested)


def join_default_group(
    env: LaunchEnvironment, backend: str, kwargs: dict[str, Any], *, alone: bool = False, device: torch.device | None = None
) -> GroupInfo | None:
    """Use the existing default group or create it when the environment describes a launch.

    Args:
        env: the launch variables of this process.
        backend: the backend to create the group with (unless ``kwargs`` names one).
        kwargs: extra arguments for ``torch.distributed.init_process_group``.
        alone: create a group of one too (``launched_alone``).
        device: this process's CUDA device; an nccl group is bound to it (``device_id=``), so
            NCCL's communicator is made now, and a failure to make it is raised here.

    Returns:
        The group's view of this process, or None for a single process without a group.

    Raises:
        TypeError: an argument ``init_process_group`` does not take.
        ValueError: a group exists but ``kwargs`` were given, or the group disagrees with the
            environment about the world size or this process's rank.
    """
    _check_kwargs(kwargs)
    existing = current_group()
    if existing is not None and kwargs:
        raise ValueError(
            f"torch.distributed is already initialised (backend {existing.backend!r}, world size "
            f"{existing.world_size}), so the init_process_group arguments {kwargs!r} given to the "
            "state cannot take effect. Drop them, or create the state before calling "
            "torch.distributed.init_process_group yourself."
        )
    if existing is None and (env.is_distributed or alone):
        existing = _create(env, backend, _with_device_id(backend, kwargs, device))
    if existing is not None:
        check_agreement(env, existing)
    return existing


def check_agreement(env: LaunchEnvironment, group: GroupInfo) -> None:
    """Raise when the process group and the launch environment describe different launches."""
    # Only what the environment states is compared: a group made by hand without WORLD_SIZE or
    # RANK (or a launcher that sets WORLD_SIZE only) leaves the group as the only truth.
    world_size = group.world_size if env.world_size is None else env.world_size
    rank = group.rank if env.rank is None else env.rank
    if (group.world_size, group.rank) != (world_size, rank):
        raise ValueError(
            f"The process group has world size {group.world_size} and rank {group.rank}, but the "
            f"environment says WORLD_SIZE={env.world_size} and RANK={env.rank}. Ranks would "
            "disagree about who is the main process and how inputs are split. Create the group "
            "with the environment's values (init_process_group() without rank/world_size), or "
            "fix the variables."
        )


def barrier(device: torch.device) -> None:
    """Block until every process of the default group reaches this call."""
    if dist.get_backend() == "nccl" and device.type == "cuda":
        # Naming the device avoids NCCL guessing it (and warning) when the barrier comes first.
        dist.barrier(device_ids=[device.index or 0])
    else:
        dist.barrier()


def any_process_flagged(flag: bool, device: torch.device) -> bool:
    """True on every process when at least one process passes ``flag=True`` (a collective)."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def destroy(group: Any = None) -> None:
    """Destroy ``group`` (default: the default group); nothing happens when there is none."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group(group)


def _with_device_id(backend: str, kwargs: dict[str, Any], device: torch.device | None) -> dict[str, Any]:
    """``kwargs`` plus ``device_id`` for an nccl group on a CUDA device (unless given).

    Without it torch makes the NCCL communicator lazily, at the first collective: a worker pool
    would say READY before NCCL is up, and NCCL's set-up errors would land in the first cell.

    Example:
        >>> _with_device_id("nccl", {}, torch.device("cuda", 1))
        {'device_id': device(type='cuda', index=1)}
        >>> _with_device_id("gloo", {}, None)
        {}
    """
    chosen = str(kwargs.get("backend", backend))
    if device is None or device.type != "cuda" or "nccl" not in chosen or "device_id" in kwargs:
        return kwargs
    return {**kwargs, "device_id": device}


def _create(env: LaunchEnvironment, backend: str, kwargs: dict[str, Any]) -> GroupInfo:
    if not dist.is_available():
        raise RuntimeError(
            f"WORLD_SIZE={env.world_size} asks for {env.world_size} processes, but this torch build "
            "has no torch.distributed. Install a torch build with distributed support."
        )
    using_env_rendezvous = kwargs.get("init_method") in (None, "env://") and "store" not in kwargs
    if using_env_rendezvous and env.rank is None and "rank" not in kwargs:
        raise ValueError(
            f"WORLD_SIZE={env.world_size} says this is one of {env.world_size} processes, but RANK "
            "is not set, so this process cannot know which one it is. Launch with "
            "nbaccel.notebook_launcher, torchrun or accelerate launch, which set both."
        )
    if using_env_rendezvous and not (env.master_addr and env.master_port):
        raise ValueError(
            f"WORLD_SIZE={env.world_size} says this is one of {env.world_size} processes, but "
            f"MASTER_ADDR={env.master_addr!r} and MASTER_PORT={env.master_port!r} do not say where "
            "they meet. Launch with nbaccel.notebook_launcher, torchrun or accelerate launch, or "
            "pass init_method=... to the state."
        )
    arguments = {"backend": backend, **kwargs}
    dist.init_process_group(**arguments)
    return GroupInfo(dist.get_world_size(), dist.get_rank(), str(dist.get_backend()))


def _check_kwargs(kwargs: dict[str, Any]) -> None:
    if not dist.is_available():
        return  # nothing to pass them to; _create explains if a group is actually needed
    parameters = inspect.signature(dist.init_process_group).parameters
    accepted = {name for name in parameters if not name.startswith("_")}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise TypeError(
            f"{', '.join(repr(k) for k in unknown)} {'is' if len(unknown) == 1 else 'are'} not "
            "arguments of torch.distributed.init_process_group, which is what the state's keyword "
            f"arguments are for. Accepted: {', '.join(sorted(accepted))}."
        )
