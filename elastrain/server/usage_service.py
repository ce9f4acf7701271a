"""A cluster's resource figures: the backend's CPU and memory per container, NVML's GPU figures.

`UsageService.cluster_usage` answers ``GET /api/v1/clusters/{name}/usage`` and feeds the usage series
of ``/metrics``. CPU % needs two readings: the service keeps each container's last CPU time, and when it
has none recent it reads twice, `sample_s` apart (the API route only; a scrape exports the CPU-seconds
counter and lets Prometheus take the rate).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi.requests import HTTPConnection

from elastrain.backends.api import Backend
from elastrain.backends.usage import NO_GPUS, ContainerUsage, GpuSnapshot, Nvml
from elastrain.db.models import Cluster, ContainerRole, ContainerState, User, utcnow
from elastrain.db.repository import find_cluster
from elastrain.db.session import Database
from elastrain.server.errors import NotFound
from elastrain.server.inventory import Inventory, parse_gpu_ids
from elastrain.server.usage_schemas import ClusterUsageOut, ContainerUsageOut, GpuUsageOut

FRESH_S = 60.0  # an earlier CPU reading older than this is too old for a "current" CPU %
CACHE_S = 1.0  # backend readings this recent are reused (a page poll and a scrape at once)
NO_BACKEND_FIGURES = "not available: this backend reports no resource figures"


@dataclass(frozen=True)
class ContainerRow:
    """What the figures of one container need from its database row."""

    name: str
    role: ContainerRole
    state: ContainerState
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class ClusterRow:
    """What the figures of a cluster need from its database rows (read while the session is open)."""

    name: str
    uid: str
    cpus: float
    memory_bytes: int
    containers: tuple[ContainerRow, ...]

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterRow:
        """The row's copy (loads its containers)."""
        rows = tuple(
            ContainerRow(k.name, k.role, k.state, tuple(parse_gpu_ids(k.gpu_ids or "")))
            for k in cluster.containers
        )
        return cls(cluster.name, cluster.uid, cluster.cpus or 0.0, cluster.memory_bytes or 0, rows)


