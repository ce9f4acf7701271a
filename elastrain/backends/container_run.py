"""The ``podman run`` command of a cluster container: its flags, environment, mounts and GPUs.

What a container gets (see `elastrain.backends.container` for the lifecycle): the image, hostname
``<cluster>-launcher`` / ``<cluster>-worker-<i>`` on the cluster's network, labels ``elastrain.cluster``,
``elastrain.role``, ``elastrain.container`` and ``elastrain.server``, ``--shm-size``,
``--memory``/``--cpus`` where given, the tenant's unprivileged uid with no capabilities, the cluster's
``/etc/mpi`` (read-only), ``/etc/hosts`` and ``/etc/nsswitch.conf`` (names from files only), the
cluster's keys (read-only; sshd on port 22), the API socket directory, the tenant's home, its own GPU
devices, and the node daemon as its program; a launcher also gets the cluster's JupyterLab token
(`LAB_TOKEN_ENV`: its node daemon starts JupyterLab on `LAB_PORT`, see `elastrain.agent.services`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastrain.agent.services import LAB_PORT, LAB_TOKEN_ENV
from elastrain.backends.api import ContainerSpec
from elastrain.backends.podmanctl import ulimit_args

log = logging.getLogger("elastrain.container")
MPI_DIR, JOBS_DIR = "/etc/mpi", "/var/log/jobs"
KEYS_DIR = "/etc/elastrain/keys"  # the cluster's ssh and munge keys (`elastrain.backends.cluster_keys`)
API_SOCKET_DIR = "/run/elastrain"  # in the containers: api.sock, relayed to the server's API
SLURM_CONF = "/tmp/elastrain-slurm/slurm.conf"  # = elastrain.agent.slurm_conf.SLURM_CONF_PATH
CONTAINER_LOG_MAX = "64m"  # podman's log of a container's own output: truncated past this (a tenant's bomb)
GPU_DEVICE_DIR_ENV = "ELASTRAIN_GPU_DEVICE_DIR"  # where /dev/nvidiaN nodes are (tests use fake ones)
HOSTS_HEAD = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
# host names come from /etc/hosts alone (kept by `_refresh_hosts`): a lookup never waits for DNS, which
# also turns a reverse lookup of an unknown peer (the rendezvous store logs each one) into an instant miss
NSSWITCH = "".join(
    f"{db}:\tfiles\n" for db in ("passwd", "group", "shadow", "hosts", "networks", "protocols", "services")
)
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))  # where podman (>= 4.1) reads CDI specs
CDI_GPU_KIND = "nvidia.com/gpu"  # `nvidia-ctk cdi generate`: devices named by nvidia-smi index
_CDI_KIND = re.compile(r"""["']?kind["']?\s*:\s*["']?nvidia\.com/gpu\b""")
# names of variables whose values stay out of argv (ELASTRAIN_NODE_SECRET, ELASTRAIN_JOB_TOKEN,
# ELASTRAIN_REPORT_TOKEN, ELASTRAIN_ATTACH_TOKEN, ...)
_SECRET_ENV = re.compile(r"(?:SECRET|TOKEN|PASSWORD|PASSWD|API_KEY|CREDENTIALS?)$", re.IGNORECASE)


def cdi_gpus_available(dirs: tuple[Path, ...] | None = None) -> bool:
    """True when a CDI spec declares kind nvidia.com/gpu (the NVIDIA container toolkit wrote one)."""
    for directory in CDI_DIRS if dirs is None else dirs:
        if not directory.is_dir():
            continue
        for spec in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.json")):
            try:
                if _CDI_KIND.search(spec.read_text(errors="replace")):
                    return True
            except OSError:
                continue
    return False


@dataclass(frozen=True)
class ClusterFiles:
    """Where a cluster's files are on this machine, and its network."""

    base: Path  # mpi/, hosts, nsswitch.conf, home/, jobs/
    sockets: Path  # the directory of its API socket
    network: str


