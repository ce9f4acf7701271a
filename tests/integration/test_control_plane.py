"""The control plane end to end: a real `elastrain server` process on a free port (SQLite, PostgreSQL).

The main flow: create -> Running -> hostfile -> exec -> scale 2->4 -> scale 4->2 -> delete (no
process left), and auth isolation. The harness (`ControlPlane`, waits, cluster conditions) is
`elastrain.testing`; the `cp` and `postgres` fixtures are in tests/conftest.py. Every process started
here is stopped by PID; every wait is a bounded poll.
"""

from __future__ import annotations

import json
import time

import pytest

from elastrain.backends.procs import pid_alive
from elastrain.backends.shm import shm_limit_supported
from elastrain.client import ClientError
from elastrain.testing.clusters import hostfile_hosts, hostfile_with, settled
from elastrain.testing.server import ControlPlane
from elastrain.testing.server import container_inits as init_pids
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(120)


def test_cluster_lifecycle(cp: ControlPlane) -> None:
    (cp.mounts / "data").mkdir(exist_ok=True)
    (cp.mounts / "data" / "hello.txt").write_text("hi\n")
    t0 = time.monotonic()
    created = cp.cli(
        "cluster",
        "create",
        "tthvd",
        "--framework",
        "horovod",
        "--containers",
        "2",
        "--gpus-per-container",
        "1",
        "--shm",
        "1Gi",
        "--mount",
        "./mounts/data:/data",
        "--image",
        "local",
    )
    assert created.returncode == 0, created.stderr
    with cp.client() as c:
        cluster = c.wait_cluster("tthvd", settled(c, "tthvd"), timeout=60)
        record_timing(cp, "create -> all Running", time.monotonic() - t0)
        got = json.loads(cp.cli("cluster", "get", "tthvd", "-o", "json").stdout)
        assert {"name", "framework", "containers", "desired_containers", "hostfile_generation"} <= set(got)
        assert [k["role"] for k in got["containers"]] == ["launcher", "worker"]
        for k in got["containers"]:
            assert {"name", "role", "address", "gpus", "state"} <= set(k)
            assert k["address"].startswith("127.") and k["gpus"] == 1 and k["state"] == "Running"
        pids = {k.pid for k in cluster.containers}
        assert all(p and pid_alive(p) for p in pids)
        launcher, worker = cluster.running("launcher")[0], cluster.running("worker")[0]
        text = c.hostfile("tthvd")  # the launcher runs a worker too: 2 containers, -np 2
        assert hostfile_hosts(text) == [launcher.address, worker.address] and text.startswith(
            "# generation: "
        )
        assert cp.cli("cluster", "hostfile", "tthvd").stdout == text
        assert f"up at {cluster.containers[0].address}" in cp.cli("cluster", "logs", "tthvd").stdout
        for k in cluster.containers:  # every container reads the same file at its etc/mpi/hostfile
            assert (cp.data / "clusters" / "tthvd" / k.name / "etc" / "mpi" / "hostfile").read_text() == text

        out = cp.cli(
            "cluster",
            "exec",
            "tthvd",
            "--",
            "sh",
            "-c",
            "cat /etc/mpi/hostfile; cat /data/hello.txt; echo gpus=$ELASTRAIN_VISIBLE_GPUS; "
            "echo shm=$(df -k /dev/shm | tail -1 | awk '{print $2}'); exit 3",
        )
        assert out.returncode == 3 and text in out.stdout and "hi\n" in out.stdout and "gpus=0" in out.stdout
        if shm_limit_supported():  # root: the container's /dev/shm is a tmpfs of --shm 1Gi, as in docker
            assert "shm=1048576\n" in out.stdout, out.stdout

        t0 = time.monotonic()
        assert cp.cli("cluster", "scale", "tthvd", "--containers", "4").returncode == 0
        text = wait_until(lambda: hostfile_with(c, "tthvd", 4), 60, "4 hosts in the hostfile")
        record_timing(cp, "scale 2->4 -> hostfile updated", time.monotonic() - t0)
        cluster = c.wait_cluster("tthvd", settled(c, "tthvd"), timeout=60)
        record_timing(cp, "scale 2->4 -> all Running", time.monotonic() - t0)
        assert sorted(hostfile_hosts(text)) == sorted(k.address for k in cluster.containers)
        assert len({k.address for k in cluster.containers}) == 4
        big_pids = {k.pid for k in cluster.containers}

        assert cp.cli("cluster", "scale", "tthvd", "--containers", "2").returncode == 0
        cluster = c.wait_cluster(
            "tthvd", lambda x: len(x.containers) == 2 and settled(c, "tthvd")(x), timeout=60
        )
        assert len(hostfile_hosts(c.hostfile("tthvd"))) == 2
        wait_until(
            lambda: not any(pid_alive(p) for p in big_pids - {k.pid for k in cluster.containers}),
            60,
            "scaled-down containers to stop",
        )
        assert {"cluster.scaled", "hostfile.written", "container.removed"} <= {
            e["action"] for e in c.events("tthvd")
        }

        deleted = cp.cli("cluster", "delete", "tthvd")
        assert deleted.returncode == 0, deleted.stderr
        with pytest.raises(ClientError) as err:
            c.get_cluster("tthvd")
        assert err.value.status == 404
        assert not any(pid_alive(p) for p in big_pids | pids)
        assert not init_pids(cp.data) and not (cp.data / "clusters" / "tthvd").exists()


def test_auth_isolation(cp: ControlPlane) -> None:
    assert (cp.data / "admin-token").stat().st_mode & 0o777 == 0o600
    with cp.client() as admin:
        alice = cp.client(admin.create_user("alice"))
        bob = cp.client(admin.create_user("bob"))
    with alice, bob:
        alice.create_cluster("alice-c", containers=2)
        assert [c.name for c in alice.list_clusters()] == ["alice-c"]
        assert bob.list_clusters() == []
        calls = [
            lambda: bob.get_cluster("alice-c"),
            lambda: bob.scale_cluster("alice-c", 3),
            lambda: bob.delete_cluster("alice-c"),
            lambda: bob.hostfile("alice-c"),
            lambda: list(bob.exec("alice-c", ["true"])),
            lambda: bob.events("alice-c"),
        ]
        for call in calls:
            with pytest.raises(ClientError) as err:
                call()
            assert err.value.status == 404 and "not found" in str(err.value)
        with pytest.raises(ClientError) as err:
            bob.create_user("mallory")
        assert err.value.status == 403
        with cp.client() as admin:  # an admin sees every cluster but runs commands only in their own
            assert admin.get_cluster("alice-c").owner == "alice"
            for call in (
                lambda: list(admin.exec("alice-c", ["true"])),
                lambda: admin.submit_job("alice-c", ["true"]),
            ):
                with pytest.raises(ClientError) as err:
                    call()
                assert err.value.status == 403 and "owner" in str(err.value)
        for token in ("", "et_wrong"):
            with cp.client(token) as anon, pytest.raises(ClientError) as err:
                anon.list_clusters()
            assert err.value.status == 401
        alice.delete_cluster("alice-c")
        alice.wait_deleted("alice-c")
