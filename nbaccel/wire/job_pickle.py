"""A launch's job as bytes, for ranks that do not share the kernel's memory (spawn, fork server).

The job is pickled once per launch (not once per rank) with cloudpickle, so notebook functions,
lambdas and closures travel by value; the function keeps its cell's source (nbaccel.wire.portable).
A CUDA tensor the function captured (a notebook's ``.cuda()`` model) would otherwise be rebuilt
on the GPU it lived on in the kernel, ``cuda:0`` in every rank, before the rank pins its device:
it travels as a CPU copy and is rebuilt on the rank's own device (``torch.cuda.current_device()``
once the rank pinned it), so the job must be loaded after pinning (nbaccel.rank.bootstrap does).

Example:
    >>> from nbaccel.wire.job import Job
    >>> offset = 10
    >>> job = load_job(dump_job(Job(lambda x: x + offset, (1,))))
    >>> job.function(*job.args)
    11
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

from nbaccel.wire import shm
from nbaccel.wire.job import Job
from nbaccel.wire.portable import Sourced


def dump_job(job: Job, gpu_tensors: list[str] | None = None, attached: shm.Attachments | None = None) -> bytes:
    """``job`` as bytes; CUDA tensors it holds (anywhere in its closure) become CPU copies that
    each rank rebuilds on its own device, each described in ``gpu_tensors`` when given. With
    ``attached``, tensors and arrays of 1 MiB or more travel as memfds (nbaccel.wire.shm)."""
    import cloudpickle

    portable = type(job)(Sourced.wrap(job.function), job.args, job.pass_ends)
    buffer = io.BytesIO()
    base = shm.pickler_class(cloudpickle.Pickler, attached, to_cpu=False)
    _job_pickler(base, [] if gpu_tensors is None else gpu_tensors)(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(portable)
    return buffer.getvalue()


def load_job(payload: bytes, mailbox: shm.Mailbox | None = None) -> Job:
    """The job back, in the rank (after its device is pinned); its memfds from ``mailbox``."""
    job: Job = shm.loads(payload, mailbox)  # bytes from our own kernel, over a private pipe or memfd
    return job


def is_gpu_tensor(tensor: Any) -> bool:
    """True for a tensor on a CUDA device (the kernel's copy must not be rebuilt there)."""
    return bool(tensor.device.type == "cuda")


def describe_tensor(tensor: Any) -> str:
    """``"float32[1024, 1024] on cuda:0, 4.0 MiB"``."""
    return f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)} on {tensor.device}, {tensor.nbytes / 2**20:.1f} MiB"


def _job_pickler(base: type, noted: list[str]) -> type:
    torch = sys.modules.get("torch")

    class JobPickler(base):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            if torch is not None and isinstance(obj, torch.Tensor) and is_gpu_tensor(obj):
                parameter = isinstance(obj, torch.nn.Parameter)
                noted.append(describe_tensor(obj))
                return (on_rank_device, (obj.detach().cpu(), parameter, obj.requires_grad))
            return super().reducer_override(obj)

    return JobPickler


def on_rank_device(cpu_copy: Any, parameter: bool, requires_grad: bool) -> Any:
    """Rank side: the captured tensor on this rank's GPU (the CPU when it has none)."""
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if _rank_uses_cuda() else torch.device("cpu")
    tensor = cpu_copy.to(device)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _rank_uses_cuda() -> bool:
    import os

    return os.environ.get("NBACCEL_DEVICE_TYPE") == "cuda"
