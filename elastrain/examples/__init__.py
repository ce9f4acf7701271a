"""Examples shipped inside the package, so they sit at one fixed import path wherever elastrain is
installed: every image, the process backend's host, a Slurm node (``python -m elastrain.examples.NAME``).

`first_job_command` is the command a fresh cluster suggests (the portal's job box, the next step that
`elastrain cluster create` prints). It is `elastrain run`, not a framework's own launcher: every image
holds it, as do the process and Slurm backends (which have no image and no ``horovodrun``); the
cluster's framework keeps its own launch command in the cluster's "Run training" hint.
"""

from __future__ import annotations

FIRST_JOB_MODULE = "elastrain.examples.first_job"
HOSTFILE = "/etc/mpi/hostfile"
NP_PLACEHOLDER = "{np}"
# the portal fills in {np} from the cluster it shows (cluster.js); the CLI calls `first_job_command`
FIRST_JOB_TEMPLATE = f"elastrain run -np {NP_PLACEHOLDER} --hostfile {HOSTFILE} python -m {FIRST_JOB_MODULE}"


def hostfile_slots(containers: int, gpus_per_container: int) -> int:
    """The worker slots a cluster's hostfile gives once every container runs: one line per container
    (the launcher trains too), slots = the container's GPUs, at least 1 (`server.policy.hostfile_hosts`)."""
    return max(containers, 0) * max(gpus_per_container, 1)


def first_job_command(containers: int, gpus_per_container: int = 0) -> str:
    """The first job's command line for a cluster of this size: ``-np`` = every slot of the hostfile."""
    return FIRST_JOB_TEMPLATE.replace(NP_PLACEHOLDER, str(hostfile_slots(containers, gpus_per_container)))