class UsageService:
    """Reads the figures of a cluster's containers (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        backend: Backend,
        inventory: Inventory,
        nvml: Nvml | None = None,
        sample_s: float = 0.25,
    ) -> None:
        self.db, self.backend, self.inventory = db, backend, inventory
        self.nvml = nvml if nvml is not None else Nvml()
        self.sample_s = sample_s
        self._lock = threading.Lock()
        self._cpu: dict[tuple[str, str], tuple[float, float]] = {}  # (uid, container) -> (when, cpu s)
        self._cache: dict[str, tuple[float, dict[str, ContainerUsage]]] = {}  # uid -> (when, figures)

    # --- reading ----------------------------------------------------------------------------------
    def _read(self, cluster: str, uid: str, fresh: bool = False) -> tuple[float, dict[str, ContainerUsage]]:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(uid)
        if cached is not None and not fresh and now - cached[0] < CACHE_S:
            return cached
        figures = (time.monotonic(), self.backend.usage(cluster, uid))
        with self._lock:
            self._cache[uid] = figures
        return figures

    def _cpu_percent(self, uid: str, figures: tuple[float, dict[str, ContainerUsage]]) -> dict[str, float]:
        """CPU % since each container's previous reading (and remember this one)."""
        when, usage = figures
        found: dict[str, float] = {}
        with self._lock:
            for name, reading in usage.items():
                if reading.cpu_seconds is None:
                    continue
                before = self._cpu.get((uid, name))
                if before is not None and 0.01 < when - before[0] <= FRESH_S:
                    found[name] = max(0.0, 100.0 * (reading.cpu_seconds - before[1]) / (when - before[0]))
                if before is None or when - before[0] > 0.01:
                    self._cpu[(uid, name)] = (when, reading.cpu_seconds)
        return found

    def forget(self, live: Iterable[str]) -> None:
        """Drop what is kept of clusters whose uid is not in `live`."""
        keep = set(live)
        with self._lock:
            self._cpu = {k: v for k, v in self._cpu.items() if k[0] in keep}
            self._cache = {k: v for k, v in self._cache.items() if k in keep}

    # --- answers ----------------------------------------------------------------------------------
    def for_user(self, user: User, name: str) -> ClusterUsageOut:
        """The figures of the caller's cluster `name` (404 for a cluster that is not theirs)."""
        with self.db.session() as session:
            cluster = find_cluster(session, user, name)
            if cluster is None:
                raise NotFound(f"cluster {name!r} not found")
            row = ClusterRow.of(cluster)
        return self.cluster_usage(row, sample_cpu=True)

    def cluster_usage(self, cluster: ClusterRow, *, sample_cpu: bool = False) -> ClusterUsageOut:
        """Figures of `cluster`'s containers; with `sample_cpu`, a container without a recent CPU
        reading is read twice for its CPU %."""
        figures = self._read(cluster.name, cluster.uid)
        percent = self._cpu_percent(cluster.uid, figures)
        if sample_cpu and any(n not in percent and u.cpu_seconds is not None for n, u in figures[1].items()):
            time.sleep(self.sample_s)
            figures = self._read(cluster.name, cluster.uid, fresh=True)
            percent = self._cpu_percent(cluster.uid, figures)
        gpus = self.gpu_snapshot()  # cheap where NVML cannot start: the failure is remembered
        out = [
            self._container(cluster, k, figures[1].get(k.name), percent.get(k.name), gpus)
            for k in cluster.containers
        ]
        return ClusterUsageOut(
            cluster=cluster.name,
            sampled_at=utcnow(),
            gpu_model=self.inventory.gpu_model,
            gpu_note=gpus.note,
            containers=out,
        )

    def gpu_snapshot(self) -> GpuSnapshot:
        """NVML's figures of every GPU (none, saying why, on a node without them)."""
        return self.nvml.snapshot()

    def _virtual_note(self) -> str:
        return f"{NO_GPUS}: this node's GPUs are virtual slots (--gpus), without devices to read"

    def _container(
        self,
        cluster: ClusterRow,
        row: ContainerRow,
        usage: ContainerUsage | None,
        cpu_percent: float | None,
        snapshot: GpuSnapshot | None,
    ) -> ContainerUsageOut:
        if usage is None:
            running = row.state == ContainerState.Running
            why = NO_BACKEND_FIGURES if running else f"not available: the container is {row.state.value}"
            usage = ContainerUsage.unavailable(why)
        gpus, gpu_note = self._gpus(row, snapshot)
        limit = usage.memory_limit_bytes
        if limit is None and cluster.memory_bytes:
            limit = cluster.memory_bytes  # the requested limit, where the backend cannot read one
        return ContainerUsageOut(
            name=row.name,
            role=row.role,
            state=row.state,
            source=usage.source,
            cpu_percent=None if cpu_percent is None else round(cpu_percent, 1),
            cpu_seconds=usage.cpu_seconds,
            cpu_limit_cores=cluster.cpus or None,
            memory_bytes=usage.memory_bytes,
            memory_limit_bytes=limit,
            gpus=gpus,
            gpu_note=gpu_note,
            note=usage.note,
        )

    def _gpus(self, row: ContainerRow, snapshot: GpuSnapshot | None) -> tuple[list[GpuUsageOut], str]:
        """The container's GPUs from `snapshot`, or why there are none."""
        ids = row.gpu_ids
        if not ids:
            return [], f"{NO_GPUS}: the container has none"
        if not self.inventory.real:
            return [], self._virtual_note()
        if snapshot is None or not snapshot.available:
            return [], snapshot.note if snapshot is not None else f"{NO_GPUS}: NVML was not read"
        by_index = {g.index: g for g in snapshot.gpus}
        found = [by_index[i] for i in ids if i in by_index]
        out = [
            GpuUsageOut(
                index=g.index,
                name=g.name,
                utilization_percent=g.utilization_percent,
                memory_used_bytes=g.memory_used_bytes,
                memory_total_bytes=g.memory_total_bytes,
            )
            for g in found
        ]
        missing = ",".join(str(i) for i in ids)
        return out, "" if out else f"{NO_GPUS}: NVML does not list GPU {missing}"

    def close(self) -> None:
        """Shut NVML down."""
        self.nvml.close()


def get_usage(connection: HTTPConnection) -> UsageService:
    """The app's `UsageService` (a route dependency)."""
    usage: UsageService = connection.app.state.usage
    return usage
