"""The checks of ``scripts/gpu-check``, one per process: ``python3 scripts/gpu_check_cases.py NAME``.

The process plays the notebook kernel (the device image has no ipykernel: nbaccel forks from any
Python process the same way; the ``%distributed`` checks drive IPython's shell in-process). It
prints its figures as one last line, ``GPU-CHECK-RESULT {"status": ..., "figures": {...}}``;
``scripts/gpu_check.py`` runs each under its own time limit and collects them.

    python3 scripts/gpu_check_cases.py driver-probe
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

MARK = "GPU-CHECK-RESULT "
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's nbaccel, however started
CASES: dict[str, Callable[[], dict[str, Any]]] = {}


class CheckFailed(Exception):
    """The check ran and found nbaccel wrong."""


class Skipped(Exception):
    """The check cannot run here (said why)."""


def case(name: str) -> Callable[[Callable[[], dict[str, Any]]], Callable[[], dict[str, Any]]]:
    def register(function: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        CASES[name] = function
        return function

    return register


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def driver_state() -> str:
    from nbaccel.devices import driver

    return driver.driver_state().value


def untouched() -> bool:
    return driver_state() in ("not loaded", "uninitialised")


def error_text(error: BaseException) -> str:
    report = getattr(error, "report", None)
    return report() if callable(report) else f"{type(error).__name__}: {error}"


# -- cases that run without a GPU ----------------------------------------------------------------


@case("environment")
def environment() -> dict[str, Any]:
    import torch

    from nbaccel.devices import nvml
    from nbaccel.launch.preflight import fork_hazards

    gpus = nvml.visible_gpus() or []
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nvml_visible_gpus": nvml.visible_count(),
        "gpu_names": [g.name for g in gpus],
        "capabilities": [list(g.capability) for g in gpus],
        "driver_version": nvml.driver_version(),
        "driver_state_in_kernel": driver_state(),
        "fork_hazards": [getattr(h, "kind", "?") for h in fork_hazards()],
        "cpu_cores": len(os.sched_getaffinity(0)),
        "ipython": _version_of("IPython"),
    }


def _version_of(module: str) -> str | None:
    try:
        return str(__import__(module).__version__)
    except ImportError:
        return None


@case("cpu-launch")
def cpu_launch() -> dict[str, Any]:
    import nbaccel

    started = time.perf_counter()
    result = nbaccel.notebook_launcher(_rank_number, num_processes=2, cpu=True, timeout=60)
    expect(result == [0, 1], f"two CPU ranks returned {result!r}")
    return {"seconds": round(time.perf_counter() - started, 3)}


def _rank_number() -> int:
    return int(os.environ["RANK"])


# -- one GPU -------------------------------------------------------------------------------------


@case("driver-probe")
def driver_probe() -> dict[str, Any]:
    """The kernel stays uninitialised through is_available, a plan, AcceleratorState("bf16"), a launch, its GPU result."""
    import torch

    import nbaccel
    from nbaccel.launch.options import LaunchOptions
    from nbaccel.launch.plan import make_plan

    states = {"start": driver_state()}
    states["is_available"] = (torch.cuda.is_available(), driver_state())
    plan = make_plan(LaunchOptions(), time.monotonic())
    states["plan"] = (plan.device_type, driver_state())
    state = nbaccel.AcceleratorState(mixed_precision="bf16")
    states["accelerator_bf16"] = (state.mixed_precision, driver_state())
    nbaccel.AcceleratorState._reset_state(True)
    [result] = nbaccel.notebook_launcher(_gpu_tensor, num_processes=1, timeout=120)
    states["launch_and_unpickle"] = (str(result.device), float(result.sum()), driver_state())
    expect(all((s if isinstance(s, str) else s[-1]) in ("not loaded", "uninitialised") for s in states.values()), f"the kernel's driver state moved: {states}")
    return {"states": states}


def _gpu_tensor() -> Any:
    import torch

    return torch.ones(4, device="cuda") * 2


@case("is-available-then-launch")
def is_available_then_launch() -> dict[str, Any]:
    import torch

    import nbaccel
    from nbaccel.launch.plan import choose_starter

    expect(torch.cuda.is_available(), "torch.cuda.is_available() is False on a GPU machine")
    starter = type(choose_starter("auto", 1)).__name__
    started = time.perf_counter()
    result = nbaccel.notebook_launcher(_gpu_tensor, num_processes=1, timeout=120)
    expect(float(result[0].sum()) == 8.0, f"the launch returned {result!r}")
    expect(starter == "ForkStarter", f"the kernel was not forked after is_available() ({starter})")
    return {"starter": starter, "seconds": round(time.perf_counter() - started, 3), "driver_state": driver_state()}


@case("cuinit-routes-to-spawn")
def cuinit_routes_to_spawn() -> dict[str, Any]:
    """With PYTORCH_NVML_BASED_CUDA_CHECK=0 (set by the runner), is_available() runs cuInit: the
    launch must not fork; it starts from the fork server (exec'd here: no server was forked early)."""
    import torch

    import nbaccel
    from nbaccel.launch.plan import choose_starter

    expect(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "0", "the runner did not set PYTORCH_NVML_BASED_CUDA_CHECK=0")
    torch.cuda.is_available()
    state, flag = driver_state(), torch.cuda.is_initialized()
    starter = type(choose_starter("auto", 1)).__name__
    started = time.perf_counter()
    result = nbaccel.notebook_launcher(_gpu_tensor, num_processes=1, timeout=120)
    expect(float(result[0].sum()) == 8.0, f"the launch returned {result!r}")
    expect(state == "initialised" and starter in ("ServerStarter", "SpawnStarter"), f"driver {state}, torch flag {flag}, starter {starter}")
    return {"driver_state": state, "torch_is_initialized": flag, "starter": starter, "seconds": round(time.perf_counter() - started, 3)}


_CAPTURED: Any = None


def _nccl_through_server() -> tuple[float, str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    t = torch.ones(1, device=f"cuda:{os.environ['LOCAL_RANK']}")
    dist.all_reduce(t)
    return t.item(), str(_CAPTURED.device), float(_CAPTURED.sum())


@case("fork-server-nccl")
def fork_server_nccl() -> dict[str, Any]:
    """The fork server forked while the process was clean; then CUDA is initialised here and a
    captured CUDA tensor is carried: one rank per GPU from the server, on NCCL, the tensor on the
    rank's own GPU. Figures: the launch through the server against the first (which imports)."""
    global _CAPTURED
    import torch

    import nbaccel
    from nbaccel.launch.starters import fork_server

    fork_server.start_early()
    server = fork_server.running_server()
    expect(server is not None and server.how == "forked", f"no server forked early ({server and server.how})")
    _CAPTURED = torch.arange(4.0, device="cuda")
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        results = nbaccel.notebook_launcher(_nccl_through_server, timeout=120)
        timings.append(round(time.perf_counter() - started, 3))
    n = torch.cuda.device_count()
    expect([r[1] for r in results] == [f"cuda:{i}" for i in range(n)], f"captured tensor on {[r[1] for r in results]}")
    expect({r[2] for r in results} == {6.0} and {r[0] for r in results} == {float(n)}, f"results {results!r}")
    uss = 0
    try:
        import psutil

        uss = psutil.Process(server.pid).memory_full_info().uss  # type: ignore[union-attr]
    except ImportError:
        pass
    fork_server.shutdown()
    return {"ranks": n, "seconds": timings, "server_uss_mb": round(uss / 2**20, 1)}


@case("nccl-ddp-one-rank")
def nccl_ddp_one_rank() -> dict[str, Any]:
    import nbaccel

    started = time.perf_counter()
    [answer] = nbaccel.notebook_launcher(_ddp_step, num_processes=1, timeout=180)
    expect(answer["backend"] == "nccl", f"the one rank's group is {answer['backend']!r}")
    return {**answer, "seconds": round(time.perf_counter() - started, 3)}


def _ddp_step() -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    state = nbaccel_state()
    model = DistributedDataParallel(torch.nn.Linear(64, 64).to(state.device))
    loss = model(torch.randn(8, 64, device=state.device)).sum()
    loss.backward()
    return {"backend": dist.get_backend(), "world_size": dist.get_world_size(), "device": str(state.device), "loss": float(loss)}


def nbaccel_state() -> Any:
    import nbaccel

    return nbaccel.PartialState()


@case("pool-oom")
def pool_oom() -> dict[str, Any]:
    import nbaccel

    pool = nbaccel.start_workers(1)
    try:
        try:
            pool.run(_allocate_too_much, timeout=120)
            raise CheckFailed("allocating 100 TiB on the GPU did not fail")
        except nbaccel.RankFailedError as error:
            text = error_text(error)
        expect("OutOfMemoryError" in text, f"the error does not name the out-of-memory: {text[:300]}")
        kept = pool.alive and pool.run(_rank_number, timeout=60) == [0]
        expect(kept, "the pool was not kept after an out-of-memory cell")
        return {"error": text.splitlines()[0][:200], "pool_kept": kept}
    finally:
        pool.stop()


def _allocate_too_much() -> None:
    import torch

    torch.empty(2**45, device="cuda")


@case("device-assert")
def device_assert() -> dict[str, Any]:
    import nbaccel

    pool = nbaccel.start_workers(1)
    try:
        try:
            pool.run(_device_side_assert, timeout=120)
            raise CheckFailed("an out-of-bounds index on the GPU did not fail")
        except nbaccel.RankFailedError as error:
            text = error_text(error)
        later = _later_cell(pool)
        expect(
            "rank 0" in text and ("device-side assert" in text or "CUDA error" in text), f"the error does not name the rank and the CUDA error: {text[:300]}"
        )
        expect(not pool.alive or "ended" in later, f"the broken worker was kept: a later cell gave {later!r}")
        expect("%distributed restart" in text + later, "neither the error nor the next cell says %distributed restart")
        return {"error": text.splitlines()[0][:200], "later_cell": later[:200], "pool_alive": pool.alive}
    finally:
        pool.stop()


def _device_side_assert() -> None:
    import torch

    values = torch.zeros(4, device="cuda")
    values[torch.tensor([40], device="cuda")] = 1.0
    torch.cuda.synchronize()


def _later_cell(pool: Any) -> str:
    try:
        return repr(pool.run(_rank_number, timeout=60))
    except Exception as error:  # noqa: BLE001 - the message is the figure
        return error_text(error)


@case("distributed-free")
def distributed_free() -> dict[str, Any]:
    shell = ipython_shell()
    outputs = [run_cell(shell, "%distributed start -n 1")]
    outputs.append(run_cell(shell, "%%distributed\nimport torch\nx = torch.empty(2**28, device='cuda'); del x"))
    freed = run_cell(shell, "%distributed free")
    outputs.append(run_cell(shell, "%distributed stop"))
    expect("MiB" in freed or "GiB" in freed, f"%distributed free said {freed!r}")
    return {"free_said": freed.strip()[:300], "outputs": [o.strip()[-200:] for o in outputs]}


def ipython_shell() -> Any:
    try:
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        raise Skipped("IPython is not installed (carry its wheels: scripts/gpu-check-wheels)") from None
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbaccel")
    return shell


def run_cell(shell: Any, code: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = shell.run_cell(code)
    text = out.getvalue()
    if result.error_in_exec is not None:
        text += error_text(result.error_in_exec)
    return text


@case("no-gpu-process-after-stop")
def no_gpu_process_after_stop() -> dict[str, Any]:
    import nbaccel

    pool = nbaccel.start_workers(1)
    pool.run(_gpu_tensor, timeout=120)
    during = gpu_processes()
    pool.stop()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and gpu_processes():
        time.sleep(0.2)
    after = gpu_processes()
    expect(during != [], "nvidia-smi showed no process on the GPU while a worker held CUDA memory (cannot judge)")
    expect(after == [], f"processes still on the GPU after stop: {after}")
    return {"during": during, "after": after}


def gpu_processes() -> list[int]:
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False)
    return sorted(int(p) for p in done.stdout.split() if p.strip().isdigit())


@case("gpu-use-sampled")
def gpu_use_sampled() -> dict[str, Any]:
    import nbaccel
    from nbaccel.testing import CollectingSink

    sink = CollectingSink()
    [pid] = nbaccel.notebook_launcher(_hold_a_gib_on_the_gpu, num_processes=1, output=sink, timeout=120)
    samples = [e for e in sink.events.get(0, []) if e.get("type") == "resources"]
    expect(samples != [], "the kernel sent no resource sample of the rank in 3.5 s")
    held = [s.get("gpu_mem") for s in samples]
    utilisation = [s.get("gpu_util") for s in samples]
    try:
        listed: Any = gpu_processes()  # as nvidia-smi sees them: the rank's pid, or (in a pid namespace) another
    except OSError as error:
        listed = f"unknown ({error})"
    expect(
        any(h is not None and h > 0 for h in held),
        f"no sample of rank 0 (pid {pid}) said it holds GPU memory: {held}; nvidia-smi lists pids {listed} (another pid namespace?)",
    )
    expect(all(u is None or 0 <= u <= 100 for u in utilisation) and any(u is not None for u in utilisation), f"utilisation samples: {utilisation}")
    expect(untouched(), f"sampling loaded the CUDA driver in the kernel ({driver_state()})")
    peak = max(s.get("peak_gpu_mem") or 0 for s in samples)
    return {"gpu_mem": held, "gpu_util": utilisation, "peak_gpu_mem": peak, "rank_pid": pid, "nvidia_smi_pids": listed, "driver_state": driver_state()}


def _hold_a_gib_on_the_gpu() -> int:
    import os
    import time

    import torch

    held = torch.ones(2**28, device="cuda")  # 1 GiB of float32
    end = time.monotonic() + 3.5  # three samples, at 1, 2 and 3 s; busy, so utilisation is not always 0
    while time.monotonic() < end:
        held.mul_(1.0)
    torch.cuda.synchronize()
    return os.getpid()


def _peer_fails_while_rank0_waits_in_cuda() -> None:
    import torch

    if os.environ["RANK"] == "0":
        torch.cuda._sleep(int(2e11))  # about 100 s of spinning on the GPU
        torch.cuda.synchronize()
    else:
        time.sleep(2)
        raise ValueError("peer failure while rank 0 waits on the GPU")


@case("peer-failure-cuda-one-shot")
def peer_failure_one_shot() -> dict[str, Any]:
    import nbaccel

    started = time.perf_counter()
    try:
        nbaccel.notebook_launcher(_peer_fails_while_rank0_waits_in_cuda, num_processes=2, cpu=True, timeout=150)
        raise CheckFailed("the launch returned although rank 1 raised")
    except nbaccel.RankFailedError as error:
        text = error_text(error)
    seconds = time.perf_counter() - started
    expect("rank 1" in text.splitlines()[0] and "ValueError" in text, f"the error is not rank 1's: {text[:300]}")
    expect(seconds < 60, f"the failure took {seconds:.0f} s to report")
    return {"seconds_to_error": round(seconds, 2), "error": text.splitlines()[0][:200]}


@case("peer-failure-cuda-pool")
def peer_failure_pool() -> dict[str, Any]:
    import nbaccel

    pool = nbaccel.start_workers(2, cpu=True)
    started = time.perf_counter()
    try:
        try:
            pool.run(_peer_fails_while_rank0_waits_in_cuda, timeout=150)
            raise CheckFailed("the cell returned although rank 1 raised")
        except BaseException as error:  # noqa: BLE001 - a KeyboardInterrupt here is the defect
            text, kind = error_text(error), type(error).__name__
    finally:
        pool.stop(graceful=False)
    seconds = time.perf_counter() - started
    expect(kind != "KeyboardInterrupt", f"a peer failure was reported as KeyboardInterrupt: {text[:300]}")
    expect("rank 1" in text and "ValueError" in text, f"the error is not rank 1's: {text[:300]}")
    return {"seconds_to_error": round(seconds, 2), "error_type": kind, "error": text.splitlines()[0][:200]}


@case("gpu-result-4gib")
def gpu_result_4gib() -> dict[str, Any]:
    import nbaccel

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    started = time.perf_counter()
    [result] = nbaccel.notebook_launcher(_four_gib_on_the_gpu, num_processes=1, timeout=240)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    size = result.numel() * result.element_size() / 2**30
    expect(size == 4.0 and str(result.device) == "cpu", f"got {size} GiB on {result.device}")
    return {
        "seconds": round(seconds, 2),
        "kernel_peak_gib": round(peak, 2),
        "peak_before_gib": round(before, 2),
        "peak_over_result": round((peak - before) / size, 2),
        "driver_state": driver_state(),
    }


def _four_gib_on_the_gpu() -> Any:
    import torch

    return torch.ones(2**30, device="cuda")


TORCHRUN_SCRIPT = """
import os, time, torch, torch.distributed as dist
started = time.perf_counter()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
dist.barrier()
print("NCCL_INIT", time.perf_counter() - started, flush=True)
dist.destroy_process_group()
"""


@case("launch-vs-torchrun")
def launch_vs_torchrun() -> dict[str, Any]:
    import nbaccel

    ours, ours_init = [], []
    for _ in range(3):
        started = time.perf_counter()
        [init] = nbaccel.notebook_launcher(_nccl_init, num_processes=1, timeout=120)
        ours.append(time.perf_counter() - started)
        ours_init.append(init)
    theirs, theirs_init = [], []
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(textwrap.dedent(TORCHRUN_SCRIPT))
    for _ in range(3):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--standalone", script.name],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        theirs.append(time.perf_counter() - started)
        theirs_init += [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("NCCL_INIT")]
        expect(done.returncode == 0, f"torchrun failed: {done.stderr[-300:]}")
    os.unlink(script.name)
    median = statistics.median
    return {
        "nbaccel_launch_s": round(median(ours), 3),
        "nbaccel_nccl_init_s": round(median(ours_init), 3),
        "torchrun_launch_s": round(median(theirs), 3),
        "torchrun_nccl_init_s": round(median(theirs_init), 3),
        "launch_ratio_torchrun_over_nbaccel": round(median(theirs) / median(ours), 2),
    }


def _nccl_init() -> float:
    import torch
    import torch.distributed as dist

    started = time.perf_counter()
    if not dist.is_initialized():
        state = nbaccel_state()
        dist.init_process_group("nccl", device_id=state.device)
    dist.barrier()
    torch.cuda.synchronize()
    return time.perf_counter() - started


# -- two GPUs (listed; run only where two are visible) -------------------------------------------


@case("nccl-all-reduce-two-gpus")
def nccl_two_gpus() -> dict[str, Any]:
    import nbaccel

    result = nbaccel.notebook_launcher(_all_reduce, num_processes=2, timeout=180)
    expect(result == [3.0, 3.0], f"all_reduce over two GPUs gave {result!r}")
    return {"result": result}


def _all_reduce() -> float:
    import torch
    import torch.distributed as dist

    state = nbaccel_state()
    value = torch.tensor([state.process_index + 1.0], device=state.device)
    dist.all_reduce(value)
    return float(value)


@case("status-names-physical-gpu")
def status_names_physical_gpu() -> dict[str, Any]:
    import nbaccel

    pool = nbaccel.start_workers(gpus=[1])
    try:
        device = pool.status()[0].device
    finally:
        pool.stop()
    expect("GPU 1" in device, f"status shows {device!r} for --gpus 1")
    return {"device": device}


def main() -> int:
    name = sys.argv[1]
    try:
        figures = CASES[name]()
        outcome: dict[str, Any] = {"status": "pass", "figures": figures}
    except Skipped as why:
        outcome = {"status": "skip", "reason": str(why)}
    except CheckFailed as failure:
        outcome = {"status": "fail", "reason": str(failure)}
    except BaseException as error:  # noqa: BLE001 - any crash of a check is its failure, reported
        traceback.print_exc()
        outcome = {"status": "fail", "reason": f"crashed: {type(error).__name__}: {str(error)[:300]}"}
    print(MARK + json.dumps(outcome, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
