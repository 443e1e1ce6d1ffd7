"""``AcceleratorState``: ``PartialState`` plus the training configuration (mixed precision, plugins).

nbaccel does not configure DeepSpeed, FSDP, Megatron-LM, tensor parallelism or torch.compile
itself: the plugins are stored as given, for the code (yours, or a library's) that does.

Example (from a fresh process state: an earlier ``AcceleratorState`` fixes mixed precision):
    >>> AcceleratorState._reset_state(reset_partial_state=True)
    >>> state = AcceleratorState(mixed_precision="bf16")
    >>> state.mixed_precision, state.num_processes
    ('bf16', 1)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from nbaccel.devices import driver, nvml
from nbaccel.errors import NbaccelError
from nbaccel.state.launch_env import normalize_mixed_precision
from nbaccel.state.partial import PartialState, StateResetError
from nbaccel.wire.rank_env import FORK_LAUNCHED

DEFAULT_DEEPSPEED_NAME = "default"
_PLUGIN_NAMES = ("dynamo_plugin", "fsdp_plugin", "torch_tp_plugin", "megatron_lm_plugin", "parallelism_config")


class PluginNotFoundError(NbaccelError, KeyError):
    """No DeepSpeed plugin has the requested name (a KeyError, as a dict lookup would raise)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


@dataclass
class _Config:
    """What ``AcceleratorState`` adds to ``PartialState``; set up at its first construction."""

    mixed_precision: str
    plugins: dict[str, Any]
    deepspeed_plugins: dict[str, Any] = field(default_factory=dict)
    selected_deepspeed: str | None = None


