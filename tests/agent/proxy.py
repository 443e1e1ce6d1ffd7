"""A man in the middle for tests: forwards one agent's connection to the cluster, records every
frame each way, and can inject recorded frames again (replays) or arbitrary bytes.

Example::

    with Proxy(cluster.address) as proxy:
        agent = subprocess.Popen(agent_argv(proxy.address, cluster.token_file))
        ...
        proxy.inject_to_agent(proxy.frames["to_agent"]["launch"][0])
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import threading
from collections import defaultdict
from typing import Any

from nbaccel.net.signing import FrameReader

_PREFIX = struct.Struct("!4sIQ")


def kind_of(frame: bytes) -> str:
    _, header_len, _ = _PREFIX.unpack_from(frame)
    return str(json.loads(frame[_PREFIX.size : _PREFIX.size + header_len])["kind"])


class Proxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.frames: dict[str, dict[str, list[bytes]]] = {"to_agent": defaultdict(list), "to_kernel": defaultdict(list)}
        self._agent: socket.socket | None = None
        self._kernel: socket.socket | None = None
        self._stop_r, self._stop_w = socket.socketpair()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._listener.settimeout(30)
        agent, _ = self._listener.accept()
        kernel = socket.create_connection(self._upstream)
        self._agent, self._kernel = agent, kernel
        readers = {"to_agent": FrameReader(1 << 30), "to_kernel": FrameReader(1 << 30)}
        selector = selectors.DefaultSelector()
        selector.register(agent, selectors.EVENT_READ, ("to_kernel", kernel))
        selector.register(kernel, selectors.EVENT_READ, ("to_agent", agent))
        selector.register(self._stop_r, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    direction, destination = key.data
                    try:
                        data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
                    except OSError:  # an end went away
                        return
                    if not data:
                        return
                    frames = readers[direction].feed(data)
                    for frame in frames:
                        self.frames[direction][kind_of(frame)].append(frame)
                    # Whole frames only: a chunk may end inside a frame, and an injection sent
                    # between its two halves would corrupt the stream (the link then drops).
                    with self._lock:
                        destination.sendall(b"".join(frames))
        finally:
            selector.close()
            for sock in (agent, kernel):
                sock.close()

    def inject_to_agent(self, data: bytes) -> None:
        with self._lock:
            assert self._agent is not None
            self._agent.sendall(data)

    def inject_to_kernel(self, data: bytes) -> None:
        with self._lock:
            assert self._kernel is not None
            self._kernel.sendall(data)

    def close(self) -> None:
        self._stop_w.send(b"x")
        self._listener.close()
        self._thread.join(5)
        self._stop_r.close()
        self._stop_w.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
