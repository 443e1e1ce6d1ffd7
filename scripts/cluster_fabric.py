#!/usr/bin/env python3
"""A real little cluster on one machine, for tests: network namespaces as nodes, real sshd and Slurm.

Needs root and Debian's ``openssh-server``, ``slurmctld slurmd slurm-client munge``
(scripts/install-cluster-deps.sh). ``Fabric`` makes:

- a namespace ``ctl`` (the notebook's / login node's side) holding a bridge with 10.232.0.1/24, and
  one namespace per node on a veth pair into that bridge (10.232.0.11, .12, ...): every address
  is assigned inside a namespace made here and goes away with it;
- name look-ups from files only: every process of the fabric (and whatever ``in_ctl`` runs) has
  its own mount namespace with ``/etc/nsswitch.conf`` (``hosts: files``), ``/etc/resolv.conf``
  (``nameserver 127.0.0.1``) and an ``/etc/hosts`` naming the nodes bind-mounted, so no DNS query
  leaves the test (torch's TCPStore calls getnameinfo; Slurm's clients ask DNS for SRV records);
- ``sshd`` per node listening only on the node's address, with a host key and a client key made
  here, and an ssh config naming the nodes (``fabric.ssh_config``);
- ``munged``, ``slurmctld`` in ``ctl`` and one ``slurmd`` per node namespace (``nsenter --net``
  plus ``unshare --uts --mount``; ``ip netns exec`` remounts /sys and slurmd 22.05 then fails).

``close()`` cancels jobs, ends every process in the fabric's namespaces (all started here),
deletes the namespaces and the folder.

Example::

    with Fabric(nodes=2, slurm=True, ssh=True) as fabric:
        subprocess.run(fabric.in_ctl(["srun", "-N2", "hostname"]), env=fabric.env())

Run ``python scripts/cluster_fabric.py check`` to see whether it can be made here, and why not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBNET = "10.232.0"
CTL_ADDRESS = f"{SUBNET}.1"
_NEEDED = {"ssh": ("sshd", "ssh", "ssh-keygen"), "slurm": ("slurmctld", "slurmd", "srun", "sbatch", "squeue", "scancel", "munged")}


def _which(name: str) -> str | None:
    return shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)


def unavailable(slurm: bool = True, ssh: bool = True) -> str | None:
    """None when a fabric can be made here, else why not (for a test's skip)."""
    if os.geteuid() != 0:
        return "the real-cluster fabric needs root (network namespaces, sshd, slurmd)"
    wanted = ["ip", "nsenter", "unshare", *(_NEEDED["ssh"] if ssh else ()), *(_NEEDED["slurm"] if slurm else ())]
    missing = [name for name in wanted if _which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run scripts/install-cluster-deps.sh"
    probe = f"nbf-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _die_with_parent() -> None:
    """In a daemon before exec (nsenter, unshare and sh exec in turn, keeping it): SIGKILL when the
    fabric's process dies, so a killed test leaves no sshd or slurmd behind."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _run(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class Fabric:
    """The namespaces, files and daemons of one test cluster (see the module's docstring)."""

    def __init__(self, nodes: int = 2, slurm: bool = True, ssh: bool = True, cpus: int | None = None) -> None:
        self.tag = f"{os.getpid() % 10000}"
        self.ctl = f"nbf{self.tag}c"
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.namespaces = [f"nbf{self.tag}n{i + 1}" for i in range(nodes)]
        self.addresses = [f"{SUBNET}.{11 + i}" for i in range(nodes)]
        self.cpus = cpus or os.cpu_count() or 1
        self.slurm, self.ssh = slurm, ssh
        self.dir = Path(tempfile.mkdtemp(prefix="nbaccel-fabric-", dir="/run" if os.access("/run", os.W_OK) else None))
        self.dir.chmod(0o755)  # munged (as munge) must reach its socket's folder
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.timings: dict[str, float] = {}

    # -- running things inside ----------------------------------------------------------------

    def _isolated(self, netns: str, hostname: str | None, argv: list[str]) -> list[str]:
        """``argv`` in ``netns`` with its own mount namespace (and hostname) and files-only name look-ups."""
        binds = " && ".join(f"mount --bind {self.dir / name} /etc/{name}" for name in ("hosts", "nsswitch.conf", "resolv.conf"))
        name = f"hostname {hostname} && " if hostname else ""
        uts = ["--uts"] if hostname else []
        return [
            "nsenter",
            f"--net=/run/netns/{netns}",
            "unshare",
            *uts,
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{name}{binds} && exec "$@"',
            "fabric",
            *argv,
        ]

    def in_ctl(self, argv: list[str]) -> list[str]:
        """``argv`` on the login / notebook side (10.232.0.1)."""
        return self._isolated(self.ctl, None, argv)

    def on_node(self, index: int, argv: list[str]) -> list[str]:
        return self._isolated(self.namespaces[index], self.node_names[index], argv)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for commands run here: Slurm's config named (no SRV look-up)."""
        env = {**os.environ, **extra}
        if self.slurm:
            env["SLURM_CONF"] = str(self.dir / "slurm.conf")
        return env

    @property
    def ssh_config(self) -> str:
        return str(self.dir / "ssh_config")

    # -- making it -----------------------------------------------------------------------------

    def __enter__(self) -> Fabric:
        try:
            self._timed("network", self._network)
            self._files()
            if self.ssh:
                self._timed("sshd", self._sshd)
            if self.slurm:
                self._timed("slurm", self._slurm)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timed(self, what: str, step: object) -> None:
        started = time.monotonic()
        step()  # type: ignore[operator]
        self.timings[what] = round(time.monotonic() - started, 3)

    def _network(self) -> None:
        _run("ip", "netns", "add", self.ctl)
        _run("ip", "-n", self.ctl, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.ctl, "addr", "add", f"{CTL_ADDRESS}/24", "dev", "br0")
        for netns in ("lo", "br0"):
            _run("ip", "-n", self.ctl, "link", "set", netns, "up")
        for index, (netns, address) in enumerate(zip(self.namespaces, self.addresses, strict=True)):
            _run("ip", "netns", "add", netns)
            outer, inner = f"v{index}", "eth0"
            _run("ip", "-n", self.ctl, "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns)
            _run("ip", "-n", self.ctl, "link", "set", outer, "master", "br0", "up")
            _run("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", inner)
            _run("ip", "-n", netns, "link", "set", inner, "up")
            _run("ip", "-n", netns, "link", "set", "lo", "up")

    def _files(self) -> None:
        original = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else "127.0.0.1 localhost\n"
        names = [f"{CTL_ADDRESS} nbctl", *(f"{a} {n}" for a, n in zip(self.addresses, self.node_names, strict=True))]
        (self.dir / "hosts").write_text(original.rstrip("\n") + "\n" + "\n".join(names) + "\n")
        (self.dir / "nsswitch.conf").write_text("passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\n")
        (self.dir / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _daemon(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.dir / log, "ab") as out:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True, preexec_fn=_die_with_parent
            )
        self.daemons.append(process)
        return process

    def _sshd(self) -> None:
        for key in ("host_key", "client_key"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"nbaccel-fabric-{key}", "-f", str(self.dir / key))
        shutil.copy(self.dir / "client_key.pub", self.dir / "authorized_keys")
        host_public = (self.dir / "host_key.pub").read_text().split()[:2]
        known = [f"{name},{address} {' '.join(host_public)}" for name, address in zip(self.node_names, self.addresses, strict=True)]
        (self.dir / "known_hosts").write_text("\n".join(known) + "\n")
        hosts = "".join(f"Host {name}\n  HostName {address}\n" for name, address in zip(self.node_names, self.addresses, strict=True))
        (self.dir / "ssh_config").write_text(
            hosts + f"Host *\n  User root\n  IdentityFile {self.dir / 'client_key'}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.dir / 'known_hosts'}\n"
            "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 10\n  LogLevel ERROR\n"
        )
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        python_path = os.environ.get("PYTHONPATH", "")
        for index, address in enumerate(self.addresses):
            config = self.dir / f"sshd_{index}.conf"
            config.write_text(
                f"ListenAddress {address}\nPort 22\nHostKey {self.dir / 'host_key'}\nPidFile {self.dir / f'sshd_{index}.pid'}\n"
                f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\nPrintMotd no\n"
                # A shared filesystem's environment: the checkout importable, no __pycache__ written into it.
                f"SetEnv PYTHONDONTWRITEBYTECODE=1{f' PYTHONPATH={python_path}' if python_path else ''}\n"
            )
            self._daemon(self.on_node(index, [_which("sshd") or "sshd", "-D", "-e", "-f", str(config)]), f"sshd_{index}.log")
        for index in range(len(self.addresses)):
            self._until(lambda i=index: self._ssh_ok(i), f"sshd on {self.node_names[index]}")

    def _ssh_ok(self, index: int) -> bool:
        done = subprocess.run(self.in_ctl(["ssh", "-F", self.ssh_config, self.node_names[index], "true"]), capture_output=True, timeout=30)
        return done.returncode == 0

    def _munge(self) -> None:
        munge = self.dir / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        shutil.chown(munge, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        for name in ("munged.log", "munged.seed"):
            (munge / name).touch()
            shutil.chown(munge / name, "munge", "munge")
        self.munge_socket = munge / "munge.socket"
        munge.chmod(0o755)  # 0700 gives clients "Socket is inaccessible"
        argv = [
            "setpriv",
            "--reuid=munge",
            "--regid=munge",
            "--clear-groups",
            _which("munged") or "munged",
            "-F",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
        ]
        argv += [f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}", f"--pid-file={munge / 'munged.pid'}"]
        self._daemon(self.in_ctl(argv), "munged.out")
        self._until(self.munge_socket.exists, "munged's socket")

    def _slurm_conf(self) -> None:
        d = self.dir
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        for name in self.node_names:
            (d / "spool" / name).mkdir()
        nodes = "".join(f"NodeName={n} NodeAddr={a} CPUs={self.cpus} State=UNKNOWN\n" for n, a in zip(self.node_names, self.addresses, strict=True))
        (d / "slurm.conf").write_text(
            f"ClusterName=nbaccel\nSlurmctldHost=nbctl({CTL_ADDRESS})\nSlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={self.munge_socket}\nStateSaveLocation={d / 'state'}\nSlurmdSpoolDir={d / 'spool'}/%n\n"
            f"SlurmctldPidFile={d / 'slurmctld.pid'}\nSlurmdPidFile={d / 'slurmd.%n.pid'}\nSlurmctldLogFile={d / 'slurmctld.log'}\nSlurmdLogFile={d / 'slurmd.%n.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\nSchedulerParameters=batch_sched_delay=0\n"
            "MpiDefault=none\nReturnToService=2\nSlurmdTimeout=30\nInactiveLimit=0\nKillWait=2\nMinJobAge=2\n"
            + nodes
            + f"PartitionName=debug Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n"
        )

    def _slurm(self) -> None:
        self._munge()
        self._slurm_conf()
        self._daemon(self._isolated(self.ctl, "nbctl", [_which("slurmctld") or "slurmctld", "-D", "-f", str(self.dir / "slurm.conf")]), "slurmctld.out")
        self._until(
            lambda: subprocess.run(self.in_ctl(["scontrol", "ping"]), capture_output=True, env=self.env(), timeout=30).stdout.count(b"UP") > 0, "slurmctld"
        )
        for index, name in enumerate(self.node_names):
            self._daemon(self.on_node(index, [_which("slurmd") or "slurmd", "-D", "-N", name, "-f", str(self.dir / "slurm.conf")]), f"slurmd_{name}.out")
        self._until(self._nodes_idle, "every slurmd idle")

    def _nodes_idle(self) -> bool:
        out = subprocess.run(self.in_ctl(["sinfo", "-h", "-N", "-o", "%N %t"]), capture_output=True, text=True, env=self.env(), timeout=30).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(name, "").startswith(("idle", "mix", "alloc")) for name in self.node_names)

    def _until(self, ready: object, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            ended = [p for p in self.daemons if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-600:] for p in self.dir.glob("*.out") if p.stat().st_size} | {
                    p.name: p.read_text()[-600:] for p in self.dir.glob("*.log")
                }
                raise RuntimeError(f"the fabric's {what} did not come up ({len(ended)} daemon(s) ended): {logs}")
            time.sleep(0.05)

    # -- removing it ---------------------------------------------------------------------------

    def processes_inside(self) -> list[int]:
        """Every process in one of the fabric's network namespaces (all started by it or its daemons)."""
        inodes = set()
        for netns in [self.ctl, *self.namespaces]:
            try:
                inodes.add(os.stat(f"/run/netns/{netns}").st_ino)
            except FileNotFoundError:
                pass
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                try:
                    if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                        found.append(int(entry))
                except OSError:
                    pass
        return found

    def close(self) -> None:
        if self.slurm and (self.dir / "slurm.conf").exists():
            subprocess.run(self.in_ctl(["scancel", "--full", "--user=root"]), capture_output=True, env=self.env(), timeout=30)
        for process in self.daemons:
            if process.poll() is None:
                process.terminate()
        for process in self.daemons:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for _ in range(50):  # slurmstepd and what it started double-forked away from our children
            left = self.processes_inside()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for netns in [*self.namespaces, self.ctl]:
            for _ in range(20):  # busy while a process of a mount namespace holding its mount ends
                if subprocess.run(["ip", "netns", "del", netns], capture_output=True).returncode == 0 or not os.path.exists(f"/run/netns/{netns}"):
                    break
                time.sleep(0.1)
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM still removes the fabric
    if sys.argv[1:] == ["check"]:
        reason = unavailable()
        print(reason or "a fabric can be made here")
        raise SystemExit(1 if reason else 0)
    started = time.monotonic()
    with Fabric() as fabric:
        print(f"up in {time.monotonic() - started:.2f} s: {fabric.timings}")
        print(subprocess.run(fabric.in_ctl(["srun", "-N2", "hostname"]), capture_output=True, text=True, env=fabric.env(), timeout=60))
        print(
            subprocess.run(fabric.in_ctl(["ssh", "-F", fabric.ssh_config, "node2", "hostname; echo $PYTHONPATH"]), capture_output=True, text=True, timeout=60)
        )
