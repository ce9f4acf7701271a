"""Which local network interface holds a host's address, so gloo binds the host's own address."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface


def _interface_ipv4(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_for(host: str) -> str | None:
    """The interface carrying `host` when it is a non-loopback IPv4 address of this machine, else None.

    Loopback hosts (127.x) keep gloo's default (the hostname's address): every worker is local then.
    """
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        return None
    if address.is_loopback:
        return None
    for _, name in socket.if_nameindex():
        if _interface_ipv4(name) == host:
            return name
    return None
