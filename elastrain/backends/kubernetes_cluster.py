"""A cluster's objects besides its pods on the API server: the hostfile ConfigMap (the root object),
the Secret and the headless Service; created idempotently, updated (the hostfile) and deleted.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from elastrain.backends.api import ContainerSpec
from elastrain.backends.kubernetes_client import KubeConnection, KubernetesError, call
from elastrain.backends.kubernetes_objects import (
    HOSTFILE_KEY,
    KubeSettings,
    Owner,
    cluster_secret,
    cluster_selector,
    headless_service,
    hostfile_configmap,
    hostfile_configmap_name,
    secret_name,
    service_name,
)


class ClusterObjects:
    """The ConfigMap, Secret and Service of each cluster in the backend's namespace."""

    def __init__(self, core: Any, conn: KubeConnection, settings: KubeSettings) -> None:
        self.core = core  # kubernetes.client.CoreV1Api
        self.conn = conn
        self.settings = settings
        self._written: dict[tuple[str, str], str] = {}  # (cluster, key) -> ConfigMap text last written

    @property
    def namespace(self) -> str:
        """The namespace of every object."""
        return self.settings.namespace

    def call(self, fn: Any, *args: Any, action: str, **kwargs: Any) -> Any:
        """An API call of this backend (`elastrain.backends.kubernetes_client.call`)."""
        return call(fn, *args, action=action, namespace=self.namespace, url=self.conn.url, **kwargs)

    def _exists(self, read: Any, name: str, what: str) -> bool:
        try:
            self.call(read, name, self.namespace, action=f"read {what} {name}")
        except KubernetesError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _create(self, create: Any, body: dict[str, Any], what: str) -> None:
        """Create an object; one created meanwhile (HTTP 409) is fine."""
        try:
            self.call(create, self.namespace, body, action=f"create {what}")
        except KubernetesError as exc:
            if exc.status != 409:
                raise

    def owner(self, cluster: str, cluster_uid: str) -> Owner:
        """The cluster's root ConfigMap (created with an empty hostfile when missing)."""
        name = hostfile_configmap_name(cluster)
        body = hostfile_configmap(self.settings, cluster, cluster_uid, "# generation: 0\n")
        try:
            found = self.call(
                self.core.create_namespaced_config_map,
                self.namespace,
                body,
                action=f"create configmap {name}",
            )
        except KubernetesError as exc:
            if exc.status != 409:
                raise
            found = self.call(
                self.core.read_namespaced_config_map, name, self.namespace, action=f"read configmap {name}"
            )
        return Owner(name, str(found.metadata.uid))

    def prepare(self, spec: ContainerSpec) -> Owner:
        """The cluster's ConfigMap, Secret (node secret and keys) and headless Service (idempotent)."""
        owner = self.owner(spec.cluster, spec.cluster_uid)
        name = secret_name(spec.cluster)
        if not self._exists(self.core.read_namespaced_secret, name, "secret"):
            keys = cluster_keys(spec.cluster)
            body = cluster_secret(
                self.settings, spec.cluster, spec.cluster_uid, owner, secrets.token_hex(24), keys
            )
            self._create(self.core.create_namespaced_secret, body, f"secret {name}")
        service = service_name(spec.cluster)
        if not self._exists(self.core.read_namespaced_service, service, "service"):
            body = headless_service(self.settings, spec.cluster, spec.cluster_uid, owner)
            self._create(self.core.create_namespaced_service, body, f"service {service}")
        return owner

    def delete(self, cluster: str, pod_grace_s: int) -> None:
        """Delete the cluster's objects: the root first (the garbage collector then removes whatever a
        crash may leave), the Service and Secret, and every pod of the cluster by label."""
        deletions = (
            (self.core.delete_namespaced_config_map, hostfile_configmap_name(cluster), "configmap"),
            (self.core.delete_namespaced_service, service_name(cluster), "service"),
            (self.core.delete_namespaced_secret, secret_name(cluster), "secret"),
        )
        for delete, name, kind in deletions:
            try:
                self.call(
                    delete,
                    name,
                    self.namespace,
                    propagation_policy="Background",
                    action=f"delete {kind} {name}",
                    _preload_content=False,  # a Status on some versions, the object on others
                )
            except KubernetesError as exc:
                if exc.status != 404:
                    raise
        self.call(
            self.core.delete_collection_namespaced_pod,
            self.namespace,
            label_selector=cluster_selector(self.settings, cluster),
            grace_period_seconds=pod_grace_s,
            action=f"delete the pods of cluster {cluster}",
            _preload_content=False,
        )
        self._written = {k: v for k, v in self._written.items() if k[0] != cluster}

    def write(self, cluster: str, key: str, text: str) -> None:
        """Set `key` of the cluster's ConfigMap to `text` (skipped when it holds that already; a
        cluster without a ConfigMap yet is skipped too: the reconciler writes again)."""
        if self._written.get((cluster, key)) == text:
            return
        name = hostfile_configmap_name(cluster)
        try:
            self.call(
                self.core.patch_namespaced_config_map,
                name,
                self.namespace,
                {"data": {key: text}},
                action=f"update configmap {name}",
            )
        except KubernetesError as exc:
            if exc.status == 404:
                return
            raise
        self._written[(cluster, key)] = text

    def hostfile(self, cluster: str) -> str | None:
        """The hostfile as the cluster's ConfigMap holds it (None: no such ConfigMap)."""
        name = hostfile_configmap_name(cluster)
        try:
            found = self.call(
                self.core.read_namespaced_config_map, name, self.namespace, action=f"read configmap {name}"
            )
        except KubernetesError as exc:
            if exc.status == 404:
                return None
            raise
        return str((found.data or {}).get(HOSTFILE_KEY, ""))


def cluster_keys(cluster: str) -> dict[str, bytes]:
    """A fresh set of the cluster's ssh and munge keys (`elastrain.backends.cluster_keys`), as files."""
    from elastrain.backends.cluster_keys import ensure_cluster_keys

    with tempfile.TemporaryDirectory(prefix="elastrain-keys-") as tmp:
        keys = ensure_cluster_keys(Path(tmp) / "keys", cluster, os.getuid())
        return {path.name: path.read_bytes() for path in sorted(keys.iterdir()) if path.is_file()}
