"""Decide a launch's plan (ranks, devices, port) before anything starts.

Shared by ``notebook_launcher`` and the persistent worker pool; the options were validated already
(``nbaccel.launch.options``).

Example:
    >>> make_plan(LaunchOptions(num_processes=2, cpu=True), started=0.0).num_processes
    2
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from nbaccel.devices import nvml
from nbaccel.devices.inventory import Inventory, Occupant, gpu_inventory, occupants
from nbaccel.devices.nccl_guard import RTX40_GOOD_DRIVER, rtx40_nccl_variables
from nbaccel.errors import PreflightError
from nbaccel.launch.notices import say
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.preflight import check_gpus, fork_hazards, never_fork
from nbaccel.launch.seam import LaunchPlan, RankStarter
from nbaccel.launch.start_choice import StartChoice, server_how, server_reason, spawn_reason, start_choice
from nbaccel.launch.starters import fork_server
from nbaccel.launch.starters.fork import ForkStarter
from nbaccel.launch.starters.spawn import SpawnStarter
from nbaccel.wire.rank_env import threads_per_rank
from nbaccel.wire.sizes import gib

DEFAULT_CPU_PROCESSES = 2


def make_plan(options: LaunchOptions, started: float, announce: bool = True) -> LaunchPlan:
    """Decide ranks and devices for ``options`` (already valid); ``started`` is when the call began.

    Each decision about devices (CPU ranks for want of a GPU, a GPU skipped because another
    process uses it, GPUs this torch build cannot drive) is kept in the plan's ``device_notes``
    and, with ``announce``, said in one line each (a plan made only to be shown says nothing).
    """
    import torch  # noqa: F401 - once here, so that the forked ranks inherit it (each importing torch costs seconds); touches no CUDA

    found = Inventory("cpu", "") if options.cpu else gpu_inventory()
    num_processes, chosen_gpus, notes = _ranks_and_gpus(options, found)
    device_type = found.device_type if chosen_gpus else "cpu"
    for note in notes if announce else ():
        say(note)
    if chosen_gpus and found.vendor == "nvidia":
        nccl_guard(chosen_gpus)
    if options.mixed_precision == "fp8" and device_type == "cpu":
        raise ValueError(" ".join(("mixed_precision='fp8' needs GPUs that support fp8 (Hopper or newer); on CPU use 'bf16' or 'no'.", *found.notes)))
    return plan_of(
        options,
        started,
        num_processes=num_processes,
        device_type=device_type,
        gpus=chosen_gpus,
        master_addr=options.master_addr,
        port=options.use_port,
        gpu_vendor=found.vendor if chosen_gpus else "",
        device_notes=notes,
    )


def plan_of(
    options: LaunchOptions,
    started: float,
    *,
    num_processes: int,
    device_type: str,
    gpus: tuple[int, ...] | None,
    master_addr: str,
    port: int | None,
    gpu_vendor: str = "",
    device_notes: tuple[str, ...] = (),
) -> LaunchPlan:
    """The one place a ``LaunchPlan`` is made: the options' choices with the ranks and devices decided
    (here for one node, by ``nbaccel.cluster.plan`` for a cluster's nodes).

    Example:
        >>> plan_of(LaunchOptions(timeout=5), 100.0, num_processes=2, device_type="cpu", gpus=None, master_addr="127.0.0.1", port=None).deadline
        105.0
    """
    return LaunchPlan(
        num_processes=num_processes,
        device_type=device_type,
        gpus=gpus,
        gpu_vendor=gpu_vendor,
        mixed_precision=options.mixed_precision,
        master_addr=master_addr,
        port=port,
        max_restarts=options.max_restarts,
        timeout=options.timeout,
        deadline=None if options.timeout is None else started + options.timeout,
        stall_report=options.stall_report,
        device_notes=device_notes,
    )


def _ranks_and_gpus(options: LaunchOptions, found: Inventory) -> tuple[int, tuple[int, ...] | None, tuple[str, ...]]:
    """Ranks, their devices (None: CPU) and the notes that explain the choice."""
    num_processes = options.num_processes
    visible = len(found.devices)
    if options.gpus is not None:
        return _named_gpus(options, found)
    if visible > 0:
        if num_processes is not None and num_processes > visible:
            raise ValueError(
                f"num_processes={num_processes} but only {visible} GPU(s) are visible; one rank needs one GPU. "
                f"Use num_processes<={visible}, or cpu=True for CPU ranks on gloo."
            )
        busy = busy_gpus(found)
        free = [d.index for d in found.devices if d.index not in busy]
        skipped = tuple(f"{words}, so it is skipped (name it in gpus= to use it anyway)" for words in busy.values())
        wanted = len(free) if num_processes is None else num_processes
        if wanted > len(free) or not free:
            raise ValueError(
                f"{'num_processes=' + str(num_processes) + ' but ' if num_processes is not None else ''}only {len(free)} of the {visible} visible GPU(s) are free "
                f"({'; '.join(busy.values())}). Name the GPUs to use anyway with gpus=[...], use fewer ranks, or cpu=True for CPU ranks on gloo."
            )
        return wanted, tuple(free[:wanted]), skipped  # the first free GPUs, one each
    if num_processes is None:
        num_processes = DEFAULT_CPU_PROCESSES
        if not found.notes:  # a note already says why the ranks are CPU ones
            return num_processes, None, (f"no GPU visible; launching {num_processes} CPU processes on gloo.",)
    return num_processes, None, found.notes


def _named_gpus(options: LaunchOptions, found: Inventory) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
    """``gpus=`` obeyed: each named GPU, with a warning for one another process uses."""
    assert options.gpus is not None
    try:
        chosen = check_gpus(options.gpus, len(found.devices))
    except ValueError as exc:
        raise ValueError(" ".join((str(exc), *found.notes))) from None
    if options.num_processes is not None and options.num_processes != len(chosen):
        raise ValueError(f"num_processes={options.num_processes} but gpus={list(chosen)!r} names {len(chosen)} device(s); one rank runs per GPU.")
    busy = busy_gpus(found, chosen)
    warned = tuple(f"{words}; gpus= names it, so a rank uses it anyway (it may run out of memory, or run slower)" for words in busy.values())
    return len(chosen), chosen, warned


def busy_gpus(found: Inventory, among: Sequence[int] | None = None) -> dict[int, str]:
    """Device index -> why another process counts as using it (``GPU 0: 38.2 GiB used by pid 4242``),
    for the devices of ``among`` (default all) that another process uses.

    Busy: NVML (or KFD) lists another process on it, or more of its memory is in use than the
    processes listed hold (more than ``UNLISTED_BUSY`` of it, at least 1 GiB: processes of
    another container are not listed).
    """
    wanted = [d for d in found.devices if among is None or d.index in among]
    if not wanted:
        return {}
    seen = occupants(Inventory(found.device_type, found.vendor, tuple(wanted)))
    return {index: words for index, occupant in seen.items() if (words := _busy_words(index, occupant)) is not None}


UNLISTED_BUSY = 0.05  # share of a GPU's memory in use by no listed process that makes it busy


def _busy_words(index: int, occupant: Occupant) -> str | None:
    if occupant.pids:
        held = [size for size in occupant.pids.values() if size is not None]
        pids = ", ".join(str(pid) for pid in sorted(occupant.pids))
        what = f"{gib(sum(held))} used" if held else "used"
        return f"GPU {index}: {what} by pid{'s' if len(occupant.pids) > 1 else ''} {pids}"
    if occupant.unlisted is not None and occupant.total and occupant.unlisted > max(2**30, UNLISTED_BUSY * occupant.total):
        return f"GPU {index}: {gib(occupant.unlisted)} of {gib(occupant.total)} in use by processes not listed here (another container's?)"
    return None


def choose_starter(start_method: str, local_ranks: int | None = None) -> RankStarter:
    """Fork when that is safe; else the fork server, else spawn (saying why, in one line); refuse
    if fork was asked for and no fork survives (the decision: ``launch.start_choice``).

    A kernel whose OpenMP pool started cannot give a forked rank a working multi-threaded op: the
    fork server (forked before that compute, or exec'd fresh) is immune; without one, the ranks
    are forked with one CPU thread each (said where they would have had more; ``local_ranks`` is
    how many run here). A kernel with CUDA initialised or a process group never forks.
    """
    choice = start_choice(start_method, fork_hazards(), threads_per_rank(local_ranks or 1) > 1)
    if choice.method == "spawn":
        if choice.said:
            say(choice.reason)
        return SpawnStarter()
    if choice.method == "forkserver":
        if choice.required:
            return _server_starter(required=True)  # type: ignore[return-value]  # asked for: no fallback
        return instead_of_fork(choice.hazards[0]) if never_fork(choice.hazards) else _from_running_server(choice)
    if choice.said:
        say(choice.reason)
    if not choice.hazards:
        fork_server.refresh(memory=False)  # while the kernel is safe: a later unsafe launch finds torch in the server
    return ForkStarter(one_thread=choice.one_thread)


def _from_running_server(choice: StartChoice) -> RankStarter:
    """Only the OpenMP pool started and a server runs: its ranks have every core (one thread each otherwise)."""
    starter = _server_starter(required=False)
    if starter is None:
        return ForkStarter(one_thread=True)
    say(server_reason(choice.hazards[0], _how(starter)))
    return starter


def instead_of_fork(reason: str) -> RankStarter:
    """The start for a kernel no fork survives (CUDA initialised, a process group): the fork
    server (immune: it never touched CUDA), else spawn; said why, in one line."""
    starter = _server_starter(required=False)
    if starter is not None:
        say(server_reason(reason, _how(starter)))
        return starter
    say(spawn_reason(reason))
    return SpawnStarter()


def nccl_guard(gpus: Sequence[int]) -> None:
    """Accelerate's guard for RTX 40xx GPUs: NCCL peer-to-peer and InfiniBand off on old drivers.

    NCCL's P2P and IB transports hang or corrupt on GeForce RTX 40 cards under drivers older
    than 550.40.07 (Accelerate's ``check_cuda_p2p_ib_support``); set in this process (the ranks
    inherit it) unless the user chose otherwise, and said in one line.
    """
    variables = rtx40_nccl_variables(nvml.visible_gpus() or [], nvml.driver_version(), len(gpus))
    chosen = {name: value for name, value in variables.items() if name not in os.environ}
    if chosen:
        os.environ.update(chosen)
        say(
            f"RTX 40-series GPUs with driver {nvml.driver_version()} (older than {RTX40_GOOD_DRIVER}): setting {', '.join(f'{k}={v}' for k, v in chosen.items())} as Accelerate does."
        )


def _server_starter(required: bool) -> RankStarter | None:
    if not fork_server.supported() or (not required and fork_server.mode() == "off"):
        if required:
            raise PreflightError("start_method='forkserver' needs Linux 5.3 or newer (pidfds); this system has none. Use start_method='spawn'.")
        return None
    try:
        return fork_server.ServerStarter(fork_server.fork_server())
    except OSError as exc:  # could not start one: spawn still works
        if required:
            raise PreflightError(f"could not start nbaccel's fork server: {exc}. Use start_method='spawn'.") from exc
        return None


def _how(starter: RankStarter) -> str:
    server = getattr(starter, "server", None)
    return server_how(getattr(server, "how", ""))
