"""Accelerate's own ``PartialState()`` sees the launch's world in a CPU rank (rank side).

Why this is needed, read in ``accelerate/state.py`` (1.15.0): ``PartialState(cpu=False)`` calls
``_prepare_backend``, which looks for an accelerator only because ``LOCAL_RANK`` is set, finds
none on a CPU rank, and chooses ``MULTI_CPU`` only ``if ... and cpu`` (that ``and cpu`` is not in
1.0.0, which falls back to MULTI_CPU by itself). So the type stays ``NO`` and the backend
``None``; the "other backends" branch still calls ``init_process_group(backend=None)``, which
forms a real group of the whole world, and the state then records ``num_processes=1``,
``process_index=0`` on every rank: every rank is the main process and trains alone.
``ACCELERATE_USE_CPU`` (which the launcher exports) is read by ``AcceleratorState`` only, so
``Accelerator()`` first is right and ``PartialState()`` first is not; no variable reaches
``PartialState``.

The fix: in a rank of a CPU launch, as soon as ``accelerate.state`` is imported (or now, if the
kernel had imported it before the fork), ``PartialState``'s ``cpu`` is taken as true. That is
what ``accelerate launch --cpu`` means, and the one value that can work where the launch gave the
ranks no accelerator. A GPU launch is left alone: Accelerate finds CUDA itself.

Example (what the bootstrap does in a rank)::

    install(device_type=os.environ["NBACCEL_DEVICE_TYPE"])
    from accelerate import PartialState
    PartialState().distributed_type  # DistributedType.MULTI_CPU, backend "gloo"
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

from nbaccel.rank.import_hooks import when_imported

_PATCHED = "_nbaccel_cpu_world"  # marks the wrapper, so a second install does not wrap twice


def install(device_type: str | None) -> None:
    """On a CPU launch, make ``accelerate.state.PartialState`` choose MULTI_CPU without ``cpu=True``."""
    if device_type == "cpu":
        when_imported("accelerate.state", _partial_state_on_cpu)


def _partial_state_on_cpu(module: ModuleType) -> None:
    partial_state = module.PartialState
    original = partial_state.__init__
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, cpu: bool = True, **kwargs: Any) -> None:
        # cpu=False cannot be honoured on a rank without an accelerator: it would mean "one
        # process alone" (DistributedType.NO) while torch.distributed holds the whole world.
        original(self, True, **kwargs)

    setattr(__init__, _PATCHED, True)
    partial_state.__init__ = __init__
