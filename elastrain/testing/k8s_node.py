"""A real node for the private control plane (`elastrain.testing.k8s.KubeControlPlane`): the kubelet
built by ``make k8s-deps`` with Debian's containerd (`elastrain.testing.k8s_runtime`), a private pod
bridge and cluster DNS (`elastrain.testing.k8s_dns`). Pods scheduled to it run for real.

Needs root; everything is private to the node: a temporary directory (containerd's root, state and
socket, the kubelet's root, CNI configuration and addresses), a bridge ``ek8s<hex>`` on a free
10.244.N.0/24, a cgroup parent ``/elastrain-k8s-<hex>`` in every cgroup v1 hierarchy. `stop()` kills
every pod's processes, stops the daemons by PID, unmounts and removes all of it and puts back the
kernel settings the kubelet changes. Without the tools `KubeNode` raises `ToolMissing`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from elastrain.testing import k8s_runtime as runtime
from elastrain.testing.k8s import KubeControlPlane, k8s_binary, log_tail
from elastrain.testing.k8s_dns import CLUSTER_DOMAIN, ClusterDns
from elastrain.testing.ports import free_port
from elastrain.testing.postgres import ToolMissing
from elastrain.testing.waits import wait_until

CGROUP_ROOT = Path("/sys/fs/cgroup")
# the kubelet sets these (it cannot be told not to); `stop` writes back the values found before
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops")
READY_TIMEOUT_S = 120.0
# paths the kubelet 1.20 uses whatever its --root-dir: the device-plugin socket, pods' log files
KUBELET_FIXED_DIR = Path("/var/lib/kubelet")
POD_LOG_DIRS = (Path("/var/log/pods"), Path("/var/log/containers"))


def _run(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)


def _entries(directory: Path) -> set[str]:
    return set(os.listdir(directory)) if directory.is_dir() else set()


def _free_subnet() -> int:
    """N of a 10.244.N.0/24 no route of this machine covers."""
    routes = _run("ip", "-4", "route", "show").stdout
    for _ in range(100):
        n = secrets.randbelow(250) + 2
        if f"10.244.{n}." not in routes:
            return n
    raise ToolMissing("no free 10.244.N.0/24 for the pod bridge")


class KubeNode:
    """containerd + kubelet registered as node `name` of `plane`; `stop()` removes every trace."""

    def __init__(self, plane: KubeControlPlane) -> None:
        if os.geteuid() != 0:
            raise ToolMissing("a kubelet node needs root")
        self.kubelet = k8s_binary("kubelet")
        self.tools = {n: runtime.tool(n) for n in ("containerd", "ctr", "runc", "dnsmasq", "ip", "catatonit")}
        runtime.cni_bin_dir()
        self.plane = plane
        tag = secrets.token_hex(3)
        self.name = f"elastrain-node-{tag}"
        self.bridge = f"ek8s{tag}"
        self.cgroup_parent = f"/elastrain-k8s-{tag}"
        self.root = Path(tempfile.mkdtemp(prefix="elastrain-k8s-node-"))
        self.socket = self.root / "containerd" / "containerd.sock"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.dns: ClusterDns | None = None
        self.tunables = {t: (Path("/proc/sys") / t).read_text() for t in KERNEL_TUNABLES}
        self.had_kubelet_dir = KUBELET_FIXED_DIR.exists()
        self.pod_logs = {d: _entries(d) if d.is_dir() else None for d in POD_LOG_DIRS}
        self.subnet = _free_subnet()
        self.gateway = f"10.244.{self.subnet}.1"
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    # --- set-up ------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def _bridge(self) -> None:
        ip = self.tools["ip"]
        for argv in (
            [ip, "link", "add", self.bridge, "type", "bridge"],
            [ip, "addr", "add", f"{self.gateway}/24", "dev", self.bridge],
            [ip, "link", "set", self.bridge, "up"],
        ):
            done = _run(*argv)
            if done.returncode != 0:
                raise ToolMissing(f"cannot make the pod bridge ({' '.join(argv)}): {done.stderr.strip()}")

    def _cgroups(self) -> None:
        """The pods' cgroup parent in every v1 hierarchy (cpuset: the root's CPUs and memory nodes)."""
        for hierarchy in self._hierarchies():
            path = hierarchy / self.cgroup_parent.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (path / key).write_text((hierarchy / key).read_text())

    @staticmethod
    def _hierarchies() -> list[Path]:
        found = sorted(CGROUP_ROOT.iterdir())
        return [p for p in found if p.is_dir() and not p.is_symlink() and p.name != "unified"]

    def _containerd(self) -> None:
        base = self.root / "containerd"
        (self.root / "cni").mkdir(parents=True)
        base.mkdir()
        (self.root / "cni" / "10-elastrain.conflist").write_text(
            runtime.cni_config(self.bridge, f"10.244.{self.subnet}.0/24", self.root / "ipam")
        )
        config = base / "config.toml"
        config.write_text(
            runtime.containerd_config(
                base, self.socket, self.root / "cni", self.tools["runc"], runtime.cni_bin_dir()
            )
        )
        self._spawn("containerd", [self.tools["containerd"], "--config", str(config)])
        wait_until(
            lambda: _run(*runtime.ctr_argv(self.socket, "version")).returncode == 0,
            60,
            "containerd to answer",
            interval=0.2,
            abort=self._check_alive,
        )
        pause = runtime.pause_archive(Path(self.tools["catatonit"]), self.root / "pause.tar")
        runtime.import_archive(self.socket, pause)

    def _kubelet(self) -> None:
        base = self.root / "kubelet"
        base.mkdir()
        (self.root / "resolv.conf").write_text(f"nameserver {self.gateway}\n")
        self.port = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.gateway,  # the node's IP: the API server reaches it there (exec, logs)
            "port": self.port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {  # only the API server's client certificate
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.root / "kubelet-client.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_parent,
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [self.gateway],
            "resolvConf": str(self.root / "resolv.conf"),
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
            "maxPods": 50,
            "staticPodPath": "",
        }
        (base / "config.yaml").write_text(json.dumps(config))
        self._spawn(
            "kubelet",
            [
                str(self.kubelet), f"--config={base / 'config.yaml'}",
                f"--kubeconfig={self.plane.kubeconfig}",
                "--container-runtime=remote", f"--container-runtime-endpoint=unix://{self.socket}",
                f"--root-dir={base}", f"--cert-dir={base / 'pki'}", f"--hostname-override={self.name}",
                f"--node-ip={self.gateway}", "--v=1",
            ],
        )  # fmt: skip

    def _start(self) -> None:
        self._bridge()
        self._cgroups()
        self._containerd()
        self.dns = ClusterDns(self.root / "dns", self.gateway, self._endpoints, self.tools["dnsmasq"])
        self._kubelet()
        what = f"node {self.name} to be Ready"
        wait_until(self._ready, READY_TIMEOUT_S, what, interval=0.5, abort=self._check_alive)

    def _endpoints(self) -> list[dict[str, object]]:
        code, body = self.plane.get("/api/v1/endpoints")
        if code != 200:
            raise RuntimeError(f"listing the Endpoints answered {code}")
        items: list[dict[str, object]] = json.loads(body)["items"]
        return items

    # --- state -------------------------------------------------------------------------------------
    def _check_alive(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return f"{name} exited with code {proc.returncode}; last lines: {self.log_tail(name)}"
        return self.dns.alive() if self.dns is not None else None

    def _ready(self) -> bool:
        code, body = self.plane.get(f"/api/v1/nodes/{self.name}")
        if code != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def log_tail(self, name: str, lines: int = 8) -> str:
        """The last lines of a daemon's log (``containerd``, ``kubelet``)."""
        return log_tail(self.root / f"{name}.log", lines)

    def load_image(self, image: str) -> None:
        """Make podman's `image` available to pods under its name (`ToolMissing` without it)."""
        if image not in runtime.image_names(self.socket):
            runtime.import_from_podman(self.socket, image)

    # --- tear-down ---------------------------------------------------------------------------------
    def _stop_proc(self, name: str, timeout: float = 15) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _kill_tasks(self) -> None:
        """SIGKILL every container's processes, then the containerd shims this containerd started."""
        if self.procs.get("containerd") is None:
            return
        tasks = _run(*runtime.ctr_argv(self.socket, "tasks", "ls", "-q")).stdout.split()
        for task in tasks:
            _run(*runtime.ctr_argv(self.socket, "tasks", "kill", "-a", "-s", "SIGKILL", task))
        for task in tasks:
            _run(*runtime.ctr_argv(self.socket, "tasks", "delete", "-f", task), timeout=60)
        for pid in self._shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _shims(self) -> list[int]:
        """The PIDs of the shims that name this node's containerd socket on their command line."""
        needle = str(self.socket).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if needle in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
        return found

    def _unmount(self) -> None:
        prefix = str(self.root) + "/"
        with contextlib.suppress(OSError):
            mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
            for point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
                _run("umount", "-l", point)

    def _remove_cgroups(self) -> None:
        for hierarchy in self._hierarchies():
            top = hierarchy / self.cgroup_parent.lstrip("/")
            if not top.is_dir():
                continue
            children = [p for p in top.rglob("*") if p.is_dir()]
            for path in sorted(children, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    path.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()

    def _remove_fixed_paths(self) -> None:
        """What the kubelet left outside the node's directory (only what was not there before)."""
        if not self.had_kubelet_dir:
            shutil.rmtree(KUBELET_FIXED_DIR, ignore_errors=True)
        for directory, before in self.pod_logs.items():
            if before is None:
                shutil.rmtree(directory, ignore_errors=True)
                continue
            for name in _entries(directory) - before:
                path = directory / name
                if path.is_symlink() or path.is_file():
                    path.unlink(missing_ok=True)
                else:
                    shutil.rmtree(path, ignore_errors=True)

    def stop(self) -> None:
        """Stop the kubelet, kill the pods, stop containerd and DNS, remove bridge, cgroups, files."""
        self._stop_proc("kubelet")
        self._kill_tasks()
        self._stop_proc("containerd")
        for pid in self._shims():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.dns is not None:
            self.dns.stop()
        self._unmount()
        _run("ip", "link", "delete", self.bridge)
        time.sleep(0.2)
        self._remove_cgroups()
        self._remove_fixed_paths()
        for tunable, value in self.tunables.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / tunable).write_text(value)
        shutil.rmtree(self.root, ignore_errors=True)
