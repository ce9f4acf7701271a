"""The Kubernetes backend: every cluster container is a pod on a Kubernetes API server.

A cluster is a launcher pod and worker pods from the container backend's images, a headless Service,
a Secret and the hostfile ConfigMap (mounted at /etc/mpi; the cluster's root object, owner of the
rest): `elastrain.backends.kubernetes_objects` builds them. State comes from a watch on this server's
pods (`elastrain.backends.kubernetes_watch`), read by `list_containers`; a restarted server adopts the
pods it finds by label. Commands run through the pod exec API (`elastrain.backends.kubernetes_exec`).

What a pod's state means (`elastrain.backends.kubernetes_status`): a pod that fails, is evicted or is
deleted by someone else is a failed container (a node failure the job survives); a pod not running yet
is reported alive with why it waits (`ContainerStatus.waiting_reason`: the scheduler's reason, e.g.
``0/3 nodes are available: 3 Insufficient nvidia.com/gpu.``, or the kubelet's, e.g. ``ErrImagePull``),
which the reconciler makes the Pending cluster's reason and ``elastrain cluster logs`` shows. With
`unschedulable_grace_s` set, a pod the scheduler cannot place is deleted after that long and reported
as failed with the scheduler's reason; by default it stays Pending until it fits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elastrain.backends.api import Backend, ContainerSpec, ContainerStatus, ImageEntry
from elastrain.backends.container_run import JOBS_DIR, MPI_DIR, env_flags, secret_env
from elastrain.backends.filemodes import open_private_append, private_dir
from elastrain.backends.kubernetes_client import KubeConnection, KubernetesError
from elastrain.backends.kubernetes_cluster import ClusterObjects
from elastrain.backends.kubernetes_exec import in_pod_argv, run_in_pod, signal_argv
from elastrain.backends.kubernetes_images import image_entries, resolve_image
from elastrain.backends.kubernetes_objects import KubeSettings, pod_manifest, server_selector
from elastrain.backends.kubernetes_status import identity, pod_state
from elastrain.backends.kubernetes_watch import Pod, PodCache
from elastrain.backends.tenant_files import LOG_LIMIT, last_lines

SYNC_TIMEOUT_S = 15.0
_LOG_TAIL = 5


class KubernetesBackend(Backend):
    """Clusters as pods (plus a Service, a Secret and a ConfigMap) in one namespace."""

    translates_paths = False

    def __init__(
        self,
        data_dir: Path,
        conn: KubeConnection,
        server_key: str,
        image_registry: str = "",
        api_url: str = "",
        cluster_domain: str = "cluster.local",
        stop_timeout_s: int = 10,
        unschedulable_grace_s: float | None = None,
    ) -> None:
        """`server_key` labels this server's objects (one namespace may hold several servers' pods);
        `api_url` is the elastrain API as pods reach it (default: the URL the server was given)."""
        from kubernetes import client

        self.data_dir = Path(data_dir).resolve()
        self.root = private_dir(self.data_dir / "clusters")
        self.conn = conn
        self.core = client.CoreV1Api(conn.api_client)
        self.settings = KubeSettings(
            conn.namespace, server_key, image_registry, cluster_domain, stop_timeout_s
        )
        self.pods_api_url = api_url
        self.unschedulable_grace_s = unschedulable_grace_s
        self._lock = threading.Lock()
        self._ended: dict[str, ContainerStatus] = {}  # name -> a pod that is gone (reported until deleted)
        self._reasons: dict[str, str] = {}  # pod uid -> why it ended (its logs are read once)
        self._unschedulable_since: dict[str, float] = {}  # pod uid -> when first seen unschedulable
        self._helpers: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}  # exec helpers: pid -> cluster
        self.objects = ClusterObjects(self.core, conn, self.settings)
        self.pods = PodCache(
            self.core, conn.namespace, server_selector(self.settings), self._pod_gone
        ).start()

    @property
    def namespace(self) -> str:
        """The namespace of every object."""
        return self.settings.namespace

    def _call(self, fn: Any, *args: Any, action: str, **kwargs: Any) -> Any:
        return self.objects.call(fn, *args, action=action, **kwargs)

    # --- lifecycle ---------------------------------------------------------------------------------
    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        """Create the container's pod (a no-op while it is alive; an ended one is replaced)."""
        current = self.pods.get(spec.name)
        if current is not None and pod_state(current).alive:
            return self._status(current)
        if current is not None:
            self._delete_pod(current, grace_s=0)
        with self._lock:
            self._ended.pop(spec.name, None)
        owner = self.objects.prepare(spec)
        try:
            body = pod_manifest(spec, self.settings, owner)
        except ValueError as exc:
            raise KubernetesError(str(exc)) from None
        created = self._call(
            self.core.create_namespaced_pod,
            self.namespace,
            body,
            action=f"create pod {spec.name}",
            _preload_content=False,
        )
        pod: Pod = json.loads(created.data)
        self.pods.put(pod)
        return self._status(pod)

    def _delete_pod(self, pod: Pod, grace_s: int | None = None) -> None:
        self.pods.forget(pod)
        name = pod["metadata"]["name"]
        grace = self.settings.stop_timeout_s if grace_s is None else grace_s
        try:
            self._call(
                self.core.delete_namespaced_pod, name, self.namespace, grace_period_seconds=grace,
                action=f"delete pod {name}", _preload_content=False,
            )  # fmt: skip
        except KubernetesError as exc:
            if exc.status != 404:
                raise

    def delete_container(self, cluster: str, name: str, cluster_uid: str = "") -> None:
        """Delete the container's pod (its node daemon gets SIGTERM, SIGKILL after the grace period)."""
        pod = self.pods.get(name)
        if pod is not None and identity(pod)[0] == cluster:
            self._delete_pod(pod)
        with self._lock:
            self._ended.pop(name, None)

    def delete_cluster(self, cluster: str, cluster_uid: str) -> None:
        """Delete every object of the cluster (its root ConfigMap first: the garbage collector removes
        what a crash may leave), stop the exec streams into it and remove its files here."""
        for pod in self.pods.pods():
            if identity(pod)[0] == cluster:
                self.pods.forget(pod)
        self.objects.delete(cluster, self.settings.stop_timeout_s)
        with self._lock:
            for name in [n for n, s in self._ended.items() if s.cluster == cluster]:
                del self._ended[name]
            helpers = [(pid, p) for pid, (c, p) in self._helpers.items() if c == cluster]
        for pid, proc in helpers:
            _stop_helper(proc)
            self._helpers.pop(pid, None)
        shutil.rmtree(self.root / cluster, ignore_errors=True)

    # --- observation -------------------------------------------------------------------------------
    def list_containers(self) -> list[ContainerStatus]:
        """Every pod of this server from the watch cache, and the pods that ended and are gone."""
        if not self.pods.wait_synced(SYNC_TIMEOUT_S):
            raise KubernetesError(
                f"no pod list from the Kubernetes API server {self.conn.url} yet: "
                f"{self.pods.error or 'waiting for it'}"
            )
        pods = self.pods.pods()
        uids = {pod["metadata"].get("uid", "") for pod in pods}
        self._reasons = {u: r for u, r in self._reasons.items() if u in uids}
        self._unschedulable_since = {u: t for u, t in self._unschedulable_since.items() if u in uids}
        found = [self._status(pod) for pod in pods]
        with self._lock:
            seen = {s.name for s in found}
            found += [s for name, s in self._ended.items() if name not in seen]
        return found

    def _status(self, pod: Pod) -> ContainerStatus:
        state = pod_state(pod)
        uid = pod["metadata"].get("uid", "")
        if state.unschedulable and self.unschedulable_grace_s is not None:
            since = self._unschedulable_since.setdefault(uid, time.monotonic())
            if time.monotonic() - since >= self.unschedulable_grace_s:
                return self._give_up(pod, f"{state.waiting_reason} (for {self.unschedulable_grace_s:g} s)")
        if state.alive:
            return ContainerStatus(
                state.cluster,
                state.name,
                None,
                True,
                state.ready,
                state.name,
                waiting_reason=state.waiting_reason,
            )
        reason = self._reasons.get(uid)
        if reason is None:
            reason = self._reasons[uid] = f"{state.ended_reason}; last lines: {self._log_tail(state.name)}"
        return ContainerStatus(state.cluster, state.name, None, False, False, state.name, reason)

    def _give_up(self, pod: Pod, reason: str) -> ContainerStatus:
        """A pod that cannot be scheduled: deleted, reported as an ended container with `reason`."""
        cluster, name = identity(pod)
        status = ContainerStatus(cluster, name, None, False, False, name, reason)
        with self._lock:
            self._ended[name] = status
        with contextlib.suppress(KubernetesError):
            self._delete_pod(pod, grace_s=0)
        return status

    def _pod_gone(self, pod: Pod) -> None:
        """The watch saw a pod deleted by someone else: its container is reported as ended."""
        cluster, name = identity(pod)
        ended = (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")
        why = pod_state(pod).ended_reason if ended else ""
        reason = f"the pod was deleted outside elastrain{': ' + why if why else ''}"
        with self._lock:
            self._ended[name] = ContainerStatus(cluster, name, None, False, False, name, reason)

    def _log_tail(self, name: str) -> str:
        lines = [line.strip() for line in self._log_lines(name, tail=_LOG_TAIL) if line.strip()]
        return " | ".join(lines) if lines else "(no output)"

    def _log_lines(self, name: str, tail: int | None = None) -> list[str]:
        extra = {"tail_lines": tail} if tail else {}
        try:
            text = self._call(
                self.core.read_namespaced_pod_log,
                name,
                self.namespace,
                action=f"read the log of pod {name}",
                **extra,
            )
        except KubernetesError:
            return []
        return str(text).splitlines(keepends=True)

    def logs(self, cluster: str, name: str, limit: int = LOG_LIMIT) -> Iterator[str]:
        """The pod's output (the lines of its last `limit` bytes: the kubelet caps what it keeps, 10 MiB
        by default); for a pod not running yet why it waits (e.g. the scheduler's reason), for one that
        is gone why it ended."""
        pod = self.pods.get(name)
        if pod is None or identity(pod)[0] != cluster:
            with self._lock:
                ended = self._ended.get(name)
            if ended is not None and ended.cluster == cluster:
                yield f"elastrain: pod {name} is gone: {ended.exit_reason}\n"
            return
        state = pod_state(pod)
        if state.waiting_reason:
            yield f"elastrain: pod {name} is Pending: {state.waiting_reason}\n"
        yield from last_lines(self._log_lines(name), limit)

    # --- files -------------------------------------------------------------------------------------
    def write_cluster_file(self, cluster: str, path: str, text: str) -> None:
        """Files under /etc/mpi (the hostfile): a key of the cluster's ConfigMap, which the kubelet
        projects into every pod (seconds to a minute later, as its sync period allows)."""
        if not path.startswith(MPI_DIR + "/") or "/" in path[len(MPI_DIR) + 1 :]:
            raise ValueError(f"the Kubernetes backend writes files directly under {MPI_DIR} only, not {path}")
        self.objects.write(cluster, path[len(MPI_DIR) + 1 :], text)

    def hostfile_text(self, cluster: str) -> str | None:
        """The hostfile as the cluster's ConfigMap holds it (None: no such ConfigMap)."""
        return self.objects.hostfile(cluster)

    def container_path(self, cluster: str, name: str, path: str) -> Path:
        """Job logs (/var/log/jobs) are kept on this machine: the exec stream writes them here."""
        if path == JOBS_DIR or path.startswith(JOBS_DIR + "/"):
            jobs = private_dir(self.root / cluster / "jobs")  # the pod has its own; this copy is made here
            return jobs / path[len(JOBS_DIR) :].lstrip("/")
        raise ValueError(f"{path} is inside the pod only; it has no copy on this machine")

    def path_inside(self, cluster: str, name: str, path: str) -> str:
        """Processes in the pod see container paths as they are."""
        return path

    # --- images and the API ------------------------------------------------------------------------
    def images(self) -> list[ImageEntry]:
        """The elastrain images, named as the nodes pull them (`image_registry`)."""
        return image_entries(self.settings.image_registry)

    def resolve_image(self, image: str, framework: str) -> str:
        """The named image (as the nodes pull it), or the framework's elastrain image."""
        return resolve_image(image, framework, self.settings.image_registry)

    def api_url(self, cluster: str, server_url: str) -> str:
        """The elastrain API as pods reach it."""
        return self.pods_api_url or server_url

    # --- commands ----------------------------------------------------------------------------------
    def _helper_argv(self, spec: ContainerSpec, env: dict[str, str], tty: bool) -> list[str]:
        argv = [sys.executable, "-m", "elastrain.backends.kubernetes_exec", "--namespace", self.namespace]
        argv += ["--pod", spec.name, *(["--tty"] if tty else [])]
        if self.conn.kubeconfig is not None:
            argv += ["--kubeconfig", str(self.conn.kubeconfig)]
        return [*argv, *env_flags(env)]

    def exec(
        self, spec: ContainerSpec, command: list[str], log_path: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Run `command` in the pod through the exec API (a helper process relays it); secrets in
        ``spec.env`` reach the helper through its environment, never its argv."""
        argv = [
            *self._helper_argv(spec, spec.env, tty=False),
            *self._exit_file(spec, command),
            "--",
            *command,
        ]
        env = {**os.environ, **secret_env(spec.env)}
        kwargs: dict[str, Any] = {"stdin": subprocess.DEVNULL, "start_new_session": True, "env": env}
        if log_path is None:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
        else:
            with open_private_append(log_path) as log_file:
                proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, **kwargs)
        with self._lock:
            self._helpers = {p: h for p, h in self._helpers.items() if h[1].poll() is None}
            self._helpers[proc.pid] = (spec.cluster, proc)
        return proc

    def _exit_file(self, spec: ContainerSpec, command: list[str]) -> list[str]:
        """``--exit-file`` for a job's command (run under jobrun, which writes its exit code in the pod):
        the helper writes it to this machine's copy of the job directory too, where the server reads it."""
        if "elastrain.backends.jobrun" not in command[:3] or "--exit-file" not in command:
            return []
        index = command.index("--exit-file") + 1
        if index >= len(command) or not command[index].startswith(JOBS_DIR + "/"):
            return []
        return ["--exit-file", str(self.container_path(spec.cluster, spec.name, command[index]))]

    def terminal_command(self, spec: ContainerSpec, env: dict[str, str]) -> list[str] | None:
        """An interactive bash in the pod (exec API with a tty); secret values of `env` are named only."""
        shell_env = {**spec.env, **env, "TERM": "xterm-256color", "PS1": f"[{spec.name}] \\W$ "}
        return [*self._helper_argv(spec, shell_env, tty=True), "--", "bash", "--norc", "-i"]

    def _exec_core(self) -> Any:
        """A CoreV1Api of its own for one exec: the client's websocket transport swaps its ApiClient's
        `call_api` while it connects, which must not catch the watch's or another call's requests."""
        from kubernetes import client

        return client.CoreV1Api(client.ApiClient(self.conn.api_client.configuration))

    def own_pid(self, spec: ContainerSpec, pid: int) -> int | None:
        """`pid` when the pod has such a process (the pod's own numbering: nothing runs here)."""
        code, _out = run_in_pod(
            self._exec_core(), self.namespace, spec.name, in_pod_argv({}, ["kill", "-0", str(pid)])
        )
        return pid if code == 0 else None

    def stop_processes(
        self, spec: ContainerSpec, env_key: str, env_value: str, pid: int | None, signum: int
    ) -> None:
        """Signal the pod's processes tagged ``env_key=env_value``; `pid` is an exec helper of this
        server (its process group is signalled too) or a process in the pod."""
        run_in_pod(self._exec_core(), self.namespace, spec.name, signal_argv(env_key, env_value, signum))
        if not pid:
            return
        with self._lock:
            helper = self._helpers.get(pid)
        if helper is not None:
            super().stop_processes(spec, env_key, env_value, pid, signum)
        else:
            run_in_pod(self._exec_core(), self.namespace, spec.name, ["kill", f"-{signum}", str(pid)])

    def close(self) -> None:
        """Stop the watch (pods keep running; a restarted server adopts them by label)."""
        self.pods.stop()


def _stop_helper(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
