"""The test node's pure parts: cluster DNS records from Endpoints, the containerd and CNI configuration,
the pause image archive (the node itself runs in tests/k8s)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from elastrain.testing.k8s_dns import hosts_text, records
from elastrain.testing.k8s_runtime import PAUSE_IMAGE, cni_config, containerd_config, pause_archive


def test_headless_service_endpoints_become_pod_and_service_names() -> None:
    endpoints = [
        {
            "metadata": {"name": "elastrain-c", "namespace": "ns"},
            "subsets": [
                {
                    "addresses": [{"ip": "10.244.1.2", "hostname": "c-launcher"}],
                    "notReadyAddresses": [{"ip": "10.244.1.3", "hostname": "c-worker-0"}, {"ip": ""}],
                }
            ],
        },
        {"metadata": {"name": "empty", "namespace": "ns"}},
    ]
    found = records(endpoints)
    assert ("10.244.1.2", "c-launcher.elastrain-c.ns.svc.cluster.local") in found
    assert ("10.244.1.3", "c-worker-0.elastrain-c.ns.svc.cluster.local") in found  # not ready: published too
    assert ("10.244.1.2", "elastrain-c.ns.svc.cluster.local") in found
    assert len(found) == 4
    assert hosts_text(found[:1]).count("\n") == 1


def test_containerd_runs_pods_with_runc_and_a_restricted_oom_score(tmp_path: Path) -> None:
    text = containerd_config(
        tmp_path, tmp_path / "c.sock", tmp_path / "cni", "/usr/sbin/runc", tmp_path / "cnibin"
    )
    assert f'bin_dir = "{tmp_path / "cnibin"}"' in text
    assert "restrict_oom_score_adj = true" in text and "SystemdCgroup = false" in text
    assert f'sandbox_image = "{PAUSE_IMAGE}"' in text and f'root = "{tmp_path / "root"}"' in text
    net = json.loads(cni_config("ek8s1", "10.244.9.0/24", tmp_path / "ipam"))
    bridge = net["plugins"][0]
    assert bridge["bridge"] == "ek8s1" and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.9.0/24"}]]


def test_pause_archive_is_an_oci_layout_naming_the_image(tmp_path: Path) -> None:
    binary = tmp_path / "catatonit"
    binary.write_bytes(b"\x7fELF fake")
    archive = pause_archive(binary, tmp_path / "pause.tar")
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        names = tar.getnames()
    [manifest] = index["manifests"]
    assert manifest["annotations"]["io.containerd.image.name"] == PAUSE_IMAGE
    assert "oci-layout" in names and f"blobs/sha256/{manifest['digest'].split(':')[1]}" in names
