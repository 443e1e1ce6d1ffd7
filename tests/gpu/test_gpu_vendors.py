"""GPU tier: the one GPU map against real hardware (marker ``gpu``; skipped where no GPU is visible).

What the stand-ins decided in CI, asked of a real driver: the map counts what torch counts, and a
GPU another process holds memory on is reported busy. Everything that would initialise a GPU
runtime runs in a child interpreter: the test process stays fork-safe.

Imports internals (devices.inventory, launch.plan): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from nbaccel.devices.inventory import gpu_inventory
from nbaccel.launch.plan import busy_gpus
from nbaccel.testing import scaled

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

COUNT = """
import json, torch
from nbaccel.devices.inventory import gpu_inventory
found = gpu_inventory()
counted = {"cuda": torch.cuda.device_count, "xpu": lambda: torch.xpu.device_count()}.get(found.device_type, lambda: 0)()
print(json.dumps({"ours": len(found.devices), "type": found.device_type, "vendor": found.vendor, "torch": counted, "notes": found.notes}))
"""

HOLD = """
import sys, time, torch
kind = sys.argv[1]
held = torch.empty(2**30, dtype=torch.uint8, device=f"{kind}:0")
getattr(torch, kind).synchronize()
print("ready", flush=True)
time.sleep(120)
"""


def test_the_gpu_map_counts_what_the_installed_torch_counts() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(COUNT)], capture_output=True, text=True, timeout=scaled(120), check=True)
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["ours"] == seen["torch"] > 0, seen
    assert seen["notes"] == [], seen  # a GPU build beside its own GPUs says nothing


def test_a_gpu_another_process_holds_memory_on_is_reported_busy() -> None:
    import torch

    found = gpu_inventory()
    if found.vendor == "intel":
        pytest.skip("Intel GPUs publish no per-process memory without Level Zero: never reported busy")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLD), found.device_type], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        busy = busy_gpus(found)
        assert 0 in busy, busy
        assert "GiB used by pid" in busy[0] or "in use by processes not listed here" in busy[0], busy  # another pid namespace lists none of ours
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert not torch.cuda.is_initialized()  # the test process never touched the GPU
