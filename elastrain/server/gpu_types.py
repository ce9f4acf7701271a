"""GPUs of one model that a new cluster asking for that model (``gpu_type``) could get.

A create request naming a GPU model is refused (409) when the node has too few GPUs of it, or when too
few of them are free for it: not held by another cluster's containers, nor promised to a cluster of
that model that is still starting or queued. With a scheduler, GPUs another cluster holds above its minimum
count as free: the scheduler shrinks it to admit the new one.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastrain.db.models import Cluster, ClusterState, ContainerState
from elastrain.server.inventory import Inventory, parse_gpu_ids

_HOLDING = (ContainerState.Pending, ContainerState.Running, ContainerState.Terminating)


def _held(cluster: Cluster, inventory: Inventory, gpu_type: str) -> int:
    """GPUs of model `gpu_type` that `cluster`'s live containers hold."""
    ids = (g for k in cluster.containers if k.state in _HOLDING for g in parse_gpu_ids(k.gpu_ids))
    return sum(1 for g in ids if inventory.model_of(g) == gpu_type)


def _floor(cluster: Cluster, elastic: bool) -> int:
    """The GPUs a cluster keeps whatever happens: its minimum with a scheduler, else its size."""
    containers = cluster.desired_containers
    if elastic:
        containers = cluster.min_containers or containers
    return containers * cluster.gpus_per_container


def free_of_type(clusters: Iterable[Cluster], inventory: Inventory, gpu_type: str, elastic: bool) -> int:
    """GPUs of model `gpu_type` a new cluster could get (see the module docstring)."""
    taken = 0
    for cluster in clusters:
        if cluster.state == ClusterState.Terminating and not cluster.containers:
            continue
        held = _held(cluster, inventory, gpu_type)
        if cluster.gpu_type == gpu_type:  # started or queued, it will hold its floor of this model
            held = max(held, _floor(cluster, elastic))
        if elastic and cluster.state != ClusterState.Terminating:
            held = min(held, _floor(cluster, elastic))  # the rest the scheduler can take back
        taken += held
    return max(inventory.count(gpu_type) - taken, 0)
