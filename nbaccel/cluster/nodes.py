"""A node agent as the kernel knows it (``NodeInfo``), and whether one may join (``version_refusal``).

``NodeInfo.clock`` is the node's clock offset from the kernel's, kept up to date by the cluster's
thread (``nbaccel.net.clock``: a burst of probes at the join, then one in every heartbeat).

Example:
    >>> node = NodeInfo("0", "node1", "10.0.0.2", nproc=2, gpus=0, pid=42)
    >>> node.describe(), node.clock.describe()
    ('0 (node1, 10.0.0.2)', 'not measured')
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from nbaccel import _version
from nbaccel.net.clock import NodeClock
from nbaccel.net.link import Link


def version_refusal(join: dict[str, Any]) -> str | None:
    """Why a node agent may not join, or None: it must run this kernel's nbaccel version.

    The frames and messages between them are versioned by the package, not one by one, so a node
    of another version is refused at once, both versions named, rather than misread later.

    Example:
        >>> version_refusal({"version": _version.__version__}) is None
        True
        >>> version_refusal({"version": "0.0.1"})  # doctest: +ELLIPSIS
        'the node runs nbaccel 0.0.1, this kernel runs nbaccel ...; install the same nbaccel on every node'
    """
    theirs = str(join.get("version", "unknown (older than 0.1)"))
    if theirs == _version.__version__:
        return None
    return f"the node runs nbaccel {theirs}, this kernel runs nbaccel {_version.__version__}; install the same nbaccel on every node"


@dataclass
class NodeInfo:
    """One agent that joined: where it runs, how many ranks it starts, and whether it answers."""

    name: str
    host: str
    address: str
    nproc: int
    gpus: int
    pid: int
    started_by: str = "by hand"  # "ssh node1", "slurm job 12", ...: from the agent's --started-by
    order: int | None = None  # Slurm's node order (SLURM_NODEID) when an srun step started the agent
    alive: bool = True
    lost_reason: str = ""
    device_type: str = "cuda"  # its GPUs' torch device type ("cuda": NVIDIA or AMD, "xpu": Intel); "cpu" without any
    last_seen: float = field(default_factory=time.monotonic)
    joined_at: float = field(default_factory=time.monotonic)
    clock: NodeClock = field(default_factory=NodeClock)  # its clock minus the kernel's, and the round trip
    link: Link | None = field(default=None, repr=False)

    def describe(self) -> str:
        return f"{self.name} ({self.host}, {self.address})"
