"""The `Backend` contract: one suite that every backend passes, so the reconciler, the exec service and the
jobs can rely on the same behaviour whichever backend the server runs.

Parametrised over the in-memory backend (`elastrain.backends.fake`), the process backend (`local`), the
container backend (podman; skipped where podman cannot run containers or no elastrain image is built:
``make image``), the Slurm backend (the private cluster of ``tests/slurm``; skipped without
slurm-wlm) and the Kubernetes backend (the private control plane of ``tests/k8s``; skipped without
``make k8s-deps``; the cases that need a running container skip where its kubelet node cannot
run). The fake and process parts take a few seconds.
"""

from __future__ import annotations

import random
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastrain.backends.api import Backend, ContainerSpec, ContainerStatus, ImageEntry
from elastrain.backends.local import HOSTFILE_PATH
from elastrain.server.reconciler import tenant_uid
from tests.k8s.conftest import (
    NO_KUBELET,
    _session_node,  # noqa: F401 - the kubernetes case's fixtures
    k8s_namespace,  # noqa: F401
    kube_plane,  # noqa: F401
    node_runs_pods,
)
from tests.slurm.conftest import slurm_cluster  # noqa: F401 - the Slurm parametrisation's fixture

pytestmark = pytest.mark.timeout(180)
HOSTFILE = "# generation: 3\nct-launcher slots=1\nct-worker-1 slots=1\n"


@dataclass
class Subject:
    """A backend under test and a cluster of two containers it may create."""

    backend: Backend
    launcher: ContainerSpec
    worker: ContainerSpec
    ready_s: float  # how long a container may take to become ready
    runs_pods: bool = True  # False: containers are created but never run (Kubernetes without a kubelet)
    file_delay_s: float = 0.0  # how long a written file may take to show in the containers (Kubernetes:
    # the kubelet projects a ConfigMap into pods at its next sync of each pod)


def _specs(image: str, cluster: str) -> tuple[ContainerSpec, ContainerSpec]:
    uid = secrets.token_hex(8)
    net = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"

    def spec(name: str, role: str, host: int) -> ContainerSpec:
        return ContainerSpec(
            cluster=cluster,
            cluster_uid=uid,
            name=f"{cluster}-{name}",
            role=role,
            address=f"{net}.{host}",
            image=image,
            framework="pytorch",
            tenant="alice",
            tenant_uid=tenant_uid(1),
        )

    return spec("launcher", "launcher", 1), spec("worker-1", "worker", 2)


def _fake(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Backend, str, float]:
    from elastrain.backends.fake import FakeBackend

    return FakeBackend(tmp_path / "scratch"), "local", 1.0


def _process(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Backend, str, float]:
    from elastrain.backends.local import LocalBackend

    return LocalBackend(tmp_path / "data", stop_timeout_s=3.0), "local", 20.0


def _container(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Backend, str, float]:
    from elastrain.backends.podmanctl import podman_works

    if not podman_works():
        pytest.skip("podman with runc cannot run containers here (apt-get install podman runc)")
    from elastrain.backends.container import ContainerBackend
    from elastrain.images.catalog import default_image_for

    image = default_image_for("pytorch")
    if image is None:
        pytest.skip("no elastrain image holds pytorch (make image)")
    return ContainerBackend(tmp_path / "data", stop_timeout_s=3), image.name, 120.0


def _slurm(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Backend, str, float]:
    from elastrain.backends.slurm import SlurmBackend
    from elastrain.backends.slurmctl import SlurmCommands

    cluster = request.getfixturevalue("slurm_cluster")  # skips without slurm-wlm
    commands = SlurmCommands(cluster.env)
    return SlurmBackend(tmp_path / "data", stop_timeout_s=3.0, commands=commands), "local", 60.0


def _kubernetes(tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Backend, str, float]:
    from tests.k8s.conftest import make_backend

    plane = request.getfixturevalue("kube_plane")  # skips without `make k8s-deps`
    namespace = request.getfixturevalue("k8s_namespace")
    return make_backend(plane, namespace, tmp_path / "data"), "localhost/elastrain-pytorch:latest", 120.0


