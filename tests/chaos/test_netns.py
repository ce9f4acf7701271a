"""The namespaced hosts of the partition scenario: reachable, cut off by a partition, never leaked."""

from __future__ import annotations

import subprocess

import pytest

from elastrain.chaos.netns import NetHosts, NetnsUnavailable, check_available


def _reach(net: NetHosts, i: int, address: str) -> str:
    """'refused' (reachable, nothing listening) or 'timeout' (cut off), probed from inside host `i`."""
    probe = (
        f"import socket\ntry:\n socket.create_connection(({address!r}, 9), timeout=1)\n"
        "except OSError as e:\n print(e)"
    )
    out = subprocess.run([*net.exec_prefix(i), "python3", "-c", probe], capture_output=True, text=True).stdout
    return "refused" if "refused" in out.lower() else "timeout"


def test_partition_cuts_one_host_off_and_teardown_removes_everything() -> None:
    try:
        check_available()
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    with NetHosts(2) as net:
        names = [net.namespace(0), net.namespace(1)]
        assert _reach(net, 0, net.address(1)) == "refused"
        net.partition(0)
        assert _reach(net, 0, net.gateway) == "timeout"
        assert _reach(net, 1, net.gateway) == "refused"  # the others still reach the coordinator
        net.heal(0)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names), listed
    assert net.bridge not in links and net.port(0) not in links
