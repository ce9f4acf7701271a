"""The container backend: every cluster container is an OCI container run by podman.

Per cluster: one bridge network (isolated from every other cluster's), and on this machine under
``<data-dir>/clusters/<cluster>/``::

    mpi/hostfile     bind-mounted read-only at /etc/mpi (the directory, 0750 group tenant; file renamed)
    home/            the tenant's home, /home/<user> in every container of the cluster (owned by their uid)
    jobs/            /var/log/jobs in the launcher: logs and exit codes of the cluster's jobs
    secret           the cluster's node secret (ELASTRAIN_NODE_SECRET inside; 0600 here)
    lab-token        the token of JupyterLab in the launcher (ELASTRAIN_LAB_TOKEN there; 0600 here)
    mounts.json      container path -> host path of the cluster's storage mounts
    hosts            /etc/hosts of every container (the running containers' addresses; kept current)
    nsswitch.conf    /etc/nsswitch.conf: names from /etc/hosts only, never DNS

Each container's ``podman run`` flags are `elastrain.backends.container_run`'s; this module owns the
lifecycle: networks, the cluster's files, starting, listing, adopting by label, exec, cleanup.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

from elastrain.backends.api import Backend, ContainerSpec, ContainerStatus, ImageEntry
from elastrain.backends.container_files import (
    cluster_lab_token,
    cluster_secret,
    hosts_text,
    prepare_cluster_files,
)
from elastrain.backends.container_images import image_entries, resolve_image
from elastrain.backends.container_run import (
    API_SOCKET_DIR,
    GPU_DEVICE_DIR_ENV,
    JOBS_DIR,
    MPI_DIR,
    ClusterFiles,
    LabEndpoint,
    env_flags,
    gpu_args,
    lab_endpoint_of,
    run_args,
    run_env,
    secret_env,
)
from elastrain.backends.egress import HostEgress
from elastrain.backends.filemodes import open_private_append, private_dir, tenant_dir
from elastrain.backends.gateway import RelaySet
from elastrain.backends.nsprocs import container_pids, host_pid, pids_with_env_in
from elastrain.backends.podmanctl import exec_argv, podman, podman_json, podman_log_tail
from elastrain.backends.procs import cmdline, niced
from elastrain.backends.tenant_files import LOG_LIMIT
from elastrain.backends.usage import ContainerUsage, cgroup_usage
from elastrain.hostfile import atomic_write_text
from elastrain.httpunix import unix_url

log = logging.getLogger("elastrain.container")
SOCKET_ROOT = Path("/run/elastrain-api")
_LOG_TAIL = 5


def server_key(data_dir: Path) -> str:
    """The ``elastrain.server`` label of the containers of the server with data directory `data_dir`."""
    return f"{zlib.crc32(str(Path(data_dir).resolve()).encode()):08x}"


class ContainerBackend(Backend):
    """Clusters as podman containers on per-cluster networks."""

    translates_paths = False

    def __init__(self, data_dir: Path, stop_timeout_s: int = 10, egress: HostEgress | None = None) -> None:
        """`egress`: the cluster networks' policy toward the host's services (default: none reachable)."""
        self.data_dir = Path(data_dir).resolve()
        self.egress = egress if egress is not None else HostEgress()
        self.root = private_dir(self.data_dir / "clusters")
        self.server_key = server_key(self.data_dir)
        self.stop_timeout_s = stop_timeout_s
        self.relays = RelaySet()
        # Unix socket paths are limited to 108 bytes: the API sockets live under a short root
        self.socket_root = SOCKET_ROOT / self.server_key
        self._exit_reasons: dict[str, str] = {}  # container id -> why it ended (read once)
        self.gpu_device_dir = Path(os.environ.get(GPU_DEVICE_DIR_ENV, "/dev"))

    # --- names and places --------------------------------------------------------------------------
    def container_name(self, name: str) -> str:
        """podman's name for cluster container `name` (unique per server data directory)."""
        return f"elastrain-{self.server_key}-{name}"

    def network_name(self, cluster: str) -> str:
        """The cluster's bridge network."""
        return f"elastrain-{self.server_key}-{cluster}"

    def cluster_dir(self, cluster: str) -> Path:
        """The cluster's files on this machine."""
        return self.root / cluster

    def tenant_base(self, cluster: str) -> Path | None:
        """The cluster's directory: everything its tenant can write is below it."""
        return self.cluster_dir(cluster)

    def hostfile_path(self, cluster: str) -> Path | None:
        """The hostfile every container sees at /etc/mpi/hostfile."""
        return self.cluster_dir(cluster) / "mpi" / "hostfile"

    def _home(self, spec: ContainerSpec) -> str:
        return f"/home/{spec.tenant or 'elastrain'}"

    def container_path(self, cluster: str, name: str, path: str) -> Path:
        """This machine's copy of container path `path` (the hostfile, job logs, home, mounts)."""
        base = self.cluster_dir(cluster)
        try:
            mounts: dict[str, str] = json.loads((base / "mounts.json").read_text())
        except (OSError, ValueError):
            mounts = {}
        table = {MPI_DIR: base / "mpi", JOBS_DIR: base / "jobs", **{t: Path(s) for t, s in mounts.items()}}
        for target, local in sorted(table.items(), key=lambda item: -len(item[0])):
            if path == target or path.startswith(target.rstrip("/") + "/"):
                return local / path[len(target) :].lstrip("/")
        if path.startswith("/home/"):
            return base / "home" / path[len("/home/") :].partition("/")[2]
        raise ValueError(f"{path} is inside the container only; it has no copy on this machine")

    def images(self) -> list[ImageEntry]:
        """The elastrain images in podman's store (`elastrain image build` makes them)."""
        return image_entries()

    def resolve_image(self, image: str, framework: str) -> str:
        """The named image, or the newest holding `framework`; ValueError (what to do) when none fits."""
        return resolve_image(image, framework)

    def path_inside(self, cluster: str, name: str, path: str) -> str:
        """Processes in the container see container paths as they are."""
        return path

    # --- cluster-level set-up ----------------------------------------------------------------------
    def _prepare_cluster(self, spec: ContainerSpec) -> str:
        """Directories (0700; mounted ones the tenant's only), secret and network (idempotent); the secret."""
        base = prepare_cluster_files(self.cluster_dir(spec.cluster), spec)
        sockets = self.api_socket_dir(spec.cluster)
        tenant_dir(sockets, spec.tenant_uid)
        self.relays.ensure(sockets / "api.sock")
        secret = cluster_secret(base)
        network = self.network_name(spec.cluster)
        if podman("network", "exists", network, check=False).returncode != 0:
            podman(
                "network", "create", "--opt", "isolate=true",
                "--label", f"elastrain.cluster={spec.cluster}",
                "--label", f"elastrain.server={self.server_key}",
                network,
            )  # fmt: skip
        bridge = podman("network", "inspect", "--format", "{{.NetworkInterface}}", network).stdout.strip()
        self.egress.guard(bridge, network)  # no host service reachable from the cluster (`egress`)
        return secret

    def api_socket_dir(self, cluster: str) -> Path:
        """The directory holding the cluster's API socket (mounted at /run/elastrain in its containers)."""
        return self.socket_root / cluster

    def api_url(self, cluster: str, server_url: str) -> str:
        """The API as the cluster's containers reach it: a Unix socket relayed to the server."""
        if self.relays.ensure(self.api_socket_dir(cluster) / "api.sock"):
            return unix_url(f"{API_SOCKET_DIR}/api.sock")
        return server_url

    def serve_api(self, host: str, port: int) -> None:
        """Where the server listens; the API sockets of existing clusters are opened again."""
        self.relays.target = (host, port)
        for cluster_dir in sorted(self.root.iterdir()) if self.root.exists() else []:
            if (cluster_dir / "secret").exists() and self.api_socket_dir(cluster_dir.name).exists():
                self.relays.ensure(self.api_socket_dir(cluster_dir.name) / "api.sock")

    # --- lifecycle ---------------------------------------------------------------------------------
    def _run_args(self, spec: ContainerSpec, secret: str, lab_token: str = "") -> list[str]:
        files = ClusterFiles(
            self.cluster_dir(spec.cluster), self.api_socket_dir(spec.cluster), self.network_name(spec.cluster)
        )
        name = self.container_name(spec.name)
        return run_args(spec, secret, files, name, self.server_key, self.gpu_device_dir, lab_token)

    def _gpu_args(self, spec: ContainerSpec) -> list[str]:
        return gpu_args(spec, self.gpu_device_dir)

    def create_container(self, spec: ContainerSpec) -> ContainerStatus:
        """Start the container (no-op when it runs; an ended one is removed and started anew)."""
        current = self._inspect(spec.name)
        if current is not None and current.alive:
            return current
        if current is not None:
            podman("rm", "--force", self.container_name(spec.name), check=False)
        secret = self._prepare_cluster(spec)
        lab_token = cluster_lab_token(self.cluster_dir(spec.cluster)) if spec.role == "launcher" else ""
        # the secrets are named in argv, their values in podman's environment (argv shows in `ps`)
        env = secret_env(run_env(spec, secret, lab_token))
        # niced: the container's processes run below the server (TENANT_NICE), as on the process backend
        podman(*self._run_args(spec, secret, lab_token), timeout=180, env=env, nice=True)
        self._refresh_hosts(spec.cluster)
        status = self._inspect(spec.name)
        return status or ContainerStatus(spec.cluster, spec.name, None, False, False, spec.address)

    def delete_container(self, cluster: str, name: str, cluster_uid: str = "") -> None:
        """Stop the container (SIGTERM: its workers leave; SIGKILL after the timeout) and remove it; the
        cluster's /etc/hosts then no longer names it."""
        podman("rm", "--force", "--time", str(self.stop_timeout_s), self.container_name(name), check=False)
        self._refresh_hosts(cluster)

    def delete_cluster(self, cluster: str, cluster_uid: str) -> None:
        """Remove every container and the network of the cluster, then its files on this machine."""
        names = [self.container_name(s.name) for s in self.list_containers() if s.cluster == cluster]
        if names:
            podman("rm", "--force", "--time", str(self.stop_timeout_s), *names, check=False, timeout=300)
        podman("network", "rm", "--force", self.network_name(cluster), check=False)
        self.egress.unguard(self.network_name(cluster))
        self.relays.drop(self.api_socket_dir(cluster) / "api.sock")
        shutil.rmtree(self.api_socket_dir(cluster), ignore_errors=True)
        shutil.rmtree(self.cluster_dir(cluster), ignore_errors=True)

    def list_containers(self) -> list[ContainerStatus]:
        """Every container of this server, from podman's labels."""
        rows = podman_json(
            "ps", "--all", "--filter", f"label=elastrain.server={self.server_key}", "--format", "json"
        )
        found = [self._status(row) for row in rows]
        live_ids = {row.get("Id") for row in rows}
        for cid in list(self._exit_reasons):
            if cid not in live_ids:
                del self._exit_reasons[cid]
        return found

    def _inspect(self, name: str) -> ContainerStatus | None:
        rows = podman_json(
            "ps", "--all", "--filter", f"name=^{self.container_name(name)}$", "--format", "json"
        )
        return self._status(rows[0]) if rows else None

    def _status(self, row: dict[str, object]) -> ContainerStatus:
        labels = row.get("Labels") or {}
        assert isinstance(labels, dict)
        name = str(labels.get("elastrain.container", ""))
        state = row.get("State")
        running = state == "running"
        paused = state == "paused"  # `podman pause`: frozen, not exited (its processes hold their state)
        reason = ""
        if not running and not paused:
            cid = str(row.get("Id"))
            reason = self._exit_reasons.get(cid) or self._exit_reason(cid, row.get("ExitCode"))
            self._exit_reasons[cid] = reason
        pid = row.get("Pid")
        return ContainerStatus(
            str(labels.get("elastrain.cluster", "")),
            name,
            int(pid) if isinstance(pid, int) and pid > 0 else None,
            running or paused,
            running,
            name,
            reason,
            paused=paused,
        )

    def usage(self, cluster: str, cluster_uid: str) -> dict[str, ContainerUsage]:
        """Each running container's figures from its cgroup (the cgroup of its init process)."""
        return {
            status.name: cgroup_usage(status.pid)
            for status in self.list_containers()
            if status.cluster == cluster and status.alive and status.pid
        }

    @staticmethod
    def _exit_reason(cid: str, code: object) -> str:
        tail = podman("logs", "--tail", str(_LOG_TAIL), cid, check=False)
        lines = [line for line in (tail.stdout + tail.stderr).splitlines() if line.strip()][-_LOG_TAIL:]
        last = " | ".join(lines) if lines else "(no output)"
        return f"the container exited with code {code}; last lines: {last}"

    def lab_endpoint(self, cluster: str, name: str) -> LabEndpoint | None:
        """Where the server reaches JupyterLab in launcher `name` of `cluster` (its address on the
        cluster network, the token it was started with); None when it is not running or has none."""
        done = podman("inspect", "--format", "json", self.container_name(name), check=False)
        return lab_endpoint_of(done.stdout if done.returncode == 0 else "", self.network_name(cluster))

    # --- files, commands, logs ---------------------------------------------------------------------
    def write_cluster_file(self, cluster: str, path: str, text: str) -> None:
        """Files under /etc/mpi (the hostfile): written here, renamed into place, seen by every container."""
        if not path.startswith(MPI_DIR + "/"):
            raise ValueError(f"the container backend writes files under {MPI_DIR} only, not {path}")
        target = self.cluster_dir(cluster) / "mpi" / path[len(MPI_DIR) + 1 :]
        if target.parent.exists():
            self._refresh_hosts(cluster)  # every host the new hostfile names resolves before it is read
            atomic_write_text(target, text)

    def _refresh_hosts(self, cluster: str) -> None:
        """Rewrite the cluster's /etc/hosts: every running container's address and names.

        Names on the cluster network then resolve without DNS: podman's DNS server (aardvark) stops
        answering for seconds whenever a container of the network dies, which would stall the
        rendezvous (it resolves peers) and the start of agents exactly when a job must recover.
        """
        path = self.cluster_dir(cluster) / "hosts"
        if not path.exists():
            return
        names = [
            self.container_name(s.name) for s in self.list_containers() if s.cluster == cluster and s.alive
        ]
        infos = podman_json("inspect", "--format", "json", *names) if names else []
        text = hosts_text(infos, self.network_name(cluster))
        # in place (the file is bind-mounted: a rename would not reach the containers), in one write
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def _exec_prefix(self, spec: ContainerSpec, env: dict[str, str], tty: bool) -> list[str]:
        """``podman exec ... CONTAINER`` with `env`; a secret's value (a token) is not in it: run it with
        ``secret_env(env)`` in its environment (a long-lived ``podman exec`` shows its argv in `ps`)."""
        flags = ["--interactive", "--tty"] if tty else []
        argv = exec_argv("exec", *flags, "--user", f"{spec.tenant_uid}:{spec.tenant_uid}")
        argv += ["--workdir", self._home(spec)]
        argv += env_flags(env)
        return [*argv, self.container_name(spec.name)]

    def exec(
        self, spec: ContainerSpec, command: list[str], log_path: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Run `command` in the container as the tenant (``podman exec``); output to a pipe or `log_path`.
        Tokens in ``spec.env`` reach podman through its environment, never its argv."""
        argv = niced([*self._exec_prefix(spec, spec.env, tty=False), *command])  # below the server
        env = {**os.environ, **secret_env(spec.env)}
        if log_path is None:
            return subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        with open_private_append(log_path) as log_file:
            return subprocess.Popen(
                argv,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )

    def terminal_command(self, spec: ContainerSpec, env: dict[str, str]) -> list[str] | None:
        """An interactive bash in the container, as the tenant, in their home. Secret variables of `env`
        (the attach token) are named only: the caller runs the command with `env` in its environment
        (the portal's terminal does)."""
        shell_env = {**spec.env, **env, "TERM": "xterm-256color", "PS1": f"[{spec.name}] \\W$ "}
        return [*self._exec_prefix(spec, shell_env, tty=True), "bash", "--norc", "-i"]

    def _init_pid(self, spec: ContainerSpec) -> int:
        status = self._inspect(spec.name)
        return status.pid if status is not None and status.pid else 0

    def own_pid(self, spec: ContainerSpec, pid: int) -> int | None:
        """Map a PID the container reported to this machine's PID (None: no such process in it)."""
        return host_pid(self._init_pid(spec), pid)

    def stop_processes(
        self, spec: ContainerSpec, env_key: str, env_value: str, pid: int | None, signum: int
    ) -> None:
        """Signal the container's processes carrying ``env_key=env_value``, and `pid` when it is the
        ``podman exec`` that runs them (its group) or one of the container's own processes."""
        init = self._init_pid(spec)
        targets = set(pids_with_env_in(init, env_key, env_value))
        inside = container_pids(init)
        for target in targets | ({pid} if pid and pid in inside else set()):
            try:
                os.kill(target, signum)
            except (ProcessLookupError, PermissionError):
                pass
        if pid and pid not in inside:  # the podman exec client on this machine, if it provably is
            if self._exec_client(spec, pid, f"{env_key}={env_value}"):
                super().stop_processes(spec, env_key, env_value, pid, signum)
            else:
                log.warning("not signalling pid %d: not in %s nor its podman exec", pid, spec.name)

    def _exec_client(self, spec: ContainerSpec, pid: int, env_item: str) -> bool:
        """`pid` is a ``podman exec`` this server started in the container with ``--env env_item``,
        leading its own process group (a stored pid may since name another process)."""
        argv = cmdline(pid)
        tagged = any(argv[i : i + 2] == ["--env", env_item] for i in range(len(argv) - 1))
        try:
            leader = os.getpgid(pid) == pid
        except (ProcessLookupError, PermissionError):
            return False
        return leader and tagged and "exec" in argv and self.container_name(spec.name) in argv

    def logs(self, cluster: str, name: str, limit: int = LOG_LIMIT) -> Iterator[str]:
        """The last `limit` bytes of the container's output (the node daemon's and the agents it
        started), from its first whole line; streamed from podman, never held whole."""
        data = podman_log_tail(self.container_name(name), limit + 1)
        if len(data) > limit:  # cut: drop the partial first line
            data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
        yield from data.decode(errors="replace").splitlines(keepends=True)

    def close(self) -> None:
        """Close the API relays (containers keep running; a restarted server opens them again)."""
        self.relays.close()
        with contextlib.suppress(OSError):  # no cluster left: nothing of this server stays in /run
            self.socket_root.rmdir()
