"""Examples shipped inside the package, so they sit at one fixed import path wherever elastrain is
installed: every image, the process backend's host, a Slurm node (``python -m elastrain.examples.NAME``).

`first_job_command` is the command a fresh cluster suggests (the portal's job box, the next step that
`elastrain cluster create` prints). It is `elastrain run`, not a framework's own launcher: every image
holds it, as do the process and Slurm backends (which have no image and no ``horovodrun``); the
cluster's framework keeps its own launch command in the cluster's "Run training" hint. Both take their
worker count from `np_flags`: ``-np N`` for a fixed-size cluster, ``--min-np A --max-np B`` for an
elastic one, A and B the hostfile's slots at the cluster's minimum and maximum size, so the job grows
and shrinks with the cluster.
"""

from __future__ import annotations

FIRST_JOB_MODULE = "elastrain.examples.first_job"
HOSTFILE = "/etc/mpi/hostfile"
NP_PLACEHOLDER = "{np}"
FIRST_JOB_TEMPLATE = f"elastrain run {NP_PLACEHOLDER} --hostfile {HOSTFILE} python -m {FIRST_JOB_MODULE}"


def hostfile_slots(containers: int, gpus_per_container: int) -> int:
    """The worker slots a cluster's hostfile gives once every container runs: one line per container
    (the launcher trains too), slots = the container's GPUs, at least 1 (`server.policy.hostfile_hosts`)."""
    return max(containers, 0) * max(gpus_per_container, 1)


def np_flags(containers: int, gpus_per_container: int = 0, max_containers: int | None = None) -> str:
    """The worker count of a job on a cluster of `containers` (its minimum) to `max_containers`:
    ``-np N`` (every slot of the hostfile) when they are equal, else ``--min-np A --max-np B``."""
    low = hostfile_slots(containers, gpus_per_container)
    high = hostfile_slots(max(max_containers or containers, containers), gpus_per_container)
    return f"-np {low}" if low == high else f"--min-np {low} --max-np {high}"


def first_job_command(containers: int, gpus_per_container: int = 0, max_containers: int | None = None) -> str:
    """The first job's command line for a cluster of `containers` (its minimum) to `max_containers`
    (None: fixed) containers: ``-np``, or the elastic range, from `np_flags`."""
    return FIRST_JOB_TEMPLATE.replace(
        NP_PLACEHOLDER, np_flags(containers, gpus_per_container, max_containers)
    )
