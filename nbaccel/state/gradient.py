"""``GradientState``: where gradient accumulation stands; shared by every instance in a process.

It is kept true by nbaccel's helpers: a DataLoader from ``nbaccel.prepare_data_loader``
registers itself while it is iterated (``active_dataloader``, ``end_of_dataloader``,
``remainder``), and ``nbaccel.accumulate`` decides ``sync_gradients`` for each micro-batch.

Example:
    >>> state = GradientState(GradientAccumulationPlugin(num_steps=2))
    >>> state.num_steps, state.sync_gradients, state.end_of_dataloader, state.remainder
    (2, True, False, -1)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nbaccel.state.partial import StateResetError
from nbaccel.state.plugins import GradientAccumulationPlugin


@dataclass
class _Progress:
    """The mutable shared state; one per process."""

    plugin: GradientAccumulationPlugin
    sync_gradients: bool = True
    is_xla_gradients_synced: bool = False
    micro_batches: int = 0  # counted by nbaccel.accumulate, modulo num_steps decides the sync
    # Weak references: a loop abandoned with `break` must not keep its DataLoader (and its
    # worker processes) alive through this process-wide object. None marks "no dataloader".
    loaders: list[weakref.ref[Any] | None] = field(default_factory=lambda: [None])


class GradientState:
    """Gradient-synchronisation state for gradient accumulation; every instance shares it.

    Args:
        gradient_accumulation_plugin: ``num_steps``, ``adjust_scheduler`` and
            ``sync_with_dataloader``. Passing one to a later ``GradientState(...)`` updates the
            shared state.

    Every attribute is read-only except ``is_xla_gradients_synced``.

    Attributes:
        sync_gradients: whether this micro-batch all-reduces gradients (set by ``accumulate``).
        end_of_dataloader: whether the active prepared DataLoader is yielding its last batch.
        remainder: how many samples padding added to the active DataLoader's last batch
            (duplicates to drop from gathered results); -1 outside a DataLoader loop.
        active_dataloader: the prepared DataLoader being iterated, or None.
        dataloader_references: [None, then every DataLoader being iterated, outermost first].
        num_steps, adjust_scheduler, sync_with_dataloader: from the plugin.
        is_xla_gradients_synced: False until set; nbaccel has no XLA path and never sets it.

    Example:
        >>> GradientState().sync_gradients
        True
    """

    _shared: ClassVar[_Progress | None] = None

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        plugin = gradient_accumulation_plugin
        if plugin is not None and not isinstance(plugin, GradientAccumulationPlugin):
            raise TypeError(
                f"GradientState takes a GradientAccumulationPlugin, got {plugin!r}; write GradientState(GradientAccumulationPlugin(num_steps=...))."
            )
        if GradientState._shared is None:
            GradientState._shared = _Progress(plugin or GradientAccumulationPlugin())
        elif plugin is not None:
            GradientState._shared.plugin = plugin

    @staticmethod
    def _reset_state() -> None:
        """Forget the shared state (for tests); the next ``GradientState()`` starts afresh."""
        GradientState._shared = None

    @property
    def _progress(self) -> _Progress:
        if GradientState._shared is None:
            raise StateResetError(
                "This GradientState was made before GradientState._reset_state() dropped the shared state. Create it again: state = GradientState()."
            )
        return GradientState._shared

    @property
    def initialized(self) -> bool:
        """Whether the shared state is set up (False only after a reset)."""
        return GradientState._shared is not None

    @property
    def num_steps(self) -> int:
        """Micro-batches per optimizer step."""
        return self._progress.plugin.num_steps

    @property
    def adjust_scheduler(self) -> bool:
        """Whether a scheduler should step once per optimizer step rather than per micro-batch."""
        return self._progress.plugin.adjust_scheduler

    @property
    def sync_with_dataloader(self) -> bool:
        """Whether the last batch of a prepared DataLoader always synchronises."""
        return self._progress.plugin.sync_with_dataloader

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        """The plugin's fields as a dict (Accelerate's name)."""
        return self._progress.plugin.to_kwargs()

    @property
    def sync_gradients(self) -> bool:
        """Whether gradients are all-reduced on this micro-batch."""
        return self._progress.sync_gradients

    @property
    def is_xla_gradients_synced(self) -> bool:
        """Whether XLA gradients were reduced before the optimizer step (never set by nbaccel)."""
        return self._progress.is_xla_gradients_synced

    @is_xla_gradients_synced.setter
    def is_xla_gradients_synced(self, value: bool) -> None:
        self._progress.is_xla_gradients_synced = bool(value)

    @property
    def dataloader_references(self) -> list[Any]:
        """``[None, loader, ...]``: every DataLoader being iterated, outermost first."""
        return [None if ref is None else ref() for ref in self._progress.loaders]

    @property
    def active_dataloader(self) -> Any:
        """The innermost prepared DataLoader being iterated, or None."""
        return self.dataloader_references[-1]

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared DataLoader is being iterated."""
        return self.active_dataloader is not None

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the active DataLoader is on its last batch (False outside a loop)."""
        return bool(getattr(self.active_dataloader, "end_of_dataloader", False))

    @property
    def remainder(self) -> int:
        """Samples added by padding the active DataLoader's last batch; -1 outside a loop."""
        loader = self.active_dataloader
        return -1 if loader is None else int(getattr(loader, "remainder", -1))

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self._progress.sync_gradients = sync_gradients

    def _add_dataloader(self, dataloader: Any) -> None:
        """Called by a prepared DataLoader when its iteration starts."""
        self._progress.loaders.append(weakref.ref(dataloader))

    def _remove_dataloader(self, dataloader: Any) -> None:
        """Called by a prepared DataLoader when its iteration ends (or is abandoned)."""
        live = [ref for ref in self._progress.loaders[1:] if ref is not None and ref() is not None]
        for position in range(len(live) - 1, -1, -1):  # the innermost use of this loader ends
            if live[position]() is dataloader:
                del live[position]
                break
        self._progress.loaders = [None, *live]

    def _count_micro_batch(self) -> bool:
        """Count one micro-batch and decide whether it synchronises; used by ``accumulate``.

        Every ``num_steps``-th micro-batch synchronises, and so does the last batch of a
        prepared DataLoader when ``sync_with_dataloader`` (then the count starts over), so no
        half-accumulated gradient leaks into the next epoch.
        """
        progress = self._progress
        if self.sync_with_dataloader and self.end_of_dataloader:
            progress.micro_batches = 0
            sync = True
        else:
            progress.micro_batches += 1
            sync = progress.micro_batches % progress.plugin.num_steps == 0
        progress.sync_gradients = sync
        return sync

    def __repr__(self) -> str:
        return (
            f"Sync Gradients: {self.sync_gradients}\n"
            f"At end of current dataloader: {self.end_of_dataloader}\n"
            f"Extra samples added: {self.remainder}\n"
            f"Gradient accumulation plugin: {self._progress.plugin}\n"
        )
