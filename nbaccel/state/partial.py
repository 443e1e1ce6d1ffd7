"""``PartialState``: which process this is, on which device, and helpers to control the processes.

Every ``PartialState()`` is a view of one shared, immutable snapshot taken at the first
construction in the process (which also joins or creates the torch process group). Nothing is
shared through ``__dict__``; `PartialState._reset_state` drops the snapshot, which is the one way
to start over in tests (nbaccel's worker does it right after the fork, so a state made in the
kernel never leaks into a rank).

Example:
    >>> state = PartialState()
    >>> state.num_processes, state.process_index, state.distributed_type
    (1, 0, <DistributedType.NO: 'NO'>)
    >>> with state.split_between_processes(["A", "B", "C"]) as mine:
    ...     mine
    ['A', 'B', 'C']
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from nbaccel.devices.inventory import gpu_inventory
from nbaccel.errors import NbaccelError
from nbaccel.state import default_group as process_group
from nbaccel.state.control import FirstProcessFailedError, ProcessControl
from nbaccel.state.default_group import GroupInfo
from nbaccel.state.launch_env import LaunchEnvironment, fork_launched

__all__ = ["DistributedType", "FirstProcessFailedError", "PartialState", "StateResetError"]


class DistributedType(str, enum.Enum):
    """How the processes are laid out. A ``str`` enum, so it compares equal to Accelerate's.

    nbaccel itself reports ``NO`` (one process), ``MULTI_CPU`` (several processes on gloo) or
    ``MULTI_GPU`` (several processes on nccl). ``DEEPSPEED``, ``FSDP`` and ``MEGATRON_LM`` exist
    so that code written for Accelerate can compare against them; nbaccel never reports them,
    because it does not set those engines up.

    Example:
        >>> DistributedType.MULTI_CPU == "MULTI_CPU"
        True
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    MEGATRON_LM = "MEGATRON_LM"


class StateResetError(NbaccelError, AttributeError):
    """A state object was used after ``_reset_state()``; it is an AttributeError, as in Accelerate."""


@dataclass(frozen=True)
class _Snapshot:
    """Everything ``PartialState`` reports, fixed at the first construction."""

    device: torch.device
    distributed_type: DistributedType
    backend: str | None
    num_processes: int
    process_index: int
    local_process_index: int
    mixed_precision: str
    debug: bool
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)


