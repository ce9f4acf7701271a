"""The API view of a cluster row (`cluster_out`) and the launch hint each framework's clusters show.

The hint and the first job (the portal's job box) take their worker count from one function,
`elastrain.examples.np_flags`: the cluster's bounds as ``--min-np A --max-np B`` (``-np N`` when fixed)."""

from __future__ import annotations

import json

from elastrain.db.models import Cluster, Framework
from elastrain.examples import NP_PLACEHOLDER, first_job_command, np_flags
from elastrain.server import schemas
from elastrain.server.cluster_demand import own_bounds
from elastrain.server.inventory import parse_gpu_ids
from elastrain.server.mount_sources import shown_mount
from elastrain.server.reconciler import aware
from elastrain.server.redact import redact
from elastrain.server.validation import format_size

_HOSTFILE = "--hostfile /etc/mpi/hostfile"
_EXAMPLES = "/opt/elastrain/examples"
# the command a user of each framework types in the launcher (the framework's own launcher, for real);
# {np}: the cluster's worker count or range (DeepSpeed, Megatron's tensor parallel 2 and Slurm use
# every slot of the hostfile, whatever it holds)
LAUNCH_HINTS = {
    Framework.horovod: f"horovodrun {NP_PLACEHOLDER} {_HOSTFILE} python {_EXAMPLES}/horovod_mnist_elastic.py",
    Framework.deepspeed: (
        f"deepspeed {_HOSTFILE} {_EXAMPLES}/deepspeed_train.py --deepspeed_config {_EXAMPLES}/ds_zero2.json"
    ),
    # megatron-core's GPT at tensor parallel 2 x data parallel (processes / 2), on CPU through its shim
    Framework.megatron: f"elastrain run --mode restart {_HOSTFILE} python {_EXAMPLES}/megatron_gpt.py",
    Framework.pytorch: (
        f"elastrain run {NP_PLACEHOLDER} {_HOSTFILE} python {_EXAMPLES}/mnist_elastic.py   # or torchrun"
    ),
    Framework.slurm: "sinfo; sbatch -N 2 job.sh   # or: salloc -N 2 elastrain run --slurm python train.py",
}


def launch_commands(framework: Framework, low: int, high: int, gpus_per_container: int) -> tuple[str, str]:
    """The "Run training" hint and the first job of a cluster of `low`..`high` containers: the same
    worker count or range in both."""
    hint = LAUNCH_HINTS[framework].replace(NP_PLACEHOLDER, np_flags(low, gpus_per_container, high))
    return hint, first_job_command(low, gpus_per_container, high)


def cluster_out(cluster: Cluster) -> schemas.ClusterOut:
    """The API view of a cluster row."""
    mounts = json.loads(cluster.mounts or "[]")
    low, high = own_bounds(cluster)
    hint, first_job = launch_commands(cluster.framework, low, high, cluster.gpus_per_container)
    return schemas.ClusterOut(
        name=cluster.name,
        owner=cluster.owner.name,
        framework=cluster.framework,
        state=cluster.state,
        reason=redact(cluster.reason or ""),
        desired_containers=cluster.desired_containers,
        gpus_per_container=cluster.gpus_per_container,
        shm=format_size(cluster.shm_bytes),
        shm_bytes=cluster.shm_bytes,
        image=cluster.image,
        memory=format_size(cluster.memory_bytes) if cluster.memory_bytes else "",
        cpus=cluster.cpus or 0.0,
        mounts=[shown_mount(m) for m in mounts],
        restart_policy=cluster.restart_policy,
        hostfile_generation=cluster.hostfile_generation,
        launch_hint=hint,
        first_job=first_job,
        min_containers=low,
        max_containers=high,
        priority=cluster.priority or 0,
        size_reason=redact(cluster.size_reason or ""),
        idle_release_after=cluster.idle_release_after,
        gpu_type=cluster.gpu_type,
        created_at=aware(cluster.created_at) or cluster.created_at,
        containers=[
            schemas.ContainerOut(
                name=k.name,
                role=k.role,
                address=k.address,
                gpus=k.gpus,
                gpu_ids=parse_gpu_ids(k.gpu_ids),
                state=k.state,
                reason=redact(k.reason or ""),
                pid=k.pid,
                started_at=aware(k.started_at),
            )
            for k in cluster.containers
        ],
    )
