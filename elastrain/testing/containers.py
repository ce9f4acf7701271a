"""The container backend under test: a `ControlPlane` on podman with fake GPUs, framework images and
clusters, and the scale-out-and-in drive the framework tests share.

Skips (`need_podman`) import pytest lazily: the module is importable without it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastrain.backends.podmanctl import podman, podman_works
from elastrain.testing.clusters import all_running
from elastrain.testing.jobs import EXAMPLE
from elastrain.testing.server import ControlPlane
from elastrain.testing.timings import record_timing
from elastrain.testing.waits import wait_until

if TYPE_CHECKING:
    from elastrain.client import Client


def need_podman() -> None:
    """Skip (with the reason) where podman cannot run containers or images cannot be built."""
    import pytest

    if not podman_works():
        pytest.skip("podman with runc cannot run containers here (make container-deps)")
    if shutil.which("mmdebstrap") is None:
        pytest.skip("mmdebstrap is missing: images cannot be built (make container-deps)")


def framework_image(framework: str) -> str:
    """The image of `framework`, built when its inputs changed (a no-op otherwise; the rootfs and the
    base venv are shared by every framework's image)."""
    need_podman()
    from elastrain.images.build import build_image

    return build_image(framework, progress=lambda line: None).name


def server_containers(key: str) -> list[str]:
    """Names of the podman containers of the server whose label key is `key`."""
    out = podman("ps", "--all", "--filter", f"label=elastrain.server={key}", "--format", "{{.Names}}")
    return out.stdout.split()


class ContainerPlane(ControlPlane):
    """A `ControlPlane` on the container backend; cleanup checks that no container or network is left."""

    def __init__(self, root: Path, gpu_dir: Path | None, gpus: int | None = 8) -> None:
        """`gpu_dir`: fake GPU device nodes (None: the machine's /dev); `gpus` as in `ControlPlane`."""
        super().__init__(root, gpus=gpus, extra_args=("--backend", "container"))
        self.gpu_dir = gpu_dir

    def server_env(self) -> dict[str, str]:
        """The server's environment, with ELASTRAIN_GPU_DEVICE_DIR set to `gpu_dir` (or unset)."""
        env = super().server_env()
        env.pop("ELASTRAIN_GPU_DEVICE_DIR", None)
        if self.gpu_dir is not None:
            env["ELASTRAIN_GPU_DEVICE_DIR"] = str(self.gpu_dir)
        return env

    @property
    def key(self) -> str:
        """The server's label value (`elastrain.server`)."""
        from elastrain.backends.container import server_key

        return server_key(self.data)

    def cleanup(self) -> None:
        """`ControlPlane.cleanup`, then no container or network of this server may be left."""
        key = self.key
        super().cleanup()
        left = server_containers(key)
        networks = podman(
            "network", "ls", "--filter", f"label=elastrain.server={key}", "--format", "{{.Name}}"
        )
        if left:
            podman("rm", "--force", "--time", "0", *left, check=False)
        assert not left, f"containers left behind: {left}"
        assert not networks.stdout.split(), f"networks left behind: {networks.stdout}"


def shared_storage(plane: ControlPlane, name: str) -> Path:
    """A host directory holding the example, for the admin's clusters to mount (a host path: admins
    only; a tenant mounts a storage area instead), owned by the admin's uid in containers (the first
    user's) so that jobs write there. A test host that is not root cannot give it away: there it stays
    the test's, 0755, and only reads work."""
    from elastrain.server.reconciler import tenant_uid

    data = plane.mounts / name
    data.mkdir(exist_ok=True)
    for script in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(EXAMPLE.parent / script, data / script)
    if os.geteuid() == 0:
        for path in (data, *data.iterdir()):
            os.chown(path, tenant_uid(1), tenant_uid(1))
    return data


def fake_gpus(directory: Path, count: int) -> Path:
    """`count` fake GPU device nodes ``nvidiaN`` (character devices, as the Slurm reference makes them)."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        node = directory / f"nvidia{index}"
        if not node.exists():
            subprocess.run(["mknod", str(node), "c", "1", "3"], check=True)
    return directory


@contextlib.contextmanager
def container_plane(root: Path) -> Iterator[ContainerPlane]:
    """A started server on the container backend with 8 fake GPUs; cleaned up (and checked) after."""
    plane = ContainerPlane(root, fake_gpus(root / "gpus", 8))
    plane.start()
    try:
        yield plane
    finally:
        plane.cleanup()


@contextlib.contextmanager
def framework_cluster(
    plane: ContainerPlane, name: str, framework: str, containers: int, data: Path | None = None
) -> Iterator[Client]:
    """A cluster of `framework` (its image built first; `data` mounted at /data), deleted after."""
    framework_image(framework)
    args = ["cluster", "create", name, "--framework", framework, "--containers", str(containers), "--wait"]
    if data is not None:
        args += ["--mount", f"{data}:/data"]
    made = plane.cli(*args)
    assert made.returncode == 0, made.stderr
    with plane.client() as c:
        assert c.get_cluster(name).image.startswith(f"localhost/elastrain-{framework}")
        yield c
        c.delete_cluster(name)
        c.wait_deleted(name, timeout=90)


def hold_with(path: Path) -> Callable[[bool], None]:
    """The `hold` of `follow_scale_out_and_in` for an example run with ``--hold-file`` (its host path)."""

    def hold(on: bool) -> None:
        if on:
            path.touch()
        else:
            path.unlink(missing_ok=True)

    return hold


def follow_scale_out_and_in(
    plane: ContainerPlane,
    c: Client,
    cluster: str,
    job_id: int,
    steps_at: Callable[[int], int],
    sizes: tuple[int, int],
    label: str,
    hold: Callable[[bool], None] | None = None,
) -> tuple[dict[str, Any], str]:
    """Drive a running restart-mode job through scale 2 -> 4 -> 2 of `cluster` and wait for its end.

    `steps_at(size)` counts the job's steps at a (framework-specific) size; `sizes` are that size at
    2 and at 4 containers. Records both resize pauses (scale -> first step at the new size); returns
    the finished job and its log. With `hold` (True: the job pauses after its current step, False:
    it goes on; a restart for a resize ends a pause) the job is held from each resize until its first
    step at the new size: it cannot reach its last step before the resize, however slow the machine.
    """
    small, big = sizes

    def at_least(size: int, steps: int) -> bool:
        current = c.get_job(job_id)
        assert current["status"] == "Running", c.job_logs(job_id)[0][-4000:]
        return steps_at(size) >= steps

    held = hold or (lambda on: None)
    wait_until(lambda: at_least(small, 5), 180, f"5 steps at size {small}")
    held(True)
    t0 = time.monotonic()
    c.scale_cluster(cluster, 4)
    c.wait_cluster(cluster, all_running, timeout=90)
    wait_until(lambda: at_least(big, 1), 180, f"the first step at size {big}")
    held(False)
    record_timing(plane, f"{label}: scale 2 -> 4 -> first step at {big}", time.monotonic() - t0)
    wait_until(lambda: at_least(big, 4), 60, f"4 steps at size {big}")
    held(True)
    t0 = time.monotonic()
    before = steps_at(small)
    c.scale_cluster(cluster, 2)
    wait_until(lambda: at_least(small, before + 1), 180, f"a step at size {small} again")
    held(False)
    record_timing(plane, f"{label}: scale 4 -> 2 -> first step at {small}", time.monotonic() - t0)
    done: dict[str, Any] = wait_until(
        lambda: (j := c.get_job(job_id))["status"] != "Running" and j, 300, "the job to finish"
    )
    return done, c.job_logs(job_id)[0]