BACKENDS: dict[str, Callable[[Path, pytest.FixtureRequest], tuple[Backend, str, float]]] = {
    "fake": _fake,
    "process": _process,
    "container": _container,
    "slurm": _slurm,
    "kubernetes": _kubernetes,
}


@pytest.fixture(
    params=[
        "fake",
        "process",
        pytest.param("container", marks=pytest.mark.slow),
        pytest.param("slurm", marks=pytest.mark.slurm),
        pytest.param("kubernetes", marks=pytest.mark.k8s),
    ]
)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    backend, image, ready_s = BACKENDS[request.param](tmp_path, request)
    launcher, worker = _specs(image, f"ct{secrets.token_hex(3)}")
    try:
        runs_pods = request.param != "kubernetes" or node_runs_pods(request)  # a kubelet node here
        delay = 60.0 if request.param == "kubernetes" else 0.0
        yield Subject(backend, launcher, worker, ready_s, runs_pods=runs_pods, file_delay_s=delay)
    finally:
        backend.delete_cluster(launcher.cluster, launcher.cluster_uid)
        backend.close()


def _find(backend: Backend, spec: ContainerSpec) -> ContainerStatus | None:
    return next(
        (s for s in backend.list_containers() if (s.cluster, s.name) == (spec.cluster, spec.name)), None
    )


def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _started(subject: Subject, *specs: ContainerSpec) -> None:
    """Create `specs` (default: the launcher) and wait until each is listed alive and ready."""
    if not subject.runs_pods:
        pytest.skip(NO_KUBELET)
    for spec in specs or (subject.launcher,):
        subject.backend.create_container(spec)
    for spec in specs or (subject.launcher,):

        def ready(spec: ContainerSpec = spec) -> bool:
            status = _find(subject.backend, spec)
            return status is not None and status.alive and status.ready

        _until(ready, subject.ready_s, f"{spec.name} to be ready")


def _run(backend: Backend, spec: ContainerSpec, command: list[str], timeout: float = 60) -> tuple[int, str]:
    proc = backend.exec(spec, command)
    out, _err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(errors="replace")


