"""The daemons a cluster container runs beside the node daemon: sshd, and its framework's services.

The container backend mounts the cluster's keys read-only at `KEYS_DIR` (one set per cluster: the
sshd host key, the users' client key and its ``authorized_keys``, the ``known_hosts`` line, the munge
key). The node daemon starts, for its container,

* ``sshd`` on port 22 as the tenant (no root, no capabilities: the container's
  ``net.ipv4.ip_unprivileged_port_start`` lets it bind 22), public-key only, with the container's own
  environment (PATH with the venv, its GPUs, the ``ELASTRAIN_*`` variables) set in every session, so
  ``ssh <cluster>-worker-1`` and DeepSpeed's pdsh launcher work between the containers of a cluster;
* the framework's services (`framework_services`; e.g. munge and the Slurm daemons for ``slurm``);
* in a launcher given a lab token (``ELASTRAIN_LAB_TOKEN``), JupyterLab (`jupyterlab_service`) on
  `LAB_PORT` of the container's address, under ``/clusters/<cluster>/lab/`` (the portal proxies that
  path to it, adding the token, so the browser never sees it).

A `Supervisor` keeps each running: a service that exits is started again after a short back-off, and
each restart is logged to the container's log.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("elastrain.noded")

KEYS_DIR = Path("/etc/elastrain/keys")
SSH_PORT = 22
SSHD = "/usr/sbin/sshd"  # sshd re-executes itself: it needs its absolute path
RUN_DIR = Path("/tmp/elastrain-services")  # the container's own /tmp: configs, pid files, sockets
# variables of the container that ssh sessions get too (sshd starts sessions with a clean environment)
SESSION_ENV_PREFIXES = ("ELASTRAIN_", "CUDA_", "NVIDIA_")
SESSION_ENV_NAMES = ("PATH", "PYTHONUNBUFFERED", "PDSH_RCMD_TYPE", "LANG")
LAB_TOKEN_ENV = "ELASTRAIN_LAB_TOKEN"  # the cluster's JupyterLab token (the server keeps it)
LAB_PORT = 8888
LAB_SHELL = "/bin/bash"  # JupyterLab's terminals: an interactive, non-login bash (keeps the venv's PATH)
# JupyterLab writes its token into every page's config; through the portal nobody needs it there (the
# proxy adds it to each request), so a config-file hook (code: a .py beside the .json) blanks it
LAB_PAGE_HOOK = """# written by the elastrain node daemon: the proxy adds the token, pages never carry it
c.ServerApp.tornado_settings = {"page_config_hook": lambda handler, config: {**config, "token": ""}}
"""
# defaults of JupyterLab's settings (the user's own still win): never ask to fetch news (offline)
LAB_SETTING_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}
STABLE_S = 60.0  # a service that ran this long before exiting restarts after 1 s again (no back-off)


@dataclass
class Service:
    """One supervised daemon: the command that runs it in the foreground, and its set-up step."""

    name: str
    argv: list[str]
    prepare: Callable[[], None] = lambda: None
    env: dict[str, str] = field(default_factory=dict)


def _quote_setenv(value: str) -> str:
    """A value for sshd_config's ``SetEnv NAME=VALUE`` (double-quoted where it has spaces/quotes)."""
    if value and not any(c in value for c in ' \t"\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def session_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The container variables an ssh session gets (the secret too: the session is the tenant's)."""
    return {
        k: v
        for k, v in sorted(environ.items())
        if (k in SESSION_ENV_NAMES or k.startswith(SESSION_ENV_PREFIXES)) and "\n" not in v
    }


def sshd_config(keys: Path, environ: Mapping[str, str], run_dir: Path, port: int = SSH_PORT) -> str:
    """The sshd_config of a container: its own user, public keys only, the container's environment."""
    lines = [
        f"Port {port}",
        f"HostKey {keys / 'ssh_host_ed25519_key'}",
        f"AuthorizedKeysFile {keys / 'authorized_keys'} .ssh/authorized_keys",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # the keys directory belongs to the tenant, mounted read-only: sshd's ownership checks would
        # refuse a home or key file it cannot attribute to root or the user
        "StrictModes no",
        "PrintMotd no",
        f"PidFile {run_dir / 'sshd.pid'}",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
    ]
    env = session_env(environ)
    if env:
        lines.append("SetEnv " + " ".join(f"{k}={_quote_setenv(v)}" for k, v in env.items()))
    return "\n".join(lines) + "\n"


def sshd_service(
    environ: Mapping[str, str], keys: Path = KEYS_DIR, run_dir: Path = RUN_DIR
) -> Service | None:
    """sshd for this container, or None where the image has no sshd or the cluster no keys."""
    if not Path(SSHD).exists() or not (keys / "ssh_host_ed25519_key").exists():
        return None
    config = run_dir / "sshd_config"

    def prepare() -> None:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        config.write_text(sshd_config(keys, environ, run_dir))

    # -e: log to stderr (the container log; there is no syslog), -D: stay in the foreground
    return Service("sshd", [SSHD, "-D", "-e", "-f", str(config)], prepare)


