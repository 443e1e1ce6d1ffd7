"""The environment a launched rank sees: the standard torch variables plus nbaccel's and Accelerate's.

The launcher writes these into each worker's ``os.environ`` right after the fork; the process
state (``nbaccel.state``) only reads them, so it is equally right under torchrun or Accelerate.

Example:
    >>> env = rank_environment(rank=1, world_size=2, master_port=29511, device_type="cpu")
    >>> env["RANK"], env["WORLD_SIZE"], env["NBACCEL_FORK_LAUNCHED"]
    ('1', '2', '1')
    >>> sorted(set(TORCHRUN_VARIABLES) - set(env))  # torchrun's whole worker contract is there
    []
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from nbaccel.wire import flight_recorder

# Variables the state reads. Kept here so the launcher and the state agree on one spelling.
FORK_LAUNCHED = "NBACCEL_FORK_LAUNCHED"  # "1" when nbaccel forked this process; it owns teardown
NODE_RANK = "NBACCEL_NODE_RANK"  # which node of a cluster this rank runs on ("0" on one machine)
NUM_NODES = "NBACCEL_NUM_NODES"
DEVICE_TYPE = "NBACCEL_DEVICE_TYPE"  # "cuda", "xpu" or "cpu": what the launcher chose for the ranks
DEVICE_INDEX = "NBACCEL_DEVICE_INDEX"  # the device a GPU rank pins (cuda:N / xpu:N, as the rank numbers them)
MIXED_PRECISION = "ACCELERATE_MIXED_PRECISION"  # Accelerate's own name, so Accelerator() sees it too
ACCELERATE_FORK_LAUNCHED = "FORK_LAUNCHED"  # Accelerate's PartialState.fork_launched reads this
ACCELERATE_USE_CPU = "ACCELERATE_USE_CPU"
# Seconds a rank's exit handlers may take (nbaccel.rank.exit_hooks); the kernel waits that long too
# before it calls a leaving worker stuck. Set by the user, read on both sides.
EXIT_TIMEOUT = "NBACCEL_EXIT_TIMEOUT"
DEFAULT_EXIT_TIMEOUT = 10.0

# What torch elastic's LocalElasticAgent._start_workers gives every worker (torch 2.13,
# torch/distributed/elastic/agent/server/local_elastic_agent.py), so code written for torchrun
# (``is_torchelastic_launched()``, Lightning's TorchElasticEnvironment) sees a torchrun rank.
# Not given: TORCHELASTIC_ERROR_FILE (errors travel on the rank's channel instead) and the
# watchdog's file (nbaccel watches its ranks itself).
TORCHRUN_VARIABLES = (
    "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)  # fmt: skip
ROLE_NAME = "default"  # torchrun's role for its workers (--role)

MixedPrecision = Literal["no", "fp16", "bf16", "fp8"]
MIXED_PRECISIONS: tuple[str, ...] = get_args(MixedPrecision)


def exit_timeout() -> float:
    """Seconds a rank's exit handlers may take, from ``NBACCEL_EXIT_TIMEOUT`` (default 10).

    Example:
        >>> exit_timeout() > 0
        True
    """
    text = os.environ.get(EXIT_TIMEOUT, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_EXIT_TIMEOUT
    return value if value > 0 else DEFAULT_EXIT_TIMEOUT


@functools.lru_cache(maxsize=1)
def loopback_interface() -> str:
    """Name of the loopback network interface ("lo" on Linux, "lo0" on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:  # no interface table (some sandboxes): Linux's name is the safe guess
        return "lo"
    return next((n for n in names if n.startswith("lo")), "lo")


def rank_environment(
    *,
    rank: int,
    world_size: int,
    master_port: int,
    device_type: str,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    node_rank: int = 0,
    num_nodes: int = 1,
    run_id: str = "none",
    master_addr: str = "127.0.0.1",
    mixed_precision: str = "no",
    restart_count: int = 0,
    max_restarts: int = 0,
    visible_gpus: Sequence[int] | None = None,
    inherited: Mapping[str, str] | None = None,
    socket_interface: str | None = None,
    gpu_vendor: str = "nvidia",
) -> dict[str, str]:
    """Environment variables for one rank of a launch (only the ones nbaccel sets).

    ``inherited`` is the environment the rank starts from (default: this process's); variables
    the user already set there for the socket interface are respected. Otherwise gloo and NCCL
    use ``socket_interface``: None (a one-node launch) means this machine's loopback; a node of a
    cluster passes the interface that holds its address towards the cluster, or "" when it does
    not know it (an IPv6 link, say), which leaves the choice to gloo. ``run_id`` is one name
    for the whole launch, the same on every rank and across restarts, as torchrun's ``--rdzv-id``
    (whose default is also "none").

    ``visible_gpus`` are the launch's devices as the kernel numbers them (one a rank, on this
    node), of ``gpu_vendor``'s GPUs: see ``device_variables``.
    """
    inherited = os.environ if inherited is None else inherited
    local_rank = rank if local_rank is None else local_rank
    local_world_size = world_size if local_world_size is None else local_world_size
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node_rank),
        "GROUP_WORLD_SIZE": str(num_nodes),
        "ROLE_RANK": str(rank),  # one role (every worker does the same job): as RANK
        "ROLE_NAME": ROLE_NAME,
        "ROLE_WORLD_SIZE": str(world_size),
        "NODE_RANK": str(node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        # Workers attach to the store the launcher hosts (bound to loopback) instead of rank 0
        # opening its own TCPStore, which would listen on every interface.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        # torchrun turns NCCL's async error handling on unless the user chose otherwise.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": inherited.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        FORK_LAUNCHED: "1",
        NODE_RANK: str(node_rank),
        NUM_NODES: str(num_nodes),
        ACCELERATE_FORK_LAUNCHED: "1",
        DEVICE_TYPE: device_type,
        MIXED_PRECISION: mixed_precision,
    }
    if device_type == "cpu":
        env[ACCELERATE_USE_CPU] = "true"
    elif device_type == "cuda" and not any(name in inherited for name in flight_recorder.USER_NAMES):
        # NCCL's flight recorder: which collective a stuck rank is in (nbaccel.wire.flight_recorder).
        env[flight_recorder.BUFFER_VARIABLE] = flight_recorder.BUFFER_DEFAULT
    if visible_gpus is not None:
        env.update(device_variables(gpu_vendor, visible_gpus, local_rank, inherited))
    interface = loopback_interface() if socket_interface is None else socket_interface
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        chosen = inherited.get(name) or interface  # the user's choice first
        if chosen:
            env[name] = chosen
    return env


