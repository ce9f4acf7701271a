"""The cluster platform chaos runs on: a private container-backend server (podman, fake GPUs), its data
directory on a small tmpfs (so that the disk can be filled for real), one cluster and one elastic job
that writes the sample ledger and checkpoints to a shared host directory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

from elastrain.backends.podmanctl import podman
from elastrain.client import Client
from elastrain.errors import ElastrainError
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane, fake_gpus, server_containers, shared_storage
from elastrain.testing.waits import wait_until

CLUSTER = "chaos"
SAMPLES = 10000  # the example's training set (mnist1d)
DATA_DISK = "64m"  # the data directory's tmpfs: room for the database and the clusters' files


class PlatformUnavailable(ElastrainError):
    """This machine cannot run platform chaos (no podman that runs containers, not root)."""


def mount_small_disk(path: Path, size: str = DATA_DISK) -> None:
    """A size-limited tmpfs at `path` (needs root, or CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise PlatformUnavailable(
            f"cannot mount a {size} tmpfs at {path} for the data directory (needs root): "
            f"{done.stderr.strip()}"
        )


def unmount(path: Path) -> None:
    """Unmount `path` (lazily: a process still holding a file there does not keep it)."""
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


class PlatformCluster:
    """A started container-backend server with one cluster of `containers` and an elastic job on it."""

    def __init__(self, root: Path, containers: int = 3, max_np: int = 4, epochs: int = 10) -> None:
        self.root = root
        self.containers = containers
        self.max_np = max_np
        self.epochs = epochs
        mount_small_disk(root / "data")
        self.plane = ContainerPlane(root, fake_gpus(root / "gpus", 8))
        self.data = shared_storage(self.plane, "shared")
        self.ledger = self.data / "ledger"
        self.slow = self.data / "slow"
        self.job_id = 0

    @property
    def key(self) -> str:
        """The server's label value."""
        return self.plane.key

    def container_name(self, name: str) -> str:
        """podman's name of cluster container `name` (e.g. ``chaos-worker-1``)."""
        return f"elastrain-{self.key}-{name}"

    def client(self) -> Client:
        """An admin client."""
        return self.plane.client()

    def start(self, step_sleep: float = 0.3, max_platform_restarts: int = 3) -> dict[str, Any]:
        """Start the server, create the cluster and submit the job (slowed until `full_speed`; started
        again at most `max_platform_restarts` times after its launcher died)."""
        self.plane.start()
        self.slow.touch()
        elastic = (
            f"elastrain run --min-np 2 --max-np {self.max_np} --hostfile /etc/mpi/hostfile "
            "--heartbeat-timeout 5 --start-timeout 300 --ledger /data/ledger "
            "--checkpoint-dir /data/ckpt --checkpoint-every 10"
        )
        train = (
            f"python /data/mnist_elastic.py --epochs {self.epochs} --batch-size 200 "
            f"--step-sleep {step_sleep} --slow-while /data/slow"
        )
        with self.client() as c:
            c.create_cluster(
                CLUSTER, framework="pytorch", containers=self.containers, mounts=[f"{self.data}:/data"]
            )
            c.wait_cluster(CLUSTER, all_running, timeout=120)
            self.seed_dataset()
            job = c.submit_job(
                CLUSTER, f"{elastic} {train}".split(), max_platform_restarts=max_platform_restarts
            )
        self.job_id = int(job["id"])
        return job

    def seed_dataset(self) -> None:
        """Put the example's dataset in the cluster's home (its cache there), made on this machine once:
        else every fresh cluster generates it first (mnist1d, a matplotlib font cache), minutes under load."""
        import importlib.util
        import shutil

        from elastrain.testing.jobs import EXAMPLE

        spec = importlib.util.spec_from_file_location("mnist1d_data", EXAMPLE.parent / "mnist1d_data.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.load()  # generated here once, then cached
        home = self.plane.data / "clusters" / CLUSTER / "home"
        owner = home.stat()
        target = home / ".cache" / "elastrain" / module.cache_path().name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module.cache_path(), target)
        for path in (home / ".cache", target.parent, target):
            os.chown(path, owner.st_uid, owner.st_gid)

    def full_speed(self) -> None:
        """Let the job run at full speed to its end."""
        self.slow.unlink(missing_ok=True)

    def wait_end(self, timeout: float = 600) -> dict[str, Any]:
        """Wait for the job to end; returns it."""
        with self.client() as c:

            def ended() -> dict[str, Any] | None:
                job = c.get_job(self.job_id)
                return None if job["status"] in ("Running", "Pending") else job

            return wait_until(ended, timeout, "the job to end")

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the job's log."""
        with self.client() as c:
            return c.job_logs(self.job_id)[0][-chars:]

    def orphans(self) -> list[str]:
        """podman containers of this server that the server does not account for: not a container of a
        cluster it lists, or more than one of a name (after a scale or restart: should be none)."""
        with self.client() as c:
            known = {self.container_name(k.name) for cluster in c.list_clusters() for k in cluster.containers}
        return [name for name in server_containers(self.key) if name not in known]

    def lost(self) -> list[str]:
        """Containers the server shows Running that podman does not have (should be none)."""
        present = set(server_containers(self.key))
        with self.client() as c:
            return [
                k.name
                for cluster in c.list_clusters()
                for k in cluster.containers
                if k.state == "Running" and self.container_name(k.name) not in present
            ]

    def stop(self) -> list[str]:
        """Delete the cluster, stop the server, remove anything left (returned), unmount the disk."""
        key = self.key
        with contextlib.suppress(Exception):  # a broken server: its containers are removed below
            self.plane.stop()
        left = server_containers(key)
        if left:
            podman("rm", "--force", "--time", "0", *left, check=False)
        networks = podman(
            "network", "ls", "--filter", f"label=elastrain.server={key}", "--format", "{{.Name}}", check=False
        ).stdout.split()
        if networks:
            podman("network", "rm", "--force", *networks, check=False)
        unmount(self.root / "data")
        return left + networks