class PartialState(ProcessControl):
    """The process state: rank, world size, device, and process-control helpers.

    Every instance shares one state, set up at the first instantiation: it reads the launch
    environment (RANK, WORLD_SIZE, LOCAL_RANK, ... as set by nbaccel's launcher, torchrun or
    ``accelerate launch``) and, when there are several processes and torch.distributed is not
    initialised yet, creates the default process group (gloo on CPU, nccl on CUDA). A launched
    rank alone (LOCAL_RANK set, WORLD_SIZE=1) gets a group of one on a GPU, or on the CPU when
    the CPU was asked for (as Accelerate does), so ``DistributedDataParallel(model)`` works. A
    group you created yourself is used as it is. Rank and world size come from the group.

    Args:
        cpu: run on the CPU (gloo) even when a GPU is visible. ``ACCELERATE_USE_CPU=true`` and a
            CPU launch by nbaccel do the same.
        **kwargs: passed to ``torch.distributed.init_process_group`` when the group is created,
            e.g. ``InitProcessGroupKwargs(timeout=timedelta(seconds=60)).to_kwargs()``.

    Raises:
        ValueError: a later construction asks for something else than the first one did
            (``cpu=True`` on a GPU state, other kwargs); reset with ``PartialState._reset_state()``.

    Example:
        >>> state = PartialState()
        >>> if state.is_main_process:
        ...     print(f"{state.num_processes} process(es) on {state.device}")
        1 process(es) on cpu
    """

    _shared: ClassVar[_Snapshot | None] = None

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        if not isinstance(cpu, bool):
            raise TypeError(f"cpu must be True or False, got {cpu!r}")
        if PartialState._shared is None:
            PartialState._shared = _set_up(cpu, kwargs)
        else:
            _check_same_request(PartialState._shared, cpu, kwargs)

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state so that the next ``PartialState()`` sets it up again.

        This is the one way to reset, meant for tests (Accelerate's name, so tests written for it
        work). It does not destroy the process group; the next construction uses it. Existing
        instances raise ``StateResetError`` (an AttributeError) until a new one is created.

        Example:
            >>> PartialState._reset_state()
            >>> PartialState().initialized
            True
        """
        PartialState._shared = None

    @property
    def _state(self) -> _Snapshot:
        shared = PartialState._shared
        if shared is None:
            raise StateResetError(
                f"This {type(self).__name__} was made before PartialState._reset_state() (or "
                "nbaccel.state.reset_all_states()) dropped the shared state, so it describes "
                f"nothing now. Create it again: state = {type(self).__name__}()."
            )
        return shared

    @property
    def initialized(self) -> bool:
        """Whether the shared state is set up (False only after a reset)."""
        return PartialState._shared is not None

    @property
    def device(self) -> torch.device:
        """The device this process should use: ``cuda:<local index>`` on GPUs, else ``cpu``."""
        return self._state.device

    @property
    def distributed_type(self) -> DistributedType:
        """``NO`` for one process, ``MULTI_CPU`` or ``MULTI_GPU`` for several."""
        return self._state.distributed_type

    @property
    def backend(self) -> str | None:
        """The process group's backend ("gloo", "nccl", ...), or None for one process."""
        return self._state.backend

    @property
    def num_processes(self) -> int:
        """How many processes run in parallel (the process group's world size)."""
        return self._state.num_processes

    @property
    def process_index(self) -> int:
        """This process's global index (rank), 0 to ``num_processes - 1``."""
        return self._state.process_index

    @property
    def local_process_index(self) -> int:
        """This process's index on its machine (LOCAL_RANK)."""
        return self._state.local_process_index

    @property
    def mixed_precision(self) -> str:
        """The launch's mixed precision ("no", "fp16", "bf16", "fp8"), from ACCELERATE_MIXED_PRECISION."""
        return self._state.mixed_precision

    @property
    def debug(self) -> bool:
        """Whether ACCELERATE_DEBUG_MODE is set ("1", "true", "yes" or "on")."""
        return self._state.debug

    @property
    def fork_launched(self) -> bool:
        """Whether a fork launcher (nbaccel's, or Accelerate's) started this process and owns teardown."""
        return fork_launched()

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type.value}  Backend: {self.backend}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
        )

    def set_device(self) -> None:
        """Make ``self.device`` the current CUDA device (nothing to do on CPU).

        Example:
            >>> PartialState().set_device()
        """
        if self.device.type in ("cuda", "xpu"):
            getattr(torch, self.device.type).set_device(self.device)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy ``group`` (default: the default process group).

        Does nothing when ``fork_launched`` and ``group`` is None: the launcher tears the group
        down when the rank's function returns.

        Example:
            >>> PartialState().destroy_process_group()  # no group: nothing to destroy
        """
        if group is None and self.fork_launched:
            return
        process_group.destroy(group)


def _set_up(cpu: bool, kwargs: dict[str, Any]) -> _Snapshot:
    """Read the environment, join (or create) the process group, and snapshot the result."""
    env = LaunchEnvironment.read()
    device_type = _device_type(cpu, env)
    alone = process_group.launched_alone(env, device_type, cpu or env.use_cpu or env.device_type == "cpu")
    device = None
    if device_type in ("cuda", "xpu") and (env.is_distributed or alone) and process_group.current_group() is None:
        # Before the group exists, so that nccl (xccl) binds this rank's GPU.
        device = _device(device_type, _device_index(env, env.local_index(env.rank or 0)))
        getattr(torch, device_type).set_device(device)
    group = process_group.join_default_group(env, process_group.default_backend(device_type), dict(kwargs), alone=alone, device=device)
    local_index = env.local_index(group.rank if group else 0)
    return _Snapshot(
        device=_device(device_type, _device_index(env, local_index)),
        distributed_type=_distributed_type(group, device_type, launched=env.local_rank is not None),
        backend=group.backend if group else None,
        num_processes=group.world_size if group else 1,
        process_index=group.rank if group else 0,
        local_process_index=local_index,
        mixed_precision=env.mixed_precision,
        debug=env.debug,
        init_kwargs=dict(kwargs),
    )


def _device_index(env: LaunchEnvironment, local_index: int) -> int:
    """The GPU this rank uses: the launcher's NBACCEL_DEVICE_INDEX (an XPU rank sees every
    device), else its local index (torchrun, Accelerate)."""
    return env.device_index if env.device_index is not None else local_index


def _device_type(cpu: bool, env: LaunchEnvironment) -> str:
    if cpu or env.use_cpu or env.device_type == "cpu":
        return "cpu"
    if env.device_type == "xpu":  # launched on Intel GPUs: torch.xpu counts them in the rank
        return "xpu"
    gpus = cuda_device_count()
    if env.device_type == "cuda" and gpus == 0:
        raise RuntimeError(
            "The launcher started this process for CUDA (NBACCEL_DEVICE_TYPE='cuda'), but torch "
            "sees no CUDA device here. Check CUDA_VISIBLE_DEVICES, or launch on the CPU."
        )
    return "cuda" if gpus > 0 else "cpu"


def _device(device_type: str, local_rank: int) -> torch.device:
    if device_type == "cpu":
        return torch.device("cpu")
    if device_type == "xpu":
        return torch.device("xpu", local_rank)
    return torch.device("cuda", local_rank % max(1, cuda_device_count()))


def cuda_device_count() -> int:
    """The CUDA devices this process sees. Outside a launched rank (a state made in the kernel)
    counted through NVML only: ``torch.cuda.device_count()`` falls back to ``cuInit`` where NVML
    cannot answer (MIG, no libnvidia-ml), which would spoil every later fork. GPUs count only when
    this torch can drive them (a CPU-only torch on an NVIDIA box counts none; a ROCm torch counts
    AMD GPUs: ``nbaccel.devices.inventory``)."""
    if fork_launched():
        return int(torch.cuda.device_count())
    found = gpu_inventory()
    return len(found.devices) if found.device_type == "cuda" else 0


def _distributed_type(group: GroupInfo | None, device_type: str, launched: bool) -> DistributedType:
    # A launched rank with a group is MULTI_* even alone, as in Accelerate (code that wraps the
    # model in DDP when the type is not NO then finds the group it needs).
    if group is None or (group.world_size == 1 and not launched):
        return DistributedType.NO
    return {"cuda": DistributedType.MULTI_GPU, "xpu": DistributedType.MULTI_XPU}.get(device_type, DistributedType.MULTI_CPU)


def _check_same_request(shared: _Snapshot, cpu: bool, kwargs: dict[str, Any]) -> None:
    if cpu and shared.device.type != "cpu":
        raise ValueError(
            f"PartialState(cpu=True) was requested, but the shared state was already set up on "
            f"{shared.device} by an earlier construction and cannot move. Pass cpu=True to the "
            "first one, or call PartialState._reset_state() first."
        )
    if kwargs and dict(kwargs) != dict(shared.init_kwargs):
        raise ValueError(
            f"PartialState was already set up with init_process_group arguments "
            f"{dict(shared.init_kwargs)!r}, so {kwargs!r} cannot take effect now. Pass them to "
            "the first PartialState(), or call PartialState._reset_state() first."
        )
