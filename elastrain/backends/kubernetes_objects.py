"""The Kubernetes objects of an elastrain cluster, as manifests (plain dicts the API accepts as bodies).

Pure functions from a `ContainerSpec` and the backend's `KubeSettings` to manifests; nothing here talks
to an API server. Per cluster, in the backend's namespace:

* ConfigMap ``elastrain-<cluster>-mpi``: the hostfile (key ``hostfile``), mounted read-only at /etc/mpi
  in every pod; it is also the cluster's root object: every other object names it in its
  ``ownerReferences``, so deleting it garbage-collects the rest;
* Secret ``elastrain-<cluster>-secret``: the node secret (``ELASTRAIN_NODE_SECRET``) and the cluster's
  ssh/munge keys (mounted read-only at /etc/elastrain/keys);
* headless Service (`service_name`): stable DNS names ``<container>.<service>.<namespace>.svc.<domain>``
  published before the pods are ready; each pod searches that domain, so the hostfile's bare container
  names resolve;
* one Pod per container (named like the container, ``restartPolicy: Never``: a pod that ends is a failed
  node, replaced by the reconciler): the image's node daemon as the tenant's uid without capabilities,
  GPUs as ``nvidia.com/gpu`` limits, /dev/shm a memory-backed emptyDir of the cluster's shm size, the
  cluster's storage mounts as hostPath volumes.

Every object carries the labels `LABEL_SERVER` (which server's), `LABEL_CLUSTER` and
`LABEL_CLUSTER_UID`; pods also `LABEL_CONTAINER` and `LABEL_ROLE`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastrain.backends.api import ContainerSpec
from elastrain.backends.container_run import JOBS_DIR, KEYS_DIR, MPI_DIR, is_secret_env, run_env

Manifest = dict[str, Any]
LABEL_PREFIX = "elastrain.io"
LABEL_SERVER = f"{LABEL_PREFIX}/server"
LABEL_CLUSTER = f"{LABEL_PREFIX}/cluster"
LABEL_CLUSTER_UID = f"{LABEL_PREFIX}/cluster-uid"
LABEL_CONTAINER = f"{LABEL_PREFIX}/container"
LABEL_ROLE = f"{LABEL_PREFIX}/role"
MANAGED_BY = {"app.kubernetes.io/managed-by": "elastrain"}
HOSTFILE_KEY = "hostfile"
NODE_SECRET_KEY = "node-secret"
GPU_RESOURCE = "nvidia.com/gpu"
NODE_CONTAINER = "node"  # the pod's one container
MAX_HOST_NAME = 63  # a pod's hostname is one DNS label
NODE_COMMAND = ["python", "-m", "elastrain.agent.noded"]
# the device plugin sets NVIDIA_VISIBLE_DEVICES for the GPUs it assigned; elastrain's ids are virtual here
_NOT_IN_PODS = ("NVIDIA_VISIBLE_DEVICES",)


@dataclass(frozen=True)
class KubeSettings:
    """Where and how the backend places objects."""

    namespace: str
    server_key: str  # the `LABEL_SERVER` value of this server's objects
    image_registry: str = ""  # prefixed to image names without a registry (e.g. "registry.example:5000")
    cluster_domain: str = "cluster.local"
    stop_timeout_s: int = 10  # the pods' terminationGracePeriodSeconds


@dataclass(frozen=True)
class Owner:
    """The cluster's root object (its hostfile ConfigMap), named by every other object of the cluster."""

    name: str
    uid: str


# --- names -----------------------------------------------------------------------------------------
def _bounded(name: str, limit: int) -> str:
    """`name` itself when it fits in `limit` characters, else a prefix and a hash of the whole."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: limit - 11].rstrip('-')}-{digest}"


def hostfile_configmap_name(cluster: str) -> str:
    """The cluster's hostfile ConfigMap (its root object)."""
    return f"elastrain-{cluster}-mpi"


def secret_name(cluster: str) -> str:
    """The cluster's Secret (node secret and keys)."""
    return f"elastrain-{cluster}-secret"


