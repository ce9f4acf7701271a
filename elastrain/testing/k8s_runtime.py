"""The container runtime of the test node (`elastrain.testing.k8s_node`): Debian's containerd with a
private configuration, root, state and socket, its CRI plugin running pods with runc through a private
CNI bridge; the pod sandbox ("pause") image made here from catatonit; images imported from podman.

Findings on this kind of machine (cgroup v1 in a container) that the configuration answers:

* containerd gives each sandbox ``oom_score_adj`` -998, which the machine refuses (runc: "can't get
  final child's PID from pipe: EOF"): ``restrict_oom_score_adj = true`` keeps scores at or above
  containerd's own;
* crun refuses the hybrid cgroup layout: runc, with the cgroupfs driver;
* network namespaces live under the private state directory, so `stop` can unmount them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

from elastrain.testing.postgres import ToolMissing

PAUSE_IMAGE = "localhost/elastrain-pause:1"
CRI_NAMESPACE = "k8s.io"
CNI_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
INSTALL_HINT = "apt-get install containerd runc containernetworking-plugins dnsmasq-base, or `make k8s-deps`"


def tool(name: str) -> str:
    """The path of `name` on PATH (or /usr/sbin), `ToolMissing` saying how to install it otherwise."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise ToolMissing(f"{name} is not installed ({INSTALL_HINT})")
    return found


def cni_bin_dir() -> Path:
    """Where the CNI plugins (Debian's containernetworking-plugins) are."""
    for directory in CNI_DIRS:
        if (directory / "bridge").exists() and (directory / "host-local").exists():
            return directory
    raise ToolMissing(f"the CNI plugins bridge and host-local are not installed ({INSTALL_HINT})")


def containerd_config(root: Path, socket: Path, cni_conf: Path, runc: str, cni_bin: Path) -> str:
    """containerd's configuration (version 2): everything under `root`, the CRI plugin as above, the CNI
    plugins from `cni_bin` (`cni_bin_dir()` on a node)."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  max_container_log_line_size = 16384
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni_conf}"
  max_conf_num = 1
"""


def cni_config(bridge: str, subnet: str, ipam_dir: Path) -> str:
    """The pod network: one Linux bridge (gateway .1) and host-local addresses; no NAT, no iptables."""
    config = {
        "cniVersion": "0.4.0",
        "name": bridge,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }
    return json.dumps(config, indent=1)


# --- images ----------------------------------------------------------------------------------------
def _blob(layout: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    layout.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def pause_archive(catatonit: Path, out: Path) -> Path:
    """An OCI image archive of `PAUSE_IMAGE`: catatonit as /pause, run as ``/pause -P`` (its pause
    mode, as podman's own pause image runs it)."""
    layer_raw = io.BytesIO()
    with tarfile.open(fileobj=layer_raw, mode="w") as layer:
        info = layer.gettarinfo(str(catatonit), arcname="pause")
        info.mode, info.uid, info.gid, info.uname, info.gname = 0o755, 0, 0, "root", "root"
        with open(catatonit, "rb") as binary:
            layer.addfile(info, binary)
    diff_id = "sha256:" + hashlib.sha256(layer_raw.getvalue()).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause", "-P"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(out, "w") as layout:
        layer_desc = _blob(layout, gzip.compress(layer_raw.getvalue(), mtime=0))
        config_desc = _blob(layout, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_desc}],
        }
        manifest_desc = _blob(layout, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "annotations": {"io.containerd.image.name": PAUSE_IMAGE},
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
        for name, body in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(body).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            layout.addfile(info, io.BytesIO(data))
    return out


def ctr_argv(socket: Path, *args: str) -> list[str]:
    """A ``ctr`` command against the private containerd, in the CRI plugin's namespace."""
    return [tool("ctr"), "--address", str(socket), "--namespace", CRI_NAMESPACE, *args]


def import_archive(socket: Path, archive: Path, timeout: float = 300) -> None:
    """Import an image archive (OCI or docker) into the CRI plugin's namespace."""
    done = subprocess.run(
        ctr_argv(socket, "images", "import", str(archive)), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"ctr images import {archive} failed: {done.stderr.strip()}")


def import_from_podman(socket: Path, image: str, timeout: float = 900) -> None:
    """``podman save IMAGE | ctr images import -``: podman's image `image` becomes pullable by pods
    (under the same name) without a registry. `ToolMissing` when podman has no such image."""
    podman = tool("podman")
    if subprocess.run([podman, "image", "exists", image], timeout=60).returncode != 0:
        raise ToolMissing(f"podman has no image {image} (build it: `make image`)")
    save = subprocess.Popen(
        ["nice", "-n", "19", podman, "save", "--format", "docker-archive", image],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        load = subprocess.run(
            ["nice", "-n", "19", *ctr_argv(socket, "images", "import", "-")],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        if save.stdout is not None:
            save.stdout.close()
        save_code = save.wait(timeout=timeout)
    if save_code != 0 or load.returncode != 0:
        err = save.stderr.read().decode(errors="replace") if save.stderr else ""
        raise RuntimeError(f"podman save {image} | ctr images import - failed: {err} {load.stderr}".strip())


def image_names(socket: Path) -> list[str]:
    """The images the CRI plugin has."""
    done = subprocess.run(
        ctr_argv(socket, "images", "ls", "-q"), capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()
