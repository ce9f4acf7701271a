"""Response models of a cluster's resource figures (``GET /api/v1/clusters/{name}/usage``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from elastrain.backends.usage import UsageSource
from elastrain.db.models import ContainerRole, ContainerState
from elastrain.server.fields import UtcDatetime


class GpuUsageOut(BaseModel):
    """One GPU of a container, as NVML reports it now (null: a figure the device does not report)."""

    index: int = Field(description="the GPU's NVML index (its id in the container's `gpu_ids`)")
    name: str = Field(description="NVML's device name", examples=["NVIDIA H200"])
    utilization_percent: float | None = Field(description="busy share of the last sample period, 0-100")
    memory_used_bytes: int | None
    memory_total_bytes: int | None


class ContainerUsageOut(BaseModel):
    """One container's CPU, memory and GPU figures; null where nothing honest can be reported."""

    name: str
    role: ContainerRole
    state: ContainerState
    source: UsageSource = Field(
        description="`cgroup`: the container's own cgroup (container backend); `processes`: its live "
        "processes summed from /proc (process backend); `unavailable`: none (see `note`)"
    )
    cpu_percent: float | None = Field(
        description="CPU use over the last sample period, 100 = one full core (as `docker stats`)"
    )
    cpu_seconds: float | None = Field(description="CPU time used since the container started")
    cpu_limit_cores: float | None = Field(description="the cluster's CPU limit per container (null: none)")
    memory_bytes: int | None = Field(description="working set: memory in use less inactive page cache")
    memory_limit_bytes: int | None = Field(description="the container's memory limit (null: none known)")
    gpus: list[GpuUsageOut] = Field(description="the container's GPUs ([]: see `gpu_note`)")
    gpu_note: str = Field(
        description="why `gpus` is empty: 'no GPUs' (none assigned, or NVML cannot start on this node) "
        "or 'virtual GPUs' (slots without a device); '' when `gpus` lists them",
        examples=["no GPUs: NVML cannot start (NVMLError_LibraryNotFound)"],
    )
    note: str = Field(description="what the figures cover, or why they are missing")


class ClusterUsageOut(BaseModel):
    """Resource figures of every container of a cluster at `sampled_at`."""

    cluster: str
    sampled_at: UtcDatetime
    gpu_model: str = Field(description="this node's GPU model as NVML names it ('' for none)")
    gpu_note: str = Field(description="'' when NVML answers; else why there are no GPU figures ('no GPUs')")
    containers: list[ContainerUsageOut]