def service_name(cluster: str) -> str:
    """The cluster's headless Service: a DNS-1035 label (starts with a letter, at most 63 characters)."""
    return _bounded(f"elastrain-{cluster}", MAX_HOST_NAME)


def pod_name(container: str) -> str:
    """The pod of container `container` (its host name too)."""
    return container


def image_reference(image: str, registry: str) -> str:
    """`image` as the nodes pull it: podman's ``localhost/`` prefix replaced by `registry` (kept when
    no registry is configured) and a registry prepended to a bare name."""
    if not registry:
        return image
    registry = registry.rstrip("/")
    first, _, rest = image.partition("/")
    if rest and first == "localhost":
        return f"{registry}/{rest}"
    if rest and ("." in first or ":" in first):
        return image  # already names a registry
    return f"{registry}/{image}"


# --- labels and owners -----------------------------------------------------------------------------
def cluster_labels(settings: KubeSettings, cluster: str, cluster_uid: str) -> dict[str, str]:
    """The labels of every object of `cluster`."""
    labels = {**MANAGED_BY, LABEL_SERVER: settings.server_key, LABEL_CLUSTER: cluster}
    if cluster_uid:
        labels[LABEL_CLUSTER_UID] = cluster_uid
    return labels


def server_selector(settings: KubeSettings) -> str:
    """The label selector of every object of this server."""
    return f"{LABEL_SERVER}={settings.server_key}"


def cluster_selector(settings: KubeSettings, cluster: str) -> str:
    """The label selector of every object of `cluster`."""
    return f"{server_selector(settings)},{LABEL_CLUSTER}={cluster}"


def owner_references(owner: Owner | None) -> list[Manifest]:
    """``ownerReferences`` naming the cluster's root ConfigMap (none before it exists)."""
    if owner is None:
        return []
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.name, "uid": owner.uid}]


def _metadata(name: str, labels: Mapping[str, str], owner: Owner | None = None) -> Manifest:
    meta: Manifest = {"name": name, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = owner_references(owner)
    return meta


# --- cluster-level objects -------------------------------------------------------------------------
def hostfile_configmap(settings: KubeSettings, cluster: str, cluster_uid: str, hostfile: str) -> Manifest:
    """The root ConfigMap holding the hostfile."""
    labels = cluster_labels(settings, cluster, cluster_uid)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(hostfile_configmap_name(cluster), labels),
        "data": {HOSTFILE_KEY: hostfile},
    }


def cluster_secret(
    settings: KubeSettings,
    cluster: str,
    cluster_uid: str,
    owner: Owner,
    node_secret: str,
    keys: Mapping[str, bytes],
) -> Manifest:
    """The Secret with the node secret and the cluster's key files (`keys`: file name -> content)."""
    data = {NODE_SECRET_KEY: node_secret.encode(), **keys}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(secret_name(cluster), cluster_labels(settings, cluster, cluster_uid), owner),
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def headless_service(settings: KubeSettings, cluster: str, cluster_uid: str, owner: Owner) -> Manifest:
    """The headless Service giving every pod of the cluster a DNS name, ready or not."""
    labels = cluster_labels(settings, cluster, cluster_uid)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(cluster), labels, owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # names resolve while pods start (the rendezvous needs them)
            "selector": {LABEL_SERVER: settings.server_key, LABEL_CLUSTER: cluster},
            "ports": [{"name": "ssh", "port": 22, "targetPort": 22}],
        },
    }


# --- pods ------------------------------------------------------------------------------------------
def pod_env(spec: ContainerSpec) -> list[Manifest]:
    """The node daemon's environment: the container backend's, secrets taken from the cluster Secret."""
    env: list[Manifest] = []
    for key, value in sorted(run_env(spec, "").items()):
        if key in _NOT_IN_PODS:
            continue
        if key == "ELASTRAIN_NODE_SECRET":
            ref = {"name": secret_name(spec.cluster), "key": NODE_SECRET_KEY}
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
        elif not is_secret_env(key):  # a token in spec.env belongs to exec calls, not the pod
            env.append({"name": key, "value": value})
    return env


