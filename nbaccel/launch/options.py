"""The options of a launch, validated once: ``notebook_launcher``, ``start_workers`` and both magics build one.

A ``LaunchOptions`` is frozen and checked when it is made, so everything after it (planning,
starting, watching) can trust it. Fixed choices are ``Literal`` types, so a type checker catches a
misspelt ``start_method`` before the notebook runs it.

Example:
    >>> LaunchOptions(num_processes=2, mixed_precision="bf16").mixed_precision
    'bf16'
    >>> LaunchOptions(start_method="thread")
    Traceback (most recent call last):
    ...
    ValueError: unknown start_method 'thread'; choose one of 'auto', 'fork', 'forkserver', 'spawn'.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from nbaccel.launch.rendezvous import is_loopback
from nbaccel.wire.rank_env import MIXED_PRECISIONS, MixedPrecision

__all__ = [
    "MIXED_PRECISIONS",
    "OUTPUT_MODES",
    "RDZV_BACKENDS",
    "START_METHODS",
    "LaunchOptions",
    "MixedPrecision",
    "OutputMode",
    "RdzvBackend",
    "StartMethod",
    "check_callable",
    "check_profile",
    "check_timeout",
    "port_number",
    "profile_folder",
    "rdzv_items",
]

StartMethod = Literal["auto", "fork", "forkserver", "spawn"]
OutputMode = Literal["auto", "text", "widgets"]
RdzvBackend = Literal["static", "c10d"]  # torch elastic's, as Accelerate passes them (etcd is not supported)

START_METHODS: tuple[str, ...] = get_args(StartMethod)
OUTPUT_MODES: tuple[str, ...] = get_args(OutputMode)
RDZV_BACKENDS: tuple[str, ...] = get_args(RdzvBackend)
MULTI_NODE_PORT = 29500  # Accelerate's use_port default: the nodes of a num_nodes launch must agree on one
DEFAULT_STALL_REPORT = 300.0  # five quiet minutes: long for a training loop that logs, short for a hang


@dataclass(frozen=True)
class LaunchOptions:
    """How to start the ranks of a launch or a pool; every field is checked on creation.

    Attributes:
        num_processes: ranks to start; None: one per visible GPU, or 2 CPU ranks on gloo.
        mixed_precision: exported for Accelerate and nbaccel's state.
        start_method: "auto" forks unless forking is unsafe (CUDA initialised), then starts the
            ranks from nbaccel's fork server, then (no server to be had) spawns.
        timeout: seconds after which every rank is stopped (one-shot launches and pool tasks).
        max_restarts: relaunches after a failure (one-shot launches).
        gpus: CUDA device indices, one rank each.
        cpu: CPU ranks on gloo even where GPUs are visible.
        use_port: the rendezvous port; None: a free one, fresh for every attempt.
        master_addr: the rendezvous address; one-node launches accept loopback only.
        stall_report: when no rank has printed or progressed for this many seconds, show each
            rank's stack once (nothing is stopped); None turns the watch off.
        pdb: a rank that raises stays at its exception while the cell opens a post-mortem
            prompt in its frame (docs/debugging.md); the launch fails once it is left.
        profile: run each rank under torch.profiler and write its trace, a merged trace and a
            summary (docs/profiling.md): True (into the launch's log folder) or a folder's path.
        node_rank, num_nodes: this node among ``num_nodes`` (Accelerate's multi-node notebooks:
            each node's kernel runs its own ranks and they meet at ``master_addr:use_port``).
        rdzv_backend, rdzv_endpoint, rdzv_conf, rdzv_id: how the nodes meet (torch elastic's
            names): "static" (ranks by ``node_rank``) or "c10d" (torch's rendezvous: node ranks
            in order of arrival); the endpoint ``HOST:PORT`` (default ``master_addr:use_port``);
            ``rdzv_conf`` as sorted (key, value) pairs; ``rdzv_id`` names the job.
        monitor_interval: accepted for Accelerate's signature; nbaccel's loop waits on every
            rank's pipes and pidfd at once, so it has no polling period to set.
        log_line_prefix_template: torch elastic's template of each text line's prefix
            (``${role_name}``, ``${rank}``, ``${local_rank}``); None: ``[rank N]`` and a space.
    """

    num_processes: int | None = None
    mixed_precision: MixedPrecision = "no"
    start_method: StartMethod = "auto"
    timeout: float | None = None
    max_restarts: int = 0
    gpus: tuple[int, ...] | None = None
    cpu: bool = False
    use_port: int | None = None
    master_addr: str = "127.0.0.1"
    stall_report: float | None = DEFAULT_STALL_REPORT
    pdb: bool = False
    profile: bool | str = False
    node_rank: int = 0
    num_nodes: int = 1
    rdzv_backend: RdzvBackend = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: tuple[tuple[str, Any], ...] = ()
    rdzv_id: str = "none"
    monitor_interval: float = 0.1
    log_line_prefix_template: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", check_profile(self.profile))
        _check_choice("mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        _check_choice("start_method", self.start_method, START_METHODS)
        _check_nodes(self)
        if self.num_processes is not None and not _is_whole(self.num_processes, 1):
            raise ValueError(f"num_processes must be a whole number >= 1, got {self.num_processes!r}.")
        check_timeout(self.timeout)
        check_timeout(self.stall_report, "stall_report")
        if not isinstance(self.pdb, bool):
            raise TypeError(f"pdb must be True or False, got {self.pdb!r}.")
        if not _is_whole(self.max_restarts, 0):
            raise ValueError(f"max_restarts must be a whole number >= 0, got {self.max_restarts!r}.")
        if self.gpus is not None:
            object.__setattr__(self, "gpus", _gpu_tuple(self.gpus))
            if self.cpu:
                raise ValueError("gpus and cpu=True contradict each other: pass one of them.")
        object.__setattr__(self, "use_port", port_number(self.use_port))
        if self.num_nodes == 1 and not is_loopback(str(self.master_addr)):
            raise ValueError(
                f"master_addr={self.master_addr!r} is not a loopback address; a one-node launch rendezvous on "
                "loopback only (127.0.0.1), so nothing listens on a network. Leave master_addr at its default "
                "(several machines: num_nodes=N with node_rank=R on each, or better cluster=; docs/launcher.md)."
            )

    @property
    def rendezvous_endpoint(self) -> tuple[str, int]:
        """Where the nodes of a ``num_nodes`` launch meet: ``rdzv_endpoint``, else ``master_addr:use_port``
        (29500, Accelerate's default, when no port was given).

        >>> LaunchOptions(num_nodes=2, master_addr="10.0.0.1").rendezvous_endpoint
        ('10.0.0.1', 29500)
        """
        if self.rdzv_endpoint:
            return _endpoint(self.rdzv_endpoint, self.use_port or MULTI_NODE_PORT)
        return str(self.master_addr), self.use_port or MULTI_NODE_PORT


def check_callable(function: Any, args: Any) -> None:
    """What every rank will run: a callable and a sequence of positional arguments."""
    if not callable(function):
        raise TypeError(f"function must be callable, got {function!r} ({type(function).__name__}); pass the function itself, not its result.")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments, got {type(args).__name__} {args!r}; for one argument write args=(x,).")


def check_profile(profile: Any) -> bool | str:
    """``profile=``: True/False, or the folder for the traces (a str or path, made if missing)."""
    if isinstance(profile, bool):
        return profile
    if isinstance(profile, (str, os.PathLike)) and str(os.fspath(profile)).strip():
        return str(os.fspath(profile))
    raise ValueError(f"profile must be True, False or a folder for the traces, got {profile!r}.")


def profile_folder(profile: bool | str) -> str | None:
    """The folder asked for, or None for the launch's log folder (``profile=True``)."""
    return profile if isinstance(profile, str) else None


def check_timeout(timeout: Any, name: str = "timeout") -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {timeout!r}.")


def _check_nodes(options: LaunchOptions) -> None:
    """node_rank, num_nodes, the rendezvous and the prefix, checked before anything starts."""
    if not _is_whole(options.num_nodes, 1):
        raise ValueError(f"num_nodes must be a whole number >= 1 (the machines taking part), got {options.num_nodes!r}.")
    if not _is_whole(options.node_rank, 0) or options.node_rank >= options.num_nodes:
        raise ValueError(
            f"node_rank must be a whole number from 0 to num_nodes - 1 = {options.num_nodes - 1} (this machine's place), got {options.node_rank!r}."
        )
    _check_choice("rdzv_backend", options.rdzv_backend, RDZV_BACKENDS)
    if not isinstance(options.rdzv_endpoint, str):
        raise TypeError(f"rdzv_endpoint must be a 'HOST:PORT' string or '', got {options.rdzv_endpoint!r}.")
    if options.rdzv_endpoint:
        _endpoint(options.rdzv_endpoint, MULTI_NODE_PORT)
    object.__setattr__(options, "rdzv_conf", rdzv_items(options.rdzv_conf))
    if not isinstance(options.rdzv_id, str) or not options.rdzv_id:
        raise ValueError(f"rdzv_id must be a non-empty string naming the job, got {options.rdzv_id!r}.")
    if isinstance(options.monitor_interval, bool) or not isinstance(options.monitor_interval, (int, float)) or not options.monitor_interval > 0:
        raise ValueError(f"monitor_interval must be a positive number of seconds, got {options.monitor_interval!r}.")
    template = options.log_line_prefix_template
    if template is not None and not isinstance(template, str):
        raise TypeError(f"log_line_prefix_template must be a string such as '[${{role_name}}${{rank}}]: ' or None, got {template!r}.")
    if options.num_nodes > 1 and options.max_restarts:
        raise ValueError(
            f"max_restarts={options.max_restarts!r} with num_nodes={options.num_nodes}: the nodes' notebooks cannot restart their ranks "
            "together; pass max_restarts=0, or use cluster= (nbaccel.Cluster), which restarts every node's ranks."
        )


RDZV_CONF_KEYS = ("join_timeout", "timeout", "rank", "read_timeout", "last_call_timeout", "close_timeout", "is_host")


def rdzv_items(conf: Any) -> tuple[tuple[str, Any], ...]:
    """``rdzv_conf`` (a dict, None or pairs) as sorted pairs, refusing keys nbaccel does not know.

    >>> rdzv_items({"join_timeout": 60})
    (('join_timeout', 60),)
    """
    if conf is None:
        return ()
    items = dict(conf.items() if isinstance(conf, dict) else conf)
    unknown = sorted(set(items) - set(RDZV_CONF_KEYS))
    if unknown:
        raise ValueError(f"rdzv_conf has unknown key(s) {unknown!r}; nbaccel understands {', '.join(RDZV_CONF_KEYS)}.")
    for key in ("join_timeout", "timeout"):
        if key in items:
            check_timeout(items[key], f"rdzv_conf[{key!r}]")
    return tuple(sorted(items.items()))


def _endpoint(text: str, default_port: int) -> tuple[str, int]:
    """``"HOST:PORT"`` (or ``"HOST"``, ``"[v6]:PORT"``) as (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or "]" in port:
        host, port = text.strip(), str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"rdzv_endpoint must be 'HOST:PORT', got {text!r}.")
    return host, int(port)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}.")


def _is_whole(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def _gpu_tuple(gpus: Sequence[int] | Any) -> tuple[int, ...]:
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise TypeError(f"gpus must be a list of CUDA device indices such as [0, 1], got {gpus!r}.")
    return tuple(gpus)


def port_number(use_port: Any) -> int | None:
    """``use_port`` as a number (Accelerate passes ``"29500"``), checked; None stays None.

    >>> port_number("29500")
    29500
    """
    if use_port is None:
        return None
    try:
        port = int(use_port)
    except (TypeError, ValueError):
        raise ValueError(f"use_port must be a port number, got {use_port!r}.") from None
    if not 0 < port < 65536:
        raise ValueError(f"use_port must be between 1 and 65535, got {use_port!r}.")
    return port
