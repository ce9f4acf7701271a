"""Issue item 8: the job's torch TCPStore (unauthenticated in torch) listens on the coordinator's address
only, on an ephemeral port the workers learn over the coordinator's channel, with the job's keys under
a prefix derived from the job token.

torch's store answers ``list_keys`` to any client, so the prefix hides nothing from a stranger who
reaches the port and lists; it only defeats one that addresses the well-known key names (what these
tests replay). Where the store listens is the protection (docs/security.md, "Network exposure").
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import socket
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elastrain.launcher.store import start_store
from elastrain.rendezvous.api import Cause, Generation, Member
from elastrain.rendezvous.wire import parse_address
from elastrain.runtime.group import GroupManager, store_prefix
from elastrain.runtime.netaddr import _interface_ipv4
from elastrain.testing.jobs import ElasticJob, hosts

pytestmark = pytest.mark.timeout(120)

TOKEN = "0123456789abcdef0123456789abcdef"
GLOO_KEY = "0//cpu//0/0"  # the key under which gloo's rank 0 publishes its address (torch 2.x)


def listening_addresses(port: int) -> list[str]:
    """The local addresses of every listening TCP socket on `port`, read from /proc/net/tcp{,6}."""
    found = []
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port or fields[3] != "0A":  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # the kernel prints each 32-bit word in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
            found.append(str(ipaddress.ip_address(words)))
    return found


def other_local_ipv4() -> str | None:
    """A non-loopback IPv4 address of this machine (a container's bridge address), if any."""
    for _, name in socket.if_nameindex():
        address = _interface_ipv4(name)
        if address is not None and not address.startswith("127."):
            return address
    return None


def refused(host: str, port: int) -> bool:
    """True when a TCP connection to host:port is refused (nothing listens there for that address)."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def stranger(port: int, host: str = "127.0.0.1") -> dist.TCPStore:
    """A client without the job token that found the store's port."""
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=5), use_libuv=True)


@pytest.fixture
def one_rank_group() -> Iterator[tuple[dist.TCPStore, str]]:
    """A world-of-one gloo group of generation 1 that met in a store from `start_store`."""
    store, address = start_store("127.0.0.1")
    groups = GroupManager("gloo", 10.0, 0, "127.0.0.1", TOKEN)
    member = Member("127.0.0.1#0", "127.0.0.1", 1, 0)
    groups.build(Generation(1, (member,), Cause.START, address), 0)
    try:
        value = torch.ones(2)
        dist.all_reduce(value)
        assert value.tolist() == [1.0, 1.0]
        yield store, address
    finally:
        groups.destroy()


@pytest.mark.attack
def test_the_store_listens_on_the_chosen_address_only() -> None:
    store, address = start_store("127.0.0.1")
    host, port = parse_address(address)
    assert (host, port) == ("127.0.0.1", store.port) and port > 0
    assert listening_addresses(port) == ["127.0.0.1"]  # not 0.0.0.0 or [::], torch's own choice
    assert refused("127.0.0.2", port)  # another address of this very machine does not reach it
    other = other_local_ipv4()
    if other is not None:
        assert refused(other, port)  # nor does the machine's network address
    client = stranger(port)  # the address the workers were given works
    client.set("probe", "ok")
    assert store.get("probe") == b"ok"


def test_every_store_gets_a_fresh_ephemeral_port() -> None:
    first, first_address = start_store("127.0.0.1")
    second, second_address = start_store("127.0.0.1")
    assert first.port != second.port and first_address != second_address


def test_an_address_that_is_not_this_machines_is_refused() -> None:
    with pytest.raises(OSError):
        start_store("192.0.2.1")  # TEST-NET-1: never a local address


@pytest.mark.attack
def test_a_stranger_reading_the_well_known_keys_gets_nothing(
    one_rank_group: tuple[dist.TCPStore, str],
) -> None:
    store, _ = one_rank_group
    prefix = store_prefix(TOKEN, 1)
    assert store.check([f"{prefix}/{GLOO_KEY}"])  # the group did meet there: the guesses below are fair
    client = stranger(store.port)
    client.set_timeout(datetime.timedelta(seconds=1))
    guesses = [f"elastrain/g1/{GLOO_KEY}", GLOO_KEY, f"default_pg/{GLOO_KEY}", f"elastrain/{GLOO_KEY}"]
    assert not client.check(guesses)
    for key in guesses:
        started = time.monotonic()
        with pytest.raises(dist.DistStoreError):
            client.get(key)
        assert time.monotonic() - started < 10


def test_the_prefix_is_per_job_and_per_generation_and_does_not_reveal_the_token() -> None:
    prefix = store_prefix(TOKEN, 1)
    assert prefix == store_prefix(TOKEN, 1) and prefix.endswith("/g1")
    assert store_prefix(TOKEN, 2) != prefix and store_prefix("another-job-token", 1) != prefix
    assert TOKEN not in prefix and TOKEN[:6] not in prefix
    assert len(prefix.split("/")[1]) == 16


JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    import elastrain
    from elastrain.runtime.loop import get_runtime

    elastrain.init()
    state = elastrain.State(step_no=0)

    @elastrain.run
    def train(state):
        value = torch.ones(1)
        dist.all_reduce(value)
        rt = get_runtime()
        gen = rt.generation
        print(f"store={gen.store_address} generation={gen.number} sum={int(value.item())}", flush=True)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.05)
        dist.barrier()

    train(state)
    """
)


@pytest.mark.attack
def test_a_real_jobs_store_is_bound_to_the_coordinator_host_with_prefixed_keys(tmp_path: Path) -> None:
    script, release = tmp_path / "job.py", tmp_path / "release"
    script.write_text(JOB)
    (tmp_path / "run").mkdir()
    job = ElasticJob(
        tmp_path / "run",
        hosts(2),
        ["-np", "2", "--coordinator-host", "127.0.0.1"],
        [sys.executable, str(script), str(release)],
        env={"ELASTRAIN_JOB_TOKEN": TOKEN},
    )
    try:
        job.watcher.wait("both ranks met", lambda: job.output().count("sum=2") == 2, timeout=90)
        [(address, number)] = set(re.findall(r"store=(\S+) generation=(\d+) sum=2", job.output()))
        host, port = parse_address(address)
        assert host == "127.0.0.1" and listening_addresses(port) == ["127.0.0.1"]
        assert refused("127.0.0.2", port)  # the workers' own host addresses do not reach it
        client = stranger(port)
        keys = client.list_keys()  # torch lets any client list (see the module docstring)
        prefix = store_prefix(TOKEN, int(number))
        assert keys and all(k.startswith(f"{prefix}/") for k in keys), keys
        well_known = [k.replace(prefix, f"elastrain/g{number}", 1) for k in keys]
        assert not client.check(well_known)  # what a worker used before: nothing there
        release.touch()
        assert job.wait(timeout=60) == 0, job.output()[-3000:]
    finally:
        release.touch()
        job.cleanup()