@dataclass(frozen=True)
class LabEndpoint:
    """Where the server reaches the JupyterLab of a launcher: its address on the cluster network, the
    port, and the cluster's token (the proxy adds it to every request)."""

    host: str
    port: int
    token: str

    @property
    def origin(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"


def lab_endpoint_of(inspect_json: str, network: str) -> LabEndpoint | None:
    """The `LabEndpoint` of a launcher from its ``podman inspect --format json`` output: None when it
    is not running, has no address on `network` or was started without a lab token (a server that
    kept none)."""
    try:
        rows = json.loads(inspect_json) if inspect_json.strip() else []
    except ValueError:
        return None
    info = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
    state = info.get("State") or {}
    env = (info.get("Config") or {}).get("Env") or []
    token = next((e.split("=", 1)[1] for e in env if e.startswith(f"{LAB_TOKEN_ENV}=")), "")
    address = network_address(info, network)
    if not state.get("Running") or not token or not address:
        return None
    return LabEndpoint(address, LAB_PORT, token)


def network_address(info: Mapping[str, Any], network: str) -> str | None:
    """The IPv4 address of a container (a ``podman inspect`` row) on `network`, if it has one."""
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    address = (networks.get(network) or {}).get("IPAddress")
    return str(address) if address else None


def gpu_env(spec: ContainerSpec) -> dict[str, str]:
    """The GPU variables of a container: its own devices, numbered 0..n-1 inside."""
    host_ids = ",".join(str(g) for g in spec.gpu_ids)
    # the container sees only its own devices, so CUDA numbers them 0..n-1 there
    local = ",".join(str(i) for i in range(len(spec.gpu_ids)))
    return {
        "ELASTRAIN_VISIBLE_GPUS": host_ids,
        "NVIDIA_VISIBLE_DEVICES": host_ids or "void",
        "CUDA_VISIBLE_DEVICES": local,
    }


def is_secret_env(key: str) -> bool:
    """A variable whose value must never appear in a command line (``ps`` and ``/proc/PID/cmdline``
    show it to every user of the machine): the node secret, the job, report and attach tokens."""
    return _SECRET_ENV.search(key) is not None


def env_flags(env: Mapping[str, str]) -> list[str]:
    """``--env`` flags of ``podman run``/``exec`` for `env`: ``KEY=VALUE``, except a secret's
    (`is_secret_env`), which is ``--env KEY`` alone: podman then takes its value from its own
    environment, where `secret_env` puts it (podman 4.3: "If an environment variable is specified
    without a value, Podman will check the host environment for a value")."""
    flags: list[str] = []
    for key, value in sorted(env.items()):
        flags += ["--env", key if is_secret_env(key) else f"{key}={value}"]
    return flags


def secret_env(env: Mapping[str, str]) -> dict[str, str]:
    """The secret variables of `env`: what the podman process's own environment must hold for
    `env_flags`' name-only flags."""
    return {key: value for key, value in env.items() if is_secret_env(key)}


def run_env(spec: ContainerSpec, secret: str, lab_token: str = "") -> dict[str, str]:
    """The environment of a container's program (the node daemon); `lab_token` goes to a launcher only."""
    user = spec.tenant or "elastrain"
    home = f"/home/{user}"
    env = {
        "ELASTRAIN_CLUSTER": spec.cluster,
        "ELASTRAIN_CONTAINER": spec.name,
        "ELASTRAIN_CONTAINER_ROLE": spec.role,
        "ELASTRAIN_CONTAINER_ADDRESS": spec.address,
        "ELASTRAIN_HOSTFILE": f"{MPI_DIR}/hostfile",
        "ELASTRAIN_SHM_BYTES": str(spec.shm_bytes),
        "ELASTRAIN_NODE_SECRET": secret,
        "HOME": home,
        "USER": user,
        "ELASTRAIN_FRAMEWORK": spec.framework,
        "PDSH_RCMD_TYPE": "ssh",
        **gpu_env(spec),
        **spec.env,
    }
    if spec.framework == "slurm":  # the config every container renders (`elastrain.agent.slurm_conf`)
        env["SLURM_CONF"] = SLURM_CONF
    if spec.role == "launcher" and lab_token:
        env[LAB_TOKEN_ENV] = lab_token
    return env


def run_args(
    spec: ContainerSpec,
    secret: str,
    files: ClusterFiles,
    container_name: str,
    server_key: str,
    gpu_device_dir: Path,
    lab_token: str = "",
) -> list[str]:
    """The arguments of ``podman run`` for `spec` (the node daemon as its program). The node secret and
    the lab token are named, not given (``--env ELASTRAIN_NODE_SECRET``): run podman with
    ``secret_env(run_env(...))`` in its environment."""
    user = spec.tenant or "elastrain"
    home = f"/home/{user}"
    env = run_env(spec, secret, lab_token)
    base = files.base
    args = [
        "run", "--detach", "--init",
        "--log-opt", f"max-size={CONTAINER_LOG_MAX}",
        "--name", container_name,
        "--hostname", spec.name,
        "--network", files.network,
        "--network-alias", spec.name,
        "--label", f"elastrain.cluster={spec.cluster}",
        "--label", f"elastrain.role={spec.role}",
        "--label", f"elastrain.container={spec.name}",
        "--label", f"elastrain.server={server_key}",
        "--label", f"elastrain.cluster-uid={spec.cluster_uid}",
        "--user", f"{spec.tenant_uid}:{spec.tenant_uid}",
        # a passwd entry for the tenant (sshd, ssh and Slurm look the user up by name)
        "--passwd-entry", f"{user}:*:{spec.tenant_uid}:{spec.tenant_uid}:{user}:{home}:/bin/bash",
        # sshd runs as the tenant, with no capabilities, on port 22 of the container's own network
        "--sysctl", "net.ipv4.ip_unprivileged_port_start=22",
        "--cap-drop", "all",
        "--security-opt", "no-new-privileges",
        "--workdir", home,
        "--volume", f"{base / 'mpi'}:{MPI_DIR}:ro",
        "--volume", f"{base / 'hosts'}:/etc/hosts:ro",
        "--volume", f"{base / 'nsswitch.conf'}:/etc/nsswitch.conf:ro",
        "--volume", f"{base / 'keys'}:{KEYS_DIR}:ro",
        "--volume", f"{files.sockets}:{API_SOCKET_DIR}:ro",
        "--volume", f"{base / 'home'}:{home}",
        *ulimit_args(),
    ]  # fmt: skip
    if spec.role == "launcher":
        args += ["--volume", f"{base / 'jobs'}:{JOBS_DIR}"]
    if spec.shm_bytes > 0:
        args += ["--shm-size", f"{spec.shm_bytes}b"]
    if spec.memory_bytes > 0:
        args += ["--memory", f"{spec.memory_bytes}b"]
    if spec.cpus > 0:
        args += ["--cpus", f"{spec.cpus:g}"]
    for mount in spec.mounts:
        args += ["--volume", f"{mount.source}:{mount.target}" + (":ro" if mount.read_only else "")]
    args += gpu_args(spec, gpu_device_dir)
    args += env_flags(env)
    return [*args, spec.image, "python", "-m", "elastrain.agent.noded"]


def gpu_args(spec: ContainerSpec, gpu_device_dir: Path) -> list[str]:
    """Real GPUs through CDI where the NVIDIA toolkit wrote a spec (device nodes and the host
    driver's libraries, by nvidia-smi index); otherwise the device nodes alone."""
    if spec.real_gpus and spec.gpu_ids and cdi_gpus_available():
        return [arg for gpu in spec.gpu_ids for arg in ("--device", f"{CDI_GPU_KIND}={gpu}")]
    if spec.real_gpus and spec.gpu_ids:
        log.warning(
            "real GPUs but no %s CDI spec in %s: containers get device nodes without the NVIDIA "
            "driver libraries; run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`",
            CDI_GPU_KIND,
            " or ".join(map(str, CDI_DIRS)),
        )
    args = []
    for gpu in spec.gpu_ids:
        node = gpu_device_dir / f"nvidia{gpu}"
        if node.exists():
            args += ["--device", f"{node}:/dev/nvidia{gpu}"]
    if spec.real_gpus:
        for extra in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
            if (gpu_device_dir / extra).exists():
                args += ["--device", str(gpu_device_dir / extra)]
    return args
