"""A private Kubernetes control plane for tests: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager on free loopback ports, everything under one temporary directory.

The Kubernetes binaries come from ``make k8s-deps`` (``scripts/k8s_build.sh`` builds them from Debian's
``kubernetes`` source package into `cache_dir`); etcd is Debian's ``etcd-server``. Nothing is installed
here: without them `KubeControlPlane()` raises `ToolMissing`, which a fixture turns into a skip.

The API server serves TLS with a self-signed certificate (openssl; SAN 127.0.0.1 and localhost) and
authenticates bearer tokens from a static token file: ``admin`` (group ``system:masters``) and
``nobody`` (no role bound: every request is forbidden by RBAC). `kubeconfig_for` writes a kubeconfig
for either. `stop()` ends every process by PID and removes the directory. No node: pods are scheduled
(or not) but run only where a `elastrain.testing.k8s_node.KubeNode` (kubelet + containerd) joins.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from elastrain.testing.ports import free_port
from elastrain.testing.postgres import ToolMissing
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

K8S_DIR_ENV = "ELASTRAIN_K8S_DIR"
CONTROL_PLANE_BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
START_TIMEOUT_S = 90.0


def cache_dir() -> Path:
    """Where ``make k8s-deps`` puts the build (the same rule as ``scripts/k8s_build.sh``)."""
    if os.environ.get(K8S_DIR_ENV):
        return Path(os.environ[K8S_DIR_ENV])
    if os.geteuid() == 0:
        return Path("/var/cache/elastrain/k8s")
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "elastrain" / "k8s"


def k8s_binary(name: str) -> Path:
    """The cached binary `name` (``kube-apiserver``, ``kubelet``, ...); `ToolMissing` without it."""
    path = cache_dir() / "bin" / name
    if not os.access(path, os.X_OK):
        raise ToolMissing(f"{path} is missing: build the Kubernetes binaries with `make k8s-deps`")
    return path


def etcd_binary() -> Path:
    """Debian's etcd (package etcd-server); `ToolMissing` without it."""
    found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
    if found is None:
        raise ToolMissing("etcd is not installed (Debian: apt-get install etcd-server, or `make k8s-deps`)")
    return Path(found)


@dataclass(frozen=True)
class KubeUser:
    """A user the API server knows by its bearer token."""

    name: str
    token: str


