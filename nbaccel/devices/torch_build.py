"""Which accelerators the installed torch can drive, read off ``torch.version`` without initialising anything.

A CUDA driver beside a CPU-only torch (``pip install torch`` from the CPU index on a GPU box)
has GPUs that no rank can use: ``torch.cuda.set_device`` fails in every one. So GPUs count only
for the build's own kind: ``torch.version.hip`` set is a ROCm build (AMD, through ``torch.cuda``),
``torch.version.cuda`` a CUDA build (NVIDIA), ``torch.version.xpu`` an XPU build (Intel); none of
them a CPU build. These are plain strings written when torch was built: reading them loads no
driver and runs no runtime.

Example:
    >>> build = TorchBuild("2.13.0+cpu", cuda=None, hip=None, xpu=None)
    >>> build.kind, build.vendor, build.device_type
    ('cpu', '', 'cpu')
    >>> TorchBuild("2.13.0+rocm6.4", cuda=None, hip="6.4.1", xpu=None).device_type
    'cuda'
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

# The wheel indexes for each kind (https://pytorch.org/get-started/locally/); the fix a notice names.
INDEX = "https://download.pytorch.org/whl"
_CUDA_INDEXES = ((13, 0), (12, 8), (12, 6), (11, 8))  # newest first: the newest the driver supports is named
ROCM_INDEX = f"{INDEX}/rocm6.4"
XPU_INDEX = f"{INDEX}/xpu"


@dataclass(frozen=True)
class TorchBuild:
    """torch's version and the accelerator toolkits it was built against (None: not built for it)."""

    version: str
    cuda: str | None
    hip: str | None
    xpu: str | None

    @property
    def kind(self) -> str:
        """``"rocm"``, ``"cuda"``, ``"xpu"`` or ``"cpu"`` (a ROCm build also sets nothing else)."""
        return "rocm" if self.hip else "cuda" if self.cuda else "xpu" if self.xpu else "cpu"

    @property
    def vendor(self) -> str:
        """Whose GPUs this build drives: ``"nvidia"``, ``"amd"``, ``"intel"``, or ``""``."""
        return {"rocm": "amd", "cuda": "nvidia", "xpu": "intel"}.get(self.kind, "")

    @property
    def device_type(self) -> str:
        """torch's device type for those GPUs: ``"cuda"`` (NVIDIA and AMD), ``"xpu"``, or ``"cpu"``."""
        return {"rocm": "cuda", "cuda": "cuda", "xpu": "xpu"}.get(self.kind, "cpu")

    def describe(self) -> str:
        """``torch 2.13.0+cpu, a CPU-only build`` and the like, for notices."""
        what = {"rocm": f"a ROCm {self.hip} build", "cuda": f"a CUDA {self.cuda} build", "xpu": "an XPU build"}.get(self.kind, "a CPU-only build")
        return f"torch {self.version} is {what}"


def installed_build(torch: Any | None = None) -> TorchBuild | None:
    """The build of ``torch`` (default: the one imported in this process); None where torch is
    not imported (nothing is imported to find out)."""
    torch = sys.modules.get("torch") if torch is None else torch
    version = getattr(torch, "version", None)
    if version is None:
        return None
    return TorchBuild(str(getattr(torch, "__version__", "?")), _text(version, "cuda"), _text(version, "hip"), _text(version, "xpu"))


def _text(version: Any, name: str) -> str | None:
    value = getattr(version, name, None)
    return str(value) if value else None


def install_hint(vendor: str, cuda_driver: tuple[int, int] | None = None) -> str:
    """The pip command that installs a torch build for ``vendor``'s GPUs.

    ``cuda_driver`` is the newest CUDA the NVIDIA driver supports: the newest wheel index at or
    below it is named.

    >>> install_hint("nvidia", (12, 7))
    'pip install torch --index-url https://download.pytorch.org/whl/cu126'
    >>> install_hint("intel")
    'pip install torch --index-url https://download.pytorch.org/whl/xpu'
    """
    if vendor == "amd":
        return f"pip install torch --index-url {ROCM_INDEX}"
    if vendor == "intel":
        return f"pip install torch --index-url {XPU_INDEX}"
    fits = [v for v in _CUDA_INDEXES if v <= cuda_driver] if cuda_driver else [(12, 8)]  # unknown: a common one
    major, minor = fits[0] if fits else _CUDA_INDEXES[-1]
    return f"pip install torch --index-url {INDEX}/cu{major}{minor}"
