"""Run every GPU check as its own bounded process; write ``$OUT/results.json`` and print a table.

Called by ``scripts/gpu-check`` (which installs the carried wheels first). Checks that need more
GPUs than are visible are listed as skipped with the reason, so a machine without a GPU runs the
plumbing (``environment``, ``cpu-launch``) and reports the rest as skipped: that is the dry run
the test suite makes (tests/test_gpu_check.py). The whole run stays inside ``--budget`` seconds
(default 450: one 10-minute device command with room for installing and copying back).

    python3 scripts/gpu_check.py --out /tmp/gpu-check [--only driver-probe,pool-oom]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARK = "GPU-CHECK-RESULT "
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's nbaccel, however started


@dataclass(frozen=True)
class Check:
    name: str
    proves: str
    limit_s: int
    gpus: int = 1
    needs: str = ""  # the parts of nbaccel it exercises beyond the launch itself: where a failure points first
    env: dict[str, str] = field(default_factory=dict)


CHECKS = [
    Check("environment", "what the machine and image are: torch, CUDA, NVML's GPUs, the kernel's driver state", 60, gpus=0),
    Check("cpu-launch", "the carried packages and nbaccel launch two CPU ranks here", 90, gpus=0),
    Check(
        "driver-probe",
        "the kernel stays CUDA-uninitialised through is_available, a plan, AcceleratorState('bf16'), a launch and unpickling its GPU result",
        120,
    ),
    Check("is-available-then-launch", "torch.cuda.is_available() in the kernel, then a forked CUDA launch works", 90),
    Check(
        "cuinit-routes-to-spawn",
        "a kernel that ran cuInit (PYTORCH_NVML_BASED_CUDA_CHECK=0) is seen by the driver probe and does not fork (fork server, else spawn)",
        120,
        env={"PYTORCH_NVML_BASED_CUDA_CHECK": "0"},
    ),
    Check(
        "fork-server-nccl",
        "CUDA initialised after the fork server was forked: one rank per GPU from the server on NCCL, a captured CUDA tensor on each rank's own GPU",
        120,
    ),
    Check(
        "nccl-ddp-one-rank",
        "one rank gets an NCCL process group and DDP runs a step",
        120,
        needs="state/default_group.py: a process group for a one-rank launch",
    ),
    Check(
        "pool-oom",
        "a pool cell that runs out of GPU memory is named, and the pool is kept",
        120,
        needs="rank/memory_errors.py (the OOM named with rank, device, peak), pool/cuda_fatal.py (the pool kept)",
    ),
    Check(
        "device-assert",
        "a device-side assert ends the worker, names the rank and says %distributed restart",
        120,
        needs="pool/cuda_fatal.py: a dead CUDA context ends the worker, with %distributed restart",
    ),
    Check(
        "distributed-free",
        "%distributed free empties the CUDA cache on every rank and says what it freed",
        120,
        needs="rank/worker_calls.py free_memory, notebook/worker_tables.py (what free says)",
    ),
    Check("no-gpu-process-after-stop", "no process is left on the GPU after the pool stops", 90),
    Check(
        "gpu-use-sampled",
        "the kernel samples a CUDA rank's device memory (> 0 while it holds 1 GiB) and its GPU's utilisation (0..100) through NVML, never loading the driver",
        90,
    ),
    Check("peer-failure-cuda-one-shot", "a peer failing while rank 0 waits in a CUDA kernel ends the launch with the peer's error", 120),
    Check(
        "peer-failure-cuda-pool",
        "the same in a pool: RankFailedError, not KeyboardInterrupt",
        120,
        needs="pool/policies.py Task and raise_stuck_error: a peer failure reads as that failure, never as an interrupt",
    ),
    Check(
        "gpu-result-4gib",
        "a 4 GiB GPU result comes back: time and the kernel's peak memory",
        180,
        needs="wire/shm.py and wire/events.py: a GPU result moved to the CPU into memfds, no copy in the kernel",
    ),
    Check("launch-vs-torchrun", "launch and NCCL-init time of one rank against torchrun on the same GPU", 240),
    Check("nccl-all-reduce-two-gpus", "NCCL across two GPUs (all_reduce)", 180, gpus=2),
    Check("status-names-physical-gpu", "status shows the physical GPU for --gpus 1", 120, gpus=2),
]


def visible_gpus() -> int:
    from nbaccel.devices import nvml

    return nvml.visible_count()


def run_check(check: Check, seconds: float, log: Any) -> dict[str, Any]:
    """One check in its own process, killed at ``seconds``; its outcome and figures."""
    command = [sys.executable, str(HERE / "gpu_check_cases.py"), check.name]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NBACCEL_OUTPUT": "text", **check.env}
    started = time.monotonic()
    log.write(f"\n===== {check.name} (limit {seconds:.0f} s) =====\n")
    log.flush()
    try:
        done = subprocess.run(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds, check=False, start_new_session=True
        )
        output = done.stdout
    except subprocess.TimeoutExpired as timed_out:
        output = (timed_out.stdout or b"").decode(errors="replace") if isinstance(timed_out.stdout, bytes) else (timed_out.stdout or "")
        log.write(output)
        return {"status": "timeout", "reason": f"ran past its {seconds:.0f} s", "seconds": round(time.monotonic() - started, 1)}
    log.write(output)
    results = [line[len(MARK) :] for line in output.splitlines() if line.startswith(MARK)]
    outcome = json.loads(results[-1]) if results else {"status": "fail", "reason": f"exited {done.returncode} without a result (see the log)"}
    outcome["seconds"] = round(time.monotonic() - started, 1)
    return outcome


def run_all(checks: list[Check], gpus: int, budget: float, log: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + budget
    rows = []
    for check in checks:
        row: dict[str, Any] = {"check": check.name, "proves": check.proves, "needs_gpus": check.gpus, "needs_feature": check.needs}
        left = deadline - time.monotonic()
        if gpus < check.gpus:
            row.update(status="skip", reason=f"needs {check.gpus} GPU(s); {gpus} visible")
        elif left < 15:
            row.update(status="skip", reason=f"out of time: {left:.0f} s of the {budget:.0f} s budget left")
        else:
            row.update(run_check(check, min(check.limit_s, left), log))
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'check':<28} {'result':<8} {'time':>7}  figures or reason", "-" * 100]
    for row in rows:
        detail = json.dumps(row["figures"], default=str) if "figures" in row else row.get("reason", "")
        if row["status"] != "pass" and row.get("needs_feature"):
            detail += f"  [exercises {row['needs_feature']}]"
        seconds = f"{row['seconds']:.1f} s" if "seconds" in row else ""
        lines.append(f"{row['check']:<28} {row['status']:<8} {seconds:>7}  {detail[:400]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out", help="folder for results.json and gpu-check.log (default $OUT)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for all checks together")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument("--gpus", type=int, default=None, help="pretend this many GPUs are visible (0: the dry run)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [c for c in CHECKS if not args.only or c.name in args.only.split(",")]
    gpus = visible_gpus() if args.gpus is None else args.gpus
    started = time.time()
    with open(out / "gpu-check.log", "w") as log:
        rows = run_all(chosen, gpus, args.budget, log)
    failed = [r["check"] for r in rows if r["status"] in ("fail", "timeout")]
    summary = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "visible_gpus": gpus,
        "failed": failed,
        "checks": rows,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str))
    print(table(rows))
    print(
        f"\ngpu-check: {len(rows) - len(failed)} of {len(rows)} without failure ({sum(r['status'] == 'skip' for r in rows)} skipped), {summary['seconds']} s; results in {out / 'results.json'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