def pod_resources(spec: ContainerSpec) -> Manifest:
    """Limits (= requests): GPUs as `GPU_RESOURCE`, memory and CPUs where the cluster sets them."""
    limits: dict[str, str] = {}
    if spec.gpu_ids:
        limits[GPU_RESOURCE] = str(len(spec.gpu_ids))
    if spec.memory_bytes > 0:
        limits["memory"] = str(spec.memory_bytes)
    if spec.cpus > 0:
        limits["cpu"] = f"{spec.cpus:g}"
    return {"limits": limits} if limits else {}


def _volumes(spec: ContainerSpec) -> tuple[list[Manifest], list[Manifest]]:
    """(volumes, volumeMounts) of a pod."""
    home = f"/home/{spec.tenant or 'elastrain'}"
    shm: Manifest = {"medium": "Memory"}
    if spec.shm_bytes > 0:
        shm["sizeLimit"] = str(spec.shm_bytes)
    volumes: list[Manifest] = [
        {"name": "mpi", "configMap": {"name": hostfile_configmap_name(spec.cluster), "defaultMode": 0o444}},
        {"name": "keys", "secret": {"secretName": secret_name(spec.cluster), "defaultMode": 0o440}},
        {"name": "shm", "emptyDir": shm},
        {"name": "home", "emptyDir": {}},
    ]
    mounts: list[Manifest] = [
        {"name": "mpi", "mountPath": MPI_DIR, "readOnly": True},
        {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "home", "mountPath": home},
    ]
    if spec.role == "launcher":
        volumes.append({"name": "jobs", "emptyDir": {}})
        mounts.append({"name": "jobs", "mountPath": JOBS_DIR})
    for index, mount in enumerate(spec.mounts):
        name = f"storage-{index}"
        volumes.append({"name": name, "hostPath": {"path": mount.source}})
        mounts.append(
            {"name": name, "mountPath": mount.target, **({"readOnly": True} if mount.read_only else {})}
        )
    return volumes, mounts


def pod_manifest(spec: ContainerSpec, settings: KubeSettings, owner: Owner | None) -> Manifest:
    """The pod of one cluster container."""
    if len(spec.name) > MAX_HOST_NAME:
        raise ValueError(
            f"container name {spec.name!r} is longer than {MAX_HOST_NAME} characters, the longest "
            "Kubernetes host name; use a shorter cluster name"
        )
    labels = {
        **cluster_labels(settings, spec.cluster, spec.cluster_uid),
        LABEL_CONTAINER: spec.name,
        LABEL_ROLE: spec.role,
    }
    volumes, mounts = _volumes(spec)
    uid = spec.tenant_uid
    container: Manifest = {
        "name": NODE_CONTAINER,
        "image": image_reference(spec.image, settings.image_registry),
        "imagePullPolicy": "IfNotPresent",  # `elastrain image build` tags :latest, which would mean Always
        "command": list(NODE_COMMAND),
        "workingDir": f"/home/{spec.tenant or 'elastrain'}",
        "env": pod_env(spec),
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    resources = pod_resources(spec)
    if resources:
        container["resources"] = resources
    pod_security: Manifest = {"runAsUser": uid, "runAsGroup": uid, "fsGroup": uid}
    if uid:
        pod_security["runAsNonRoot"] = True
    service = service_name(spec.cluster)
    search = f"{service}.{settings.namespace}.svc.{settings.cluster_domain}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(pod_name(spec.name), labels, owner),
        "spec": {
            "hostname": spec.name,
            "subdomain": service,
            "dnsConfig": {"searches": [search]},  # the hostfile's bare container names resolve
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,  # tenants' code gets no credentials to this API
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": settings.stop_timeout_s,
            "securityContext": pod_security,
            "containers": [container],
            "volumes": volumes,
        },
    }
