"""Small configuration objects the states take: process-group arguments and gradient accumulation.

Example:
    >>> InitProcessGroupKwargs(timeout=timedelta(seconds=60)).to_kwargs()
    {'timeout': datetime.timedelta(seconds=60)}
    >>> GradientAccumulationPlugin(num_steps=4).to_kwargs()
    {'num_steps': 4, 'adjust_scheduler': True, 'sync_with_dataloader': True}
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class InitProcessGroupKwargs:
    """Arguments for ``torch.distributed.init_process_group`` when ``PartialState`` creates the group.

    Only the fields you set are passed on, so torch's own defaults apply to the rest
    (``backend`` defaults to gloo on CPU and nccl on CUDA).

    Example:
        >>> from nbaccel import PartialState
        >>> PartialState._reset_state()  # the arguments apply to the first PartialState only
        >>> kwargs = InitProcessGroupKwargs(backend="gloo", timeout=timedelta(minutes=5)).to_kwargs()
        >>> PartialState(**kwargs).num_processes  # one process: no group is needed, none is made
        1
    """

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None

    def __post_init__(self) -> None:
        for name in ("backend", "init_method"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"InitProcessGroupKwargs.{name} must be a str or None, got {value!r}")
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            raise TypeError(f"InitProcessGroupKwargs.timeout must be a datetime.timedelta, got {self.timeout!r}; write e.g. timedelta(seconds=60).")

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that were set, as keyword arguments for ``PartialState(**kwargs)``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class GradientAccumulationPlugin:
    """How ``GradientState`` and ``nbaccel.accumulate`` accumulate gradients.

    Args:
        num_steps: micro-batches per optimizer step; gradients are all-reduced on every
            ``num_steps``-th call of ``accumulate`` only.
        adjust_scheduler: whether a learning-rate scheduler should count optimizer steps
            rather than micro-batches (read by training loops; nbaccel stores it).
        sync_with_dataloader: also synchronise on the last batch of a prepared DataLoader,
            so that no partial accumulation is carried into the next epoch.

    Example:
        >>> from nbaccel import GradientState
        >>> plugin = GradientAccumulationPlugin(num_steps=2)
        >>> GradientState(plugin).num_steps
        2
    """

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(
                f"GradientAccumulationPlugin(num_steps={self.num_steps!r}): num_steps is the number "
                "of micro-batches per optimizer step and must be an int >= 1 (1 means no accumulation)."
            )
        for name in ("adjust_scheduler", "sync_with_dataloader"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GradientAccumulationPlugin.{name} must be True or False, got {getattr(self, name)!r}")

    def to_kwargs(self) -> dict[str, Any]:
        """All fields as a dict (Accelerate's spelling)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