def _stranger() -> subprocess.Popen[bytes]:
    """A process on this machine that no container holds (in its own session, as exec'd ones are)."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def test_create_is_idempotent_and_lists_the_container(subject: Subject) -> None:
    backend, spec = subject.backend, subject.launcher
    first = backend.create_container(spec)
    assert (first.cluster, first.name) == (spec.cluster, spec.name) and first.alive
    _started(subject)
    again = backend.create_container(spec)  # a live container: a no-op returning its status
    assert again.alive and again.pid == _find(backend, spec).pid  # type: ignore[union-attr]
    assert [s.name for s in backend.list_containers() if s.cluster == spec.cluster] == [spec.name]


def test_delete_is_idempotent(subject: Subject) -> None:
    backend, launcher, worker = subject.backend, subject.launcher, subject.worker
    backend.delete_container(launcher.cluster, "never-created", launcher.cluster_uid)  # missing: a no-op
    _started(subject, launcher, worker)
    backend.delete_container(worker.cluster, worker.name, worker.cluster_uid)
    backend.delete_container(worker.cluster, worker.name, worker.cluster_uid)
    _until(lambda: _find(backend, worker) is None, 30, f"{worker.name} to go")
    assert _find(backend, launcher) is not None
    backend.delete_cluster(launcher.cluster, launcher.cluster_uid)
    backend.delete_cluster(launcher.cluster, launcher.cluster_uid)
    _until(lambda: not [s for s in backend.list_containers() if s.cluster == launcher.cluster], 30, "none")


def test_a_written_file_is_seen_in_every_container(subject: Subject) -> None:
    backend, launcher, worker = subject.backend, subject.launcher, subject.worker
    _started(subject, launcher, worker)
    backend.write_cluster_file(launcher.cluster, HOSTFILE_PATH, HOSTFILE)
    for spec in (launcher, worker):
        _sees(subject, spec, HOSTFILE)
    on_disk = backend.hostfile_path(launcher.cluster)
    assert on_disk is None or on_disk.read_text() == HOSTFILE
    backend.write_cluster_file(launcher.cluster, HOSTFILE_PATH, HOSTFILE + "# again\n")  # rewritten
    _sees(subject, launcher, HOSTFILE + "# again\n")


def _sees(subject: Subject, spec: ContainerSpec, text: str) -> None:
    """`spec`'s container reads `text` at the hostfile's path (within `file_delay_s`)."""
    path = subject.backend.path_inside(spec.cluster, spec.name, HOSTFILE_PATH)
    seen: list[tuple[int, str]] = []

    def check() -> bool:
        seen.append(_run(subject.backend, spec, ["cat", path]))
        return seen[-1] == (0, text)

    if not check():
        _until(check, subject.file_delay_s, f"{spec.name} to read {text!r}, read {seen[-1]!r}")


def test_exec_returns_the_output_and_the_exit_code(subject: Subject, tmp_path: Path) -> None:
    backend, spec = subject.backend, subject.launcher
    _started(subject)
    code, out = _run(backend, spec, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert code == 3 and out.splitlines() == ["out", "err"]
    with_env = ContainerSpec(**{**spec.__dict__, "env": {"CONTRACT_VALUE": "forty-two"}})
    assert backend.environment(with_env)["CONTRACT_VALUE"] == "forty-two"
    assert _run(backend, with_env, ["sh", "-c", "echo $CONTRACT_VALUE"]) == (0, "forty-two\n")
    log = backend.container_path(spec.cluster, spec.name, "/var/log/jobs/contract.log")
    proc = backend.exec(spec, ["sh", "-c", "echo to the log"], log_path=log)
    assert proc.wait(timeout=60) == 0 and proc.stdout is None
    assert log.read_text().splitlines()[-1] == "to the log"


def test_logs(subject: Subject) -> None:
    backend, spec = subject.backend, subject.launcher
    assert list(backend.logs(spec.cluster, "never-created")) == []
    _started(subject)
    _until(lambda: bool(list(backend.logs(spec.cluster, spec.name))), subject.ready_s, "a log line")
    assert all(isinstance(line, str) for line in backend.logs(spec.cluster, spec.name))


def test_own_pid_and_stop_processes_only_touch_the_containers_processes(subject: Subject) -> None:
    backend, spec = subject.backend, subject.launcher
    _started(subject)
    mark = secrets.token_hex(6)
    marked = ContainerSpec(**{**spec.__dict__, "env": {"CONTRACT_MARK": mark}})
    proc = backend.exec(marked, ["sh", "-c", "echo $$; exec sleep 60"])
    stranger = _stranger()
    try:
        assert proc.stdout is not None
        reported = int(proc.stdout.readline())  # its pid as the container numbers it
        assert backend.own_pid(spec, reported) is not None
        assert backend.own_pid(spec, stranger.pid) is None
        backend.stop_processes(spec, "CONTRACT_MARK", "other", stranger.pid, signal.SIGTERM)
        time.sleep(0.2)
        assert stranger.poll() is None, "a process that is not the container's was signalled"
        backend.stop_processes(marked, "CONTRACT_MARK", mark, proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        for p in (proc, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_delete_cluster_stops_the_commands_run_in_it(subject: Subject) -> None:
    backend, spec = subject.backend, subject.launcher
    _started(subject)
    proc = backend.exec(spec, ["sleep", "60"])
    time.sleep(0.3)
    assert proc.poll() is None
    backend.delete_cluster(spec.cluster, spec.cluster_uid)
    assert proc.wait(timeout=60) is not None
    if proc.stdout is not None:
        proc.stdout.close()


def test_images_and_api_url(subject: Subject) -> None:
    backend = subject.backend
    images = backend.images()
    assert images and all(isinstance(i, ImageEntry) and i.name for i in images)
    assert isinstance(backend.resolve_image(subject.launcher.image, "pytorch"), str)
    url = backend.api_url(subject.launcher.cluster, "http://127.0.0.1:9")
    assert url.startswith(("http://", "http+unix://"))
