"""Resource figures of containers and GPUs, read where the kernel and the driver keep them.

* cgroups: a container's CPU time and memory from the cgroup of its init process (``/proc/PID/cgroup``),
  on cgroup v1, v2 or a hybrid of both (v1 controllers are read where they are mounted, else the unified
  v2 hierarchy);
* /proc: the summed CPU time and resident memory of a set of processes (the process backend's
  containers have no cgroup of their own);
* NVML (``pynvml`` of nvidia-ml-py): each GPU's name, utilisation and memory. Where NVML cannot start
  (no driver, no library, no device) the answer is "no GPUs", never an error and never a made-up figure.

Every reader answers None (or an empty figure) for what it cannot read: a container that just ended, a
controller that is not mounted, a file this user may not open.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
NO_LIMIT_V1 = 1 << 62  # cgroup v1 reports "no limit" as a huge page-rounded number near 2**63
NO_GPUS = "no GPUs"


class UsageSource(str, enum.Enum):
    """Where a container's figures come from."""

    cgroup = "cgroup"  # the container's own cgroup (every process in it, ended ones' CPU time included)
    processes = "processes"  # the live processes carrying the container's marker, summed from /proc
    unavailable = "unavailable"  # nothing honest to report (see the note)


@dataclass(frozen=True)
class ContainerUsage:
    """One container's figures at one moment; None: not readable (never a guess)."""

    source: UsageSource
    cpu_seconds: float | None = None  # CPU time used since the container started
    memory_bytes: int | None = None  # working set: resident memory less reclaimable page cache
    memory_limit_bytes: int | None = None  # None: no limit (or not known)
    note: str = ""  # why figures are missing, or what they cover

    @classmethod
    def unavailable(cls, note: str) -> ContainerUsage:
        """No figures, saying why."""
        return cls(UsageSource.unavailable, note=note)


# --- cgroups -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CgroupMount:
    """Where one hierarchy is mounted: `root` is the hierarchy path shown at `mountpoint`."""

    mountpoint: Path
    root: str


def cgroup_mounts(mountinfo: Path = PROC / "self" / "mountinfo") -> dict[str, CgroupMount]:
    """Controller -> its mount (``""``: the unified v2 hierarchy), from a ``mountinfo`` file."""
    found: dict[str, CgroupMount] = {}
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        mount = CgroupMount(Path(fields[4].replace("\\040", " ")), fields[3])
        if rest[0] == "cgroup2":
            found.setdefault("", mount)
        elif rest[0] == "cgroup":
            for option in rest[2].split(","):
                if option in ("cpu", "cpuacct", "memory"):
                    found.setdefault(option, mount)
    return found


def cgroup_paths(pid: int, proc: Path = PROC) -> dict[str, str]:
    """Controller -> `pid`'s cgroup path (``""``: its v2 path), from ``/proc/PID/cgroup``."""
    found: dict[str, str] = {}
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:
            found[""] = path
        for controller in controllers.split(","):
            if controller:
                found[controller] = path
    return found


def _directory(mount: CgroupMount, path: str) -> Path:
    """The directory of cgroup `path` under `mount` (a mount of a sub-tree shows paths below its root)."""
    root = mount.root.rstrip("/")
    # inside a container the mount's root is often the process's own cgroup: it is the mountpoint itself
    relative = path[len(root) :] if root and (path == root or path.startswith(root + "/")) else path
    return mount.mountpoint / relative.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _stat_value(path: Path, key: str) -> int | None:
    """The value of `key` in a ``KEY VALUE`` lines file (cpu.stat, memory.stat)."""
    text = _read(path)
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _cpu_seconds(mounts: dict[str, CgroupMount], paths: dict[str, str]) -> float | None:
    for controller in ("cpuacct", "cpu"):  # v1: cpuacct.usage in nanoseconds
        if controller in mounts and controller in paths:
            usage = _int(_read(_directory(mounts[controller], paths[controller]) / "cpuacct.usage"))
            if usage is not None:
                return usage / 1e9
    if "" in mounts and "" in paths:  # v2: cpu.stat is in every cgroup, controller enabled or not
        usec = _stat_value(_directory(mounts[""], paths[""]) / "cpu.stat", "usage_usec")
        if usec is not None:
            return usec / 1e6
    return None


def _memory(mounts: dict[str, CgroupMount], paths: dict[str, str]) -> tuple[int | None, int | None]:
    """(working set, limit) in bytes; the working set leaves out inactive page cache, as kubelet does."""
    if "memory" in mounts and "memory" in paths:
        base = _directory(mounts["memory"], paths["memory"])
        usage = _int(_read(base / "memory.usage_in_bytes"))
        if usage is not None:
            inactive = _stat_value(base / "memory.stat", "total_inactive_file") or 0
            limit = _int(_read(base / "memory.limit_in_bytes"))
            return max(0, usage - inactive), limit if limit is not None and limit < NO_LIMIT_V1 else None
    if "" in mounts and "" in paths:
        base = _directory(mounts[""], paths[""])
        current = _int(_read(base / "memory.current"))
        if current is not None:
            inactive = _stat_value(base / "memory.stat", "inactive_file") or 0
            return max(0, current - inactive), _int(_read(base / "memory.max"))  # "max": no limit
    return None, None


