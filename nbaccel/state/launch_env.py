"""What the launch environment says this process is: rank, world size, local rank, device choice.

Read-only and pure: `LaunchEnvironment.read` parses a mapping (``os.environ`` by default) and
validates it, so that a malformed variable fails here, with its value, rather than deep inside a
rendezvous. The names are the standard torch ones (set by nbaccel's launcher, torchrun and
``accelerate launch`` alike) plus nbaccel's and Accelerate's own, spelled once in ``nbaccel.wire.rank_env``.

Example:
    >>> env = LaunchEnvironment.read({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2"})
    >>> env.world_size, env.rank, env.local_rank, env.is_distributed
    (4, 2, 2, True)
    >>> LaunchEnvironment.read({}).is_distributed
    False
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from nbaccel.wire import rank_env as names

_TRUE = frozenset({"1", "true", "yes", "on"})
DEVICE_TYPES = ("cpu", "cuda", "xpu")


def is_truthy(value: str | None) -> bool:
    """Whether an environment flag is set: "1", "true", "yes" or "on", in any case.

    Accelerate compares against "true" only, so its documented ``ACCELERATE_DEBUG_MODE=1`` is
    silently ignored; accepting every usual spelling avoids that trap.
    """
    return value is not None and value.strip().lower() in _TRUE


def normalize_mixed_precision(value: object, where: str) -> str:
    """``value`` as one of "no", "fp16", "bf16", "fp8" (case-insensitive), or a ValueError."""
    if isinstance(value, str) and value.strip().lower() in names.MIXED_PRECISIONS:
        return value.strip().lower()
    raise ValueError(f"{where}={value!r} is not a mixed-precision mode nbaccel knows. Use one of {', '.join(repr(m) for m in names.MIXED_PRECISIONS)}.")


@dataclass(frozen=True)
class LaunchEnvironment:
    """The launch variables of one process, parsed and checked; None where a variable is unset.

    ``device_type`` is what a launcher chose ("cpu", "cuda", "xpu") or None when it did not say
    (torchrun, ``accelerate launch``). A launcher may leave RANK out when it creates the process
    group itself (Accelerate's ``debug_launcher`` does); the group then tells the rank.
    """

    world_size: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    device_type: str | None = None
    use_cpu: bool = False
    mixed_precision: str = "no"
    debug: bool = False
    master_addr: str | None = None
    master_port: str | None = None
    device_index: int | None = None  # NBACCEL_DEVICE_INDEX: the GPU a launched rank pins (None: its local index)

    @property
    def is_distributed(self) -> bool:
        """True when the environment describes more than one process."""
        return (self.world_size or 1) > 1

    def local_index(self, rank: int) -> int:
        """This process's index on its machine, given its global ``rank``.

        LOCAL_RANK when set; otherwise ``rank`` modulo LOCAL_WORLD_SIZE, or ``rank`` itself
        (one machine) when that is unset too.
        """
        if self.local_rank is not None:
            return self.local_rank
        return rank % self.local_world_size if self.local_world_size else rank

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> LaunchEnvironment:
        """Parse ``environ`` (default: ``os.environ``); raises ValueError naming a bad variable."""
        environ = os.environ if environ is None else environ
        world_size = _int_var(environ, "WORLD_SIZE", minimum=1)
        rank = _int_var(environ, "RANK", minimum=0)
        if world_size is not None and rank is not None and rank >= world_size:
            raise ValueError(f"RANK={rank} is not below WORLD_SIZE={world_size}: ranks run from 0 to WORLD_SIZE-1. Check the variables your launcher exported.")
        return cls(
            world_size=world_size,
            rank=rank,
            local_rank=_int_var(environ, "LOCAL_RANK", minimum=0),
            local_world_size=_int_var(environ, "LOCAL_WORLD_SIZE", minimum=1),
            device_type=_device_type(environ),
            use_cpu=is_truthy(environ.get(names.ACCELERATE_USE_CPU)),
            mixed_precision=normalize_mixed_precision(environ.get(names.MIXED_PRECISION) or "no", names.MIXED_PRECISION),
            debug=is_truthy(environ.get("ACCELERATE_DEBUG_MODE")),
            master_addr=environ.get("MASTER_ADDR"),
            master_port=environ.get("MASTER_PORT"),
            device_index=_int_var(environ, names.DEVICE_INDEX, minimum=0),
        )


def fork_launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a fork launcher started this process and owns the process group's teardown."""
    environ = os.environ if environ is None else environ
    return any(environ.get(n) == "1" for n in (names.FORK_LAUNCHED, names.ACCELERATE_FORK_LAUNCHED))


def _int_var(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"{name}={raw!r} in the environment is not an integer >= {minimum}; the process state "
            f"cannot tell its place in the launch. Unset it or set it to a number."
        )
    return value


def _device_type(environ: Mapping[str, str]) -> str | None:
    raw = environ.get(names.DEVICE_TYPE)
    if raw is None or raw == "":
        return None
    if raw not in DEVICE_TYPES:
        raise ValueError(
            f"{names.DEVICE_TYPE}={raw!r} is not a device type nbaccel launches on "
            f"({', '.join(DEVICE_TYPES)}). It is set by nbaccel's launcher; unset it or fix it."
        )
    return raw
