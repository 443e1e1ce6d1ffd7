"""Run the tests that wait on a handshake (and the interrupt tests) many times under load; print pass counts.

Each test below once waited "long enough" with a sleep before asserting that something had
happened, or delivered a real SIGINT that a background job's ignored SIGINT swallowed. Here each
runs ``--runs`` times in one pytest (this file is also its plugin: it repeats each test, as a
parameter, so module fixtures such as the two agents stay up), while ``--load`` processes burn a
core each, and pytest starts with SIGINT ignored, as a shell's ``&``, ``nohup`` and CI runners
start it (``--foreground`` leaves SIGINT as it is). Prints each test's passes out of its runs, the
load average before and after, and where the failures' reports went.

    python benchmarks/flake_check.py [--runs 20] [--load 2] [--foreground] [-k EXPR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/launch/test_launch.py::test_failure_names_the_raising_rank_and_stops_the_blocked_peer_fast",
    "tests/launch/test_launch.py::test_spawn_failures_are_reported_like_fork_failures",
    "tests/launch/test_stacks.py::test_a_peer_blocked_in_a_collective_is_always_reported_where_it_was",
    "tests/launch/test_debugger.py::test_a_peers_failure_while_a_rank_is_at_the_prompt_ends_the_launch_and_withdraws_it",
    "tests/pool/test_pool_soundness.py::test_a_peer_failure_while_a_rank_is_stuck_in_native_code_raises_the_failure",
    "tests/pool/test_pool_soundness.py::test_an_interrupt_that_leaves_ranks_out_of_step_stops_the_pool_and_says_why",
    "tests/pool/test_pool_soundness.py::test_a_failure_that_leaves_ranks_out_of_step_raises_it_and_stops_the_pool",
    "tests/launch/test_memory.py::test_a_rank_the_oom_killer_takes_is_named_with_its_peak_and_the_limit",
    "tests/launch/test_sampling.py::test_a_rank_sampled_while_the_oom_killer_ends_it_keeps_its_cgroup",
    "tests/launch/test_gpu_sampling.py::test_a_real_launch_samples_its_ranks_gpu_use_through_the_loop",
    "tests/launch/test_profile.py::test_a_rank_stopped_after_a_peers_failure_still_writes_its_trace",
    "tests/launch/test_launch.py::test_interrupt_raises_keyboard_interrupt_stops_ranks_and_restores_nothing_it_did_not_touch",
    "tests/pool/test_pool.py::test_interrupt_stops_the_cell_on_every_rank_and_keeps_workers_and_namespaces",
    "tests/pool/test_pool.py::test_a_rank_that_does_not_stop_tears_the_pool_down_and_says_so",
    "tests/launch/test_signal_handling.py",
    "tests/agent/test_memory_across_nodes.py",
    "tests/agent/test_security.py",
    "tests/agent/test_gpu_use_across_nodes.py",
    "tests/agent/test_pool_across_nodes.py::test_an_interrupted_task_leaves_the_pool_alive",
    "tests/agent/test_launch_across_nodes.py::test_an_interrupt_stops_every_node_and_the_next_launch_works",
    "tests/test_leak_check.py::test_the_autouse_check_fails_a_leaking_test_and_passes_a_clean_one",
    "tests/launch/test_vendor_plans.py::test_a_real_launch_samples_each_amd_rank_s_gpu_memory_from_kfd",
    "tests/output/test_text_figures.py::test_a_real_launch_in_text_mode_ends_with_each_ranks_peak_and_cpu_time",
    "tests/output/test_text_figures.py::test_a_pools_cells_end_with_figures_and_its_housekeeping_without",
    "tests/launch/test_stacks.py::test_a_stall_shows_each_ranks_stack_once_and_stops_nothing",
    "tests/agent/test_profile_across_nodes.py::test_each_agent_samples_its_own_ranks_and_sends_the_samples_over_its_link",
    "tests/browser/test_extension.py::test_status_item_follows_the_workers_and_its_stop_button_stops_them",
]
RUNS_VARIABLE, REPORT_VARIABLE = "FLAKE_CHECK_RUNS", "FLAKE_CHECK_REPORT"
_RUN_ID = re.compile(r"(?<=\[)run\d+-|-?run\d+(?=\])")  # this plugin's parameter, first or alone


# ---- the pytest plugin (loaded in the child pytest with -p flake_check) ----


def pytest_generate_tests(metafunc: Any) -> None:
    runs = int(os.environ.get(RUNS_VARIABLE, "0"))
    if runs > 0:
        metafunc.fixturenames.append("flake_check_run")
        metafunc.parametrize("flake_check_run", range(runs), ids=[f"run{n}" for n in range(runs)])


_outcomes: dict[str, Counter[str]] = {}
_failures: list[str] = []


def pytest_runtest_logreport(report: Any) -> None:
    """A run passes when its setup, call and teardown (the leak check) all pass."""
    test = _RUN_ID.sub("", report.nodeid).replace("[]", "")
    if report.failed:
        _outcomes.setdefault(test, Counter())["failed"] += 1
        _failures.append(f"{report.nodeid} ({report.when}):\n{report.longreprtext[-4000:]}\n")
    elif report.when == "call":
        _outcomes.setdefault(test, Counter())[report.outcome] += 1
    else:
        return
    path = os.environ.get(REPORT_VARIABLE)
    if path:  # after every run: what ran is counted even if the session is cut short
        Path(path + ".partial").write_text(json.dumps({"outcomes": _outcomes, "failures": _failures}))
        os.replace(path + ".partial", path)


# ---- the script ----


def start_load(processes: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]


def stop_load(burners: list[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        burner.kill()
        burner.wait()


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_tests(args: argparse.Namespace, report: Path) -> int:
    env = {
        **os.environ,
        RUNS_VARIABLE: str(args.runs),
        REPORT_VARIABLE: str(report),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "flake_check", *TESTS]
    argv += ["-k", args.k] if args.k else []
    tests = subprocess.Popen(argv, cwd=ROOT, env=env, preexec_fn=None if args.foreground else ignore_sigint, stdout=subprocess.DEVNULL)
    try:
        return tests.wait()
    finally:
        if tests.poll() is None:
            tests.terminate()
            tests.wait(30)


def print_counts(result: dict[str, Any], runs: int, failures_at: Path) -> None:
    width = max((len(t) for t in result["outcomes"]), default=10)
    for test, counts in sorted(result["outcomes"].items()):
        total = counts.get("passed", 0) + counts.get("failed", 0)
        skipped = f" ({counts['skipped']} skipped)" if counts.get("skipped") else ""
        print(f"  {test:<{width}}  {counts.get('passed', 0):>3}/{total:<3}{skipped}")
    if result["failures"]:
        failures_at.write_text("\n".join(result["failures"]))
        print(f"failures' reports: {failures_at}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each test (default 20)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="CPU-burning processes beside the tests (default: one per core)")
    parser.add_argument("--foreground", action="store_true", help="start pytest with SIGINT as it is here (default: ignored, as a background job)")
    parser.add_argument("-k", help="only the tests pytest's -k selects")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="nbaccel-flake-check-"))
    report = folder / "report.json"
    print(f"{args.runs} runs of each test, {args.load} CPU burners, SIGINT {'as it is' if args.foreground else 'ignored at start'}")
    print(f"load average before: {Path('/proc/loadavg').read_text().split()[:3]}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("flake_check: stopped by SIGTERM"))  # the burners still go
    burners = start_load(args.load)
    started = time.monotonic()
    try:
        code = run_tests(args, report)
    finally:
        stop_load(burners)
    print(f"pytest exit code {code}, {time.monotonic() - started:.0f} s; load average after: {Path('/proc/loadavg').read_text().split()[:3]}")
    if report.exists():
        print_counts(json.loads(report.read_text()), args.runs, folder / "failures.txt")
    else:
        print(f"no report: pytest ended before its session finished (exit code {code})")


if __name__ == "__main__":
    main()