def cgroup_usage(pid: int, proc: Path = PROC, mountinfo: Path | None = None) -> ContainerUsage:
    """The figures of the cgroup `pid` is in (the container's, when `pid` is its init process)."""
    paths = cgroup_paths(pid, proc)
    if not paths:
        return ContainerUsage.unavailable(f"process {pid} has ended or its cgroup is unreadable")
    mounts = cgroup_mounts(mountinfo if mountinfo is not None else proc / "self" / "mountinfo")
    cpu = _cpu_seconds(mounts, paths)
    memory, limit = _memory(mounts, paths)
    if cpu is None and memory is None:
        return ContainerUsage.unavailable(f"no readable cpu or memory controller for process {pid}")
    return ContainerUsage(UsageSource.cgroup, cpu, memory, limit)


# --- /proc -------------------------------------------------------------------------------------------
def _ticks_per_second() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def process_cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """`pid`'s user + system CPU time (its own, not its ended children's)."""
    text = _read(proc / str(pid) / "stat")
    if text is None or ")" not in text:
        return None
    fields = text.rpartition(")")[2].split()  # the command name may hold spaces: skip past it
    try:
        return (int(fields[11]) + int(fields[12])) / _ticks_per_second()
    except (IndexError, ValueError):
        return None


def process_rss_bytes(pid: int, proc: Path = PROC) -> int | None:
    """`pid`'s resident memory (VmRSS)."""
    for line in (_read(proc / str(pid) / "status") or "").splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def processes_usage(pids: Iterable[int], proc: Path = PROC) -> ContainerUsage:
    """The summed figures of the live processes `pids` (a container without a cgroup of its own)."""
    cpu, memory, counted = 0.0, 0, 0
    for pid in pids:
        seconds, rss = process_cpu_seconds(pid, proc), process_rss_bytes(pid, proc)
        if seconds is None or rss is None:
            continue  # ended while we looked
        cpu, memory, counted = cpu + seconds, memory + rss, counted + 1
    if not counted:
        return ContainerUsage.unavailable("no live process of the container")
    note = f"{counted} live process{'es' if counted > 1 else ''} (ended ones' CPU time is not counted)"
    return ContainerUsage(UsageSource.processes, cpu, memory, None, note)


# --- NVML --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuReading:
    """One GPU as NVML reports it; None for a figure this device does not report."""

    index: int
    name: str
    utilization_percent: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class GpuSnapshot:
    """Every GPU NVML sees, or why there are none (`note` is "no GPUs: ..." then)."""

    gpus: tuple[GpuReading, ...]
    note: str = ""

    @property
    def available(self) -> bool:
        """NVML answered and lists at least one GPU."""
        return bool(self.gpus)


class Nvml:
    """NVML, started once on first use and kept; when it cannot start, every snapshot says "no GPUs".

    A failed start is retried at most every `retry_s` seconds (a driver loaded later is picked up)."""

    def __init__(self, retry_s: float = 60.0) -> None:
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._started = False
        self._failed_at: float | None = None
        self._why = ""

    def _start(self) -> bool:
        if self._started:
            return True
        if self._failed_at is not None and time.monotonic() - self._failed_at < self.retry_s:
            return False
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError...
            self._failed_at, self._why = time.monotonic(), f"NVML cannot start ({type(exc).__name__})"
            return False
        self._started = True
        return True

    def snapshot(self) -> GpuSnapshot:
        """Every GPU's current figures."""
        with self._lock:
            if not self._start():
                return GpuSnapshot((), f"{NO_GPUS}: {self._why}")
            import pynvml

            try:
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as exc:
                return GpuSnapshot((), f"{NO_GPUS}: NVML cannot count devices ({exc})")
            try:
                gpus = tuple(self._reading(index) for index in range(count))
            except pynvml.NVMLError as exc:
                return GpuSnapshot((), f"{NO_GPUS}: NVML cannot read a device ({exc})")
        return GpuSnapshot(gpus, "" if gpus else f"{NO_GPUS}: NVML lists no device")

    @staticmethod
    def _reading(index: int) -> GpuReading:
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        try:
            utilization: float | None = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError:  # e.g. NOT_SUPPORTED on some devices: not known, not zero
            utilization = None
        used: int | None = None
        total: int | None = None
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = int(memory.used), int(memory.total)
        except pynvml.NVMLError:
            pass
        return GpuReading(index, name, utilization, used, total)

    def close(self) -> None:
        """Shut NVML down (a later snapshot starts it again)."""
        with self._lock:
            if self._started:
                import pynvml

                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass
                self._started = False