class AcceleratorState(PartialState):
    """The process state plus the training configuration; every instance shares one.

    Has every attribute and method of ``PartialState`` (it creates one if needed), and adds
    ``mixed_precision`` (validated against the device), the plugins as given, and
    ``parallelism_config``. Unlike Accelerate, you may construct it directly.

    nbaccel does not set up DeepSpeed, FSDP, Megatron-LM, tensor parallelism or dynamo: the
    plugins are kept for the code that does, and ``distributed_type`` stays NO, MULTI_CPU or
    MULTI_GPU.

    Args:
        mixed_precision: "no", "fp16", "bf16" or "fp8"; default ACCELERATE_MIXED_PRECISION (set by
            the launcher), else "no". fp8 needs a CUDA GPU of compute capability 8.9 or newer.
        cpu: see ``PartialState``.
        deepspeed_plugin: one plugin, or a dict from name to plugin (the first is selected).
        dynamo_plugin, fsdp_plugin, torch_tp_plugin, megatron_lm_plugin, parallelism_config:
            stored as given, under the same names.
        **kwargs: passed to ``torch.distributed.init_process_group`` (see ``PartialState``).

    Raises:
        ValueError: an unknown or unsupported mixed precision, or a later construction that
            asks for a different configuration (reset with ``AcceleratorState._reset_state()``).

    Example:
        >>> AcceleratorState._reset_state(reset_partial_state=True)  # the plugins are fixed at the first one
        >>> state = AcceleratorState(deepspeed_plugin={"train": "cfg-a", "eval": "cfg-b"})
        >>> state.deepspeed_plugin
        'cfg-a'
        >>> state.select_deepspeed_plugin("eval"); state.deepspeed_plugin
        'cfg-b'
    """

    _config: ClassVar[_Config | None] = None

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        dynamo_plugin: Any = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        parallelism_config: Any = None,
        _from_accelerator: bool = False,  # Accelerate's guard; nbaccel lets anyone construct it
        **kwargs: Any,
    ) -> None:
        super().__init__(cpu=cpu, **kwargs)
        plugins = {
            "dynamo_plugin": dynamo_plugin,
            "fsdp_plugin": fsdp_plugin,
            "torch_tp_plugin": torch_tp_plugin,
            "megatron_lm_plugin": megatron_lm_plugin,
            "parallelism_config": parallelism_config,
        }
        precision = None if mixed_precision is None else normalize_mixed_precision(mixed_precision, "mixed_precision")
        deepspeed = _named_deepspeed_plugins(deepspeed_plugin)
        if AcceleratorState._config is None:
            precision = precision or super().mixed_precision  # the launcher's choice
            check_precision_supported(precision, self.device)
            AcceleratorState._config = _Config(precision, plugins, deepspeed, next(iter(deepspeed), None))
        else:
            _check_same_config(AcceleratorState._config, precision, plugins, deepspeed)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """Forget the configuration (and the process state too with ``reset_partial_state=True``).

        Example:
            >>> AcceleratorState._reset_state(reset_partial_state=True)
        """
        AcceleratorState._config = None
        if reset_partial_state:
            PartialState._reset_state()

    @property
    def _configuration(self) -> _Config:
        config = AcceleratorState._config
        if config is None:
            raise StateResetError(
                "This AcceleratorState was made before AcceleratorState._reset_state() dropped the "
                "shared configuration. Create it again: state = AcceleratorState(...)."
            )
        return config

    @property
    def initialized(self) -> bool:
        """Whether the shared configuration (and the process state under it) is set up."""
        return AcceleratorState._config is not None and PartialState._shared is not None

    @property
    def mixed_precision(self) -> str:
        """The mixed precision of this run: "no", "fp16", "bf16" or "fp8"."""
        return self._configuration.mixed_precision

    @property
    def dynamo_plugin(self) -> Any:
        """The dynamo plugin as given (nbaccel does not compile anything itself)."""
        return self._configuration.plugins["dynamo_plugin"]

    @property
    def fsdp_plugin(self) -> Any:
        """The FSDP plugin as given (nbaccel does not wrap models in FSDP itself)."""
        return self._configuration.plugins["fsdp_plugin"]

    @property
    def torch_tp_plugin(self) -> Any:
        """The tensor-parallel plugin as given."""
        return self._configuration.plugins["torch_tp_plugin"]

    @property
    def megatron_lm_plugin(self) -> Any:
        """The Megatron-LM plugin as given."""
        return self._configuration.plugins["megatron_lm_plugin"]

    @property
    def parallelism_config(self) -> Any:
        """The parallelism configuration as given."""
        return self._configuration.plugins["parallelism_config"]

    @property
    def deepspeed_plugins(self) -> dict[str, Any]:
        """Every DeepSpeed plugin by name (one plugin given alone is named "default")."""
        return dict(self._configuration.deepspeed_plugins)

    @property
    def deepspeed_plugin(self) -> Any:
        """The selected DeepSpeed plugin (the one given, or the first of a dict), or None."""
        config = self._configuration
        return None if config.selected_deepspeed is None else config.deepspeed_plugins[config.selected_deepspeed]

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin called ``name``.

        Example:
            >>> state = AcceleratorState(deepspeed_plugin={"train": "cfg-a", "eval": "cfg-b"})
            >>> state.get_deepspeed_plugin("eval")
            'cfg-b'
        """
        plugins = self._configuration.deepspeed_plugins
        if name not in plugins:
            raise PluginNotFoundError(_unknown_plugin_message(name, plugins))
        return plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Make the plugin called ``name`` the selected one (``deepspeed_plugin``), unselecting the others.

        ``name`` may be left out when there is exactly one plugin.

        Example:
            >>> state = AcceleratorState(deepspeed_plugin={"train": "cfg-a", "eval": "cfg-b"})
            >>> state.select_deepspeed_plugin("eval"); state.deepspeed_plugin
            'cfg-b'
        """
        config = self._configuration
        if name is None:
            if len(config.deepspeed_plugins) != 1:
                raise ValueError(
                    "select_deepspeed_plugin() needs a name when there is not exactly one DeepSpeed "
                    f"plugin; the plugins are {sorted(config.deepspeed_plugins)!r}."
                )
            name = next(iter(config.deepspeed_plugins))
        if name not in config.deepspeed_plugins:
            raise PluginNotFoundError(_unknown_plugin_message(name, config.deepspeed_plugins))
        config.selected_deepspeed = name

    def __repr__(self) -> str:
        return super().__repr__() + f"Mixed precision type: {self.mixed_precision}\n"


