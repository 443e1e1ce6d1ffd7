"""Two network namespaces joined by a veth pair, with addresses assigned only inside them.

Needs root and ``ip``; ``available()`` says why not otherwise. Everything made here is removed
by the context manager (deleting a namespace deletes its end of the veth pair).

Example::

    with two_namespaces() as net:
        subprocess.run([*net.exec_in(0), "ip", "addr"])
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SUBNET = "10.231.0"


@dataclass(frozen=True)
class Namespaces:
    names: tuple[str, str]
    addresses: tuple[str, str]
    veths: tuple[str, str]

    def exec_in(self, index: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[index]]


def _ip(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *arguments], capture_output=True, text=True, timeout=10)


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"nbaccel-probe-{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


@contextmanager
def two_namespaces() -> Iterator[Namespaces]:
    tag = f"{os.getpid() % 100000}"
    net = Namespaces((f"nbx{tag}a", f"nbx{tag}b"), (f"{SUBNET}.1", f"{SUBNET}.2"), (f"nbv{tag}a", f"nbv{tag}b"))
    try:
        for name in net.names:
            _check(_ip("netns", "add", name))
        _check(_ip("link", "add", net.veths[0], "netns", net.names[0], "type", "veth", "peer", "name", net.veths[1], "netns", net.names[1]))
        for name, veth, address in zip(net.names, net.veths, net.addresses, strict=True):
            _check(_ip("-n", name, "addr", "add", f"{address}/24", "dev", veth))
            _check(_ip("-n", name, "link", "set", veth, "up"))
            _check(_ip("-n", name, "link", "set", "lo", "up"))
        yield net
    finally:
        for name in net.names:
            _ip("netns", "del", name)


def _check(run: subprocess.CompletedProcess[str]) -> None:
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(run.args)} failed: {run.stderr.strip()}")