def log_tail(path: Path, lines: int = 8) -> str:
    """The last `lines` lines of a daemon's log file, on one line ("(no log)" when unreadable)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return " | ".join(text.strip().splitlines()[-lines:])


def elastrain_server(plane: KubeControlPlane, namespace: str, root: Path) -> ControlPlane:
    """An `elastrain server --backend kubernetes` (not started yet) on `plane`'s `namespace`, as its
    admin, with 8 virtual GPUs, keeping its files under `root`."""
    kubeconfig = plane.kubeconfig_for(plane.admin, namespace)
    args = ("--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace)
    return ControlPlane(root, gpus=8, extra_args=args)


class KubeControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager of their own; `stop()` ends them."""

    def __init__(self) -> None:
        self.binaries = {name: k8s_binary(name) for name in CONTROL_PLANE_BINARIES}
        self.etcd = etcd_binary()
        self.root = Path(tempfile.mkdtemp(prefix="elastrain-k8s-"))
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.admin = KubeUser("admin", secrets.token_hex(16))
        self.nobody = KubeUser("nobody", secrets.token_hex(16))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    # --- set-up ------------------------------------------------------------------------------------
    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=self.root)

    def _write_credentials(self) -> None:
        """The serving certificate, the client certificate the API server shows kubelets (a node trusts
        it alone), the service-account key pair and the static token file."""
        self._openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "serving.key", "-out", "serving.crt", "-subj", "/CN=elastrain-test-apiserver",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
        )  # fmt: skip
        self._openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", "kubelet-client.key",
            "-out", "kubelet-client.crt", "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client",
        )  # fmt: skip
        self._openssl("genrsa", "-out", "sa.key", "2048")
        self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        tokens = f'{self.admin.token},admin,1,"system:masters"\n{self.nobody.token},nobody,2\n'
        (self.root / "tokens.csv").write_text(tokens)
        os.chmod(self.root / "tokens.csv", 0o600)
        self.kubeconfig = self.kubeconfig_for(self.admin)

    def kubeconfig_for(self, user: KubeUser, namespace: str = "default") -> Path:
        """A kubeconfig reaching this API server as `user` (0600, in the plane's directory)."""
        path = self.root / f"{user.name}-{namespace}.kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: test\n  cluster:\n    server: {self.url}\n"
            f"    certificate-authority: {self.root / 'serving.crt'}\n"
            f"users:\n- name: {user.name}\n  user:\n    token: {user.token}\n"
            f"contexts:\n- name: test\n  context:\n    cluster: test\n    user: {user.name}\n"
            f"    namespace: {namespace}\n"
            "current-context: test\n"
        )
        os.chmod(path, 0o600)
        return path

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def _start(self) -> None:
        self._write_credentials()
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                str(self.etcd), "--name", "test", "--data-dir", str(self.root / "etcd"),
                "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"test=http://127.0.0.1:{peer}",
            ],
        )  # fmt: skip
        r = self.root
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries["kube-apiserver"]),
                f"--etcd-servers={self.etcd_url}", "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1", f"--secure-port={self.port}", "--insecure-port=0",
                f"--tls-cert-file={r / 'serving.crt'}", f"--tls-private-key-file={r / 'serving.key'}",
                f"--cert-dir={r / 'certs'}", f"--token-auth-file={r / 'tokens.csv'}",
                "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16",
                f"--service-account-key-file={r / 'sa.pub'}",
                f"--service-account-signing-key-file={r / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc", "--allow-privileged=true",
                "--kubelet-preferred-address-types=InternalIP",  # a test node's name does not resolve
                f"--kubelet-client-certificate={r / 'kubelet-client.crt'}",
                f"--kubelet-client-key={r / 'kubelet-client.key'}",
            ],
        )  # fmt: skip
        self.wait_ready()
        kubeconfig = str(self.kubeconfig)
        self._spawn(
            "kube-scheduler",
            [str(self.binaries["kube-scheduler"]), f"--kubeconfig={kubeconfig}", "--port=0",
             "--secure-port=0", "--leader-elect=false"],
        )  # fmt: skip
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries["kube-controller-manager"]), f"--kubeconfig={kubeconfig}",
                "--port=0", "--secure-port=0", "--leader-elect=false",
                f"--service-account-private-key-file={r / 'sa.key'}", f"--root-ca-file={r / 'serving.crt'}",
            ],
        )  # fmt: skip
        self.wait_namespace_ready("default")

    # --- waiting -----------------------------------------------------------------------------------
    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        """GET `path` of the API server as the admin (or `token`): (status, body); 0 unreachable."""
        context = ssl.create_default_context(cafile=str(self.root / "serving.crt"))
        request = urllib.request.Request(
            self.url + path, headers={"Authorization": f"Bearer {token or self.admin.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def _check_alive(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self.log_tail(name)
                return f"{name} exited with code {proc.returncode}; last lines: {tail}"
        return None

    def log_tail(self, name: str, lines: int = 8) -> str:
        """The last lines of a component's log."""
        return log_tail(self.root / f"{name}.log", lines)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until the API server's /readyz answers 200 (a component exiting fails at once)."""
        wait_until(
            lambda: self.get("/readyz")[0] == 200,
            timeout,
            "kube-apiserver /readyz",
            interval=0.2,
            abort=self._check_alive,
        )

    def wait_namespace_ready(self, namespace: str, timeout: float = START_TIMEOUT_S) -> None:
        """Wait until `namespace` has its ``default`` service account (pods can then be created)."""
        wait_until(
            lambda: self.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200,
            timeout,
            f"the default service account of namespace {namespace}",
            interval=0.2,
            abort=self._check_alive,
        )

    # --- tear-down ---------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM every component (newest first), SIGKILL what is left after 10 s, remove the files."""
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