def check_precision_supported(precision: str, device: torch.device) -> None:
    """Raise when ``device`` cannot run ``precision``; fp16 and bf16 also work on CPU (autocast).

    The GPU's compute capability comes from NVML, so a kernel's ``AcceleratorState("bf16")``
    leaves CUDA uninitialised (and the kernel fork-safe). Where NVML cannot answer, only a
    process whose CUDA is up anyway (a rank) asks torch; the kernel leaves the check to its ranks.
    """
    if precision not in ("fp8", "bf16"):
        return
    if device.type != "cuda":
        if precision == "fp8":
            raise ValueError(
                f"mixed_precision='fp8' needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper), but this process runs on {_describe(device, None)}. Use 'bf16' instead."
            )
        return
    capability = device_capability(device)
    if capability is None:
        return  # unknown here without initialising CUDA: each rank checks on its own device
    if precision == "fp8" and capability < (8, 9):
        raise ValueError(
            f"mixed_precision='fp8' needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper), but this process runs on {_describe(device, capability)}. Use 'bf16' instead."
        )
    if precision == "bf16" and not nvml.supports_bf16(capability):
        raise ValueError(
            f"mixed_precision='bf16' is not supported by {_describe(device, capability)} (it needs compute capability 8.0 or newer). Use 'fp16' instead."
        )


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """``device``'s compute capability, from NVML; from torch only where CUDA is initialised already."""
    found = nvml.visible_gpus()
    index = device.index or 0
    if found is not None and index < len(found) and found[index].capability != (0, 0):
        return found[index].capability
    cuda_up = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if cuda_up or driver.cuda_initialised() or os.environ.get(FORK_LAUNCHED) == "1":
        return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]
    return None


def _describe(device: torch.device, capability: tuple[int, int] | None) -> str:
    if device.type != "cuda" or capability is None:
        return f"the {device.type.upper()}"
    found = nvml.visible_gpus() or []
    index = device.index or 0
    name = found[index].name if index < len(found) else torch.cuda.get_device_name(device)
    return f"{name} (compute capability {capability[0]}.{capability[1]})"


def _named_deepspeed_plugins(plugin: Any) -> dict[str, Any]:
    if plugin is None:
        return {}
    if not isinstance(plugin, Mapping):
        return {DEFAULT_DEEPSPEED_NAME: plugin}
    if not plugin:
        raise ValueError("deepspeed_plugin={} names no plugin; pass None, one plugin, or a dict from name to plugin.")
    bad = [name for name in plugin if not isinstance(name, str) or not name]
    if bad:
        raise TypeError(f"deepspeed_plugin dict keys must be non-empty plugin names (str), got {bad!r}.")
    return dict(plugin)


def _check_same_config(config: _Config, precision: str | None, plugins: dict[str, Any], deepspeed: dict[str, Any]) -> None:
    """A later construction may repeat the configuration or leave it out, but not change it."""
    changed = []
    if precision is not None and precision != config.mixed_precision:
        changed.append(f"mixed_precision={precision!r} (set up with {config.mixed_precision!r})")
    for name in _PLUGIN_NAMES:
        if plugins[name] is not None and not _same(plugins[name], config.plugins[name]):
            changed.append(f"{name}={plugins[name]!r} (set up with {config.plugins[name]!r})")
    if deepspeed and not _same(deepspeed, config.deepspeed_plugins):
        changed.append(f"deepspeed_plugin={deepspeed!r} (set up with {config.deepspeed_plugins!r})")
    if changed:
        raise ValueError(
            f"AcceleratorState was already set up, and its configuration cannot change: "
            f"{'; '.join(changed)}. Pass the same values (or none), or call "
            "AcceleratorState._reset_state() first."
        )


def _same(given: Any, stored: Any) -> bool:
    try:
        return given is stored or bool(given == stored)
    except Exception:  # noqa: BLE001 - objects whose == raises or is ambiguous (arrays) count as new
        return False


def _unknown_plugin_message(name: object, plugins: Mapping[str, Any]) -> str:
    if not plugins:
        return f"no DeepSpeed plugin called {name!r}: AcceleratorState was given no deepspeed_plugin."
    return f"no DeepSpeed plugin called {name!r}; the plugins are {sorted(plugins)!r}."