def lab_base_url(cluster: str) -> str:
    """The path JupyterLab serves under: the portal's proxy path of the cluster (links work through it)."""
    return f"/clusters/{cluster}/lab/"


def lab_config(environ: Mapping[str, str], run_dir: Path = RUN_DIR) -> dict[str, Any]:
    """JupyterLab's configuration in a launcher: the container's address (every interface of its own
    network namespace: the cluster network and loopback), the proxy's base URL, the whole container
    browsable but opening in the tenant's home, terminals as an interactive (non-login) bash, and
    `LAB_SETTING_OVERRIDES` (in ``run_dir``)."""
    home = environ.get("HOME", "/")
    return {
        "ServerApp": {
            "ip": "0.0.0.0",
            "port": LAB_PORT,
            "port_retries": 0,  # the server reaches it on this port or not at all
            "open_browser": False,
            "base_url": lab_base_url(environ.get("ELASTRAIN_CLUSTER", "")),
            "root_dir": "/",
            "allow_remote_access": True,  # the Host header is the server's proxy view of the container
            # a login shell would read /etc/profile, which resets PATH (the venv's tools would be lost)
            "terminado_settings": {"shell_command": [LAB_SHELL]},
        },
        "ContentsManager": {"preferred_dir": home.strip("/")},
        # the containers are offline: no news feed, no update check, no extension installs from PyPI
        "LabApp": {
            "news_url": None,
            "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
            "extension_manager": "readonly",
            "app_settings_dir": str(run_dir / "lab-settings"),  # its overrides.json
        },
    }


def jupyterlab_service(environ: Mapping[str, str], run_dir: Path = RUN_DIR) -> Service | None:
    """JupyterLab in a launcher container given a lab token; None in a worker, without a token (a server
    that keeps none) or where the image has no JupyterLab (logged)."""
    token = environ.get(LAB_TOKEN_ENV, "")
    if environ.get("ELASTRAIN_CONTAINER_ROLE") != "launcher" or not token:
        return None
    if importlib.util.find_spec("jupyterlab") is None:
        log.warning("no JupyterLab in this image: rebuild it (elastrain image build) to get one")
        return None
    config = run_dir / "jupyter_lab_config.json"  # --config loads the .py of the same name too

    def prepare() -> None:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        config.write_text(json.dumps(lab_config(environ, run_dir), indent=1))
        config.with_suffix(".py").write_text(LAB_PAGE_HOOK)
        (run_dir / "lab-settings").mkdir(exist_ok=True)
        (run_dir / "lab-settings" / "overrides.json").write_text(json.dumps(LAB_SETTING_OVERRIDES))

    # the token goes by the environment (JUPYTER_TOKEN), never argv: `ps` shows argv to every user
    env = {"JUPYTER_TOKEN": token, "SHELL": LAB_SHELL}
    return Service("jupyterlab", [sys.executable, "-m", "jupyterlab", f"--config={config}"], prepare, env)


def framework_services(framework: str, role: str, environ: Mapping[str, str]) -> list[Service]:
    """The services of `framework` for a container of `role` ("launcher"/"worker"); most have none."""
    if framework == "slurm":
        from elastrain.agent.slurm_services import slurm_services

        return slurm_services(role, environ)
    return []


class Supervisor:
    """Starts services and restarts any that exits (back-off 1 s doubling to 30 s; reset to 1 s when
    the service had run for `STABLE_S`)."""

    def __init__(self, services: list[Service]) -> None:
        self.services = services
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start every service, each watched by its own thread."""
        for service in self.services:
            threading.Thread(target=self._keep, args=(service,), daemon=True, name=service.name).start()

    def _keep(self, service: Service) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                service.prepare()
                env = {**os.environ, **service.env}
                proc = subprocess.Popen(service.argv, env=env, stdin=subprocess.DEVNULL)
            except OSError as exc:
                log.warning("cannot start %s: %s", service.name, exc)
                proc = None
            if proc is not None:
                with self._lock:
                    self.procs[service.name] = proc
                log.info("started %s (pid %d)", service.name, proc.pid)
                started = time.monotonic()
                code = proc.wait()
                if self._stop.is_set():
                    return
                if time.monotonic() - started > STABLE_S:  # it had run well: restart it promptly
                    delay = 1.0
                log.warning("%s exited with %s; starting it again in %.0f s", service.name, code, delay)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, 30.0)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every service, SIGKILL what is left after `timeout`."""
        self._stop.set()
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()


def container_services(environ: Mapping[str, str]) -> list[Service]:
    """Every service this container runs: sshd (where possible), JupyterLab (a launcher) and its
    framework's."""
    services = [s for s in [sshd_service(environ), jupyterlab_service(environ)] if s is not None]
    framework = environ.get("ELASTRAIN_FRAMEWORK", "")
    role = environ.get("ELASTRAIN_CONTAINER_ROLE", "worker")
    if framework:
        services += framework_services(framework, role, environ)
    return services