def device_variables(gpu_vendor: str, chosen: Sequence[int], local_rank: int, inherited: Mapping[str, str]) -> dict[str, str]:
    """The device variables of a GPU rank: which devices it sees and which one it pins.

    NVIDIA: ``CUDA_VISIBLE_DEVICES`` lists the launch's GPUs, the rank pins ``cuda:local_rank``.
    AMD (a ROCm torch, through ``torch.cuda``): the same list at HIP's level, written in
    ``HIP_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` alike (so that torch's check of the two
    finds them agreeing, pytorch #140398), within the kernel's own ``ROCR_VISIBLE_DEVICES``,
    which is inherited unchanged. Intel: every device stays visible to every rank (oneCCL needs
    each device of a communicator visible in each process: a per-rank ``ZE_AFFINITY_MASK`` breaks
    its collectives, vllm #53076); the rank pins its own one, ``xpu:chosen[local_rank]``.

    Example:
        >>> device_variables("amd", [0, 1], 1, {"HIP_VISIBLE_DEVICES": "4,5"})
        {'HIP_VISIBLE_DEVICES': '4,5', 'CUDA_VISIBLE_DEVICES': '4,5', 'NBACCEL_DEVICE_INDEX': '1'}
        >>> device_variables("intel", [2, 3], 1, {})
        {'NBACCEL_DEVICE_INDEX': '3'}
    """
    if gpu_vendor == "intel":
        return {DEVICE_INDEX: str(chosen[local_rank] if local_rank < len(chosen) else local_rank)}
    if gpu_vendor == "amd":
        at_hip = inherited.get("HIP_VISIBLE_DEVICES", inherited.get("CUDA_VISIBLE_DEVICES"))
        shown = _physical_devices(chosen, at_hip)
        return {"HIP_VISIBLE_DEVICES": shown, "CUDA_VISIBLE_DEVICES": shown, DEVICE_INDEX: str(local_rank)}
    return {"CUDA_VISIBLE_DEVICES": _physical_devices(chosen, inherited.get("CUDA_VISIBLE_DEVICES")), DEVICE_INDEX: str(local_rank)}


def _physical_devices(chosen: Sequence[int], kernel_visible: str | None) -> str:
    """The kernel's own CUDA_VISIBLE_DEVICES for ``chosen`` (indices as the kernel sees them).

    A kernel limited to "2,3" sees those GPUs as 0 and 1: a rank given "0,1" would land on the
    wrong physical devices.

    Example:
        >>> _physical_devices([1], "2,3"), _physical_devices([0, 1], None)
        ('3', '0,1')
    """
    names = [name.strip() for name in kernel_visible.split(",")] if kernel_visible else None
    return ",".join(names[g] if names and g < len(names) else str(g) for g in chosen)


# What a rank's environment says of its CPU threads (nbaccel.rank.cpu_threads sizes torch's pool
# from it; the kernel plans it: the fork starter puts it in the prepared environment, the plan and
# nbaccel.plan() decide with it whether a fork with one thread is worth warning about).
OMP_NUM_THREADS = "OMP_NUM_THREADS"
# Set by the fork starter when the kernel's OpenMP (libgomp) pool had started: libgomp is not
# fork-safe, and a forked rank's first region on more than one thread waits forever for pool
# threads that exist only in the kernel. One thread runs no pool, so the rank is held to it.
ONE_THREAD_VARIABLE = "NBACCEL_ONE_CPU_THREAD"


def threads_per_rank(local_world_size: int, cores: int | None = None) -> int:
    """The cores available to this process divided among ``local_world_size`` ranks, at least 1."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


def planned_threads(env: dict[str, str]) -> int | None:
    """Parent side, before a fork: the ``OMP_NUM_THREADS`` a rank with ``env`` gets from nbaccel,
    or None where it keeps the value it has (the user's, in the kernel's environment or ``env``).

    The fork starter puts it in the rank's prepared environment block: a rank setting it itself
    (``os.environ``'s mapping code, a ``putenv``) wrote about 40 of the kernel's pages.

    Example:
        >>> planned_threads({ONE_THREAD_VARIABLE: "1"})
        1
    """
    if env.get(ONE_THREAD_VARIABLE) or os.environ.get(ONE_THREAD_VARIABLE):
        return 1
    if env.get(OMP_NUM_THREADS) or os.environ.get(OMP_NUM_THREADS):
        return None
    return threads_per_rank(int(env.get("LOCAL_WORLD_SIZE", "1")))
