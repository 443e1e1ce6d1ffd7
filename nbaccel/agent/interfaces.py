"""Which network interface holds an address: gloo and NCCL must use the one the cluster runs on.

Example:
    >>> interface_of("127.0.0.1")
    'lo'
"""

from __future__ import annotations

import fcntl
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def interface_of(address: str) -> str | None:
    """The name of the interface whose IPv4 address is ``address``, or None if none is."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for name in names:
            if _address_of(probe, name) == address:
                return name
    finally:
        probe.close()
    return None


def _address_of(probe: socket.socket, name: str) -> str | None:
    request = struct.pack("256s", name.encode()[:15])
    try:
        reply = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
    except OSError:  # no IPv4 address on it
        return None
    return socket.inet_ntoa(reply[20:24])
