"""Where the job's hosts come from: a static list, a watched hostfile, a discovery script, or Slurm."""

from __future__ import annotations

import abc
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from elastrain.errors import ConfigError, HostfileError
from elastrain.hostfile import Host, Hostfile, parse_host_list, parse_hostfile, read_hostfile

log = logging.getLogger("elastrain.hosts")


class HostSource(abc.ABC):
    """Produces the current host list and, for watched sources, calls back on every change."""

    @abc.abstractmethod
    def read(self) -> Hostfile:
        """The current hosts; raises HostfileError when unreadable."""

    def watch(self, on_change: Callable[[Hostfile], None], stop: threading.Event, interval_s: float) -> None:
        """Poll for changes until `stop` is set (static sources never change)."""
        last = self.read()
        while not stop.wait(interval_s):
            try:
                current = self.read()
            except HostfileError as exc:
                log.warning("%s (keeping the previous host list)", exc)
                continue
            if current != last:
                last = current
                on_change(current)


class StaticHosts(HostSource):
    """``-H host:slots,...`` or a single local host: never changes."""

    def __init__(self, hostfile: Hostfile) -> None:
        self._hostfile = hostfile

    def read(self) -> Hostfile:
        return self._hostfile

    def watch(self, on_change: Callable[[Hostfile], None], stop: threading.Event, interval_s: float) -> None:
        stop.wait()


class WatchedHostfile(HostSource):
    """A hostfile re-read whenever its content changes (the platform rewrites it atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last_stat: tuple[int, int, int] | None = None
        self._last: Hostfile | None = None

    def read(self) -> Hostfile:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise HostfileError(f"hostfile {self.path} does not exist; create it or fix --hostfile") from None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key != self._last_stat or self._last is None:
            self._last = read_hostfile(self.path)
            self._last_stat = key
        return self._last


class DiscoveryScript(HostSource):
    """A horovodrun-style ``--host-discovery-script``: prints ``host:slots`` lines."""

    def __init__(self, script: str) -> None:
        self.script = script

    def read(self) -> Hostfile:
        try:
            out = subprocess.run([self.script], capture_output=True, text=True, timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise HostfileError(f"host discovery script {self.script} failed: {exc}") from None
        lines = []
        for line in out.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, slots = line.rpartition(":") if ":" in line else (line, "", "")
                lines.append(f"{name} slots={slots or 1}")
        return parse_hostfile("\n".join(lines), f"output of {self.script}")


class SlurmHosts(HostSource):
    """The nodes of the Slurm allocation `elastrain run` runs in, watched: SLURM_JOB_NODELIST and the
    task counts at the start, then the job's NodeList (``scontrol show job``) as it changes.

    The allocation changes when it grows (with `max_np`, `elastrain.launcher.slurm_grow` expands it
    onto idle nodes of its partition, once) or when the platform shrinks it at scale-in. A node whose
    agent step is signalled (preemption, scale-in) leaves through its workers first; the list follows.
    New nodes get `nproc_per_node` slots, else the slots every starting node had (else 1).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        nproc_per_node: int | None = None,
        max_np: int | None = None,
        runner: Callable[..., subprocess.CompletedProcess[str] | None] | None = None,
    ) -> None:
        from elastrain.launcher.slurm import allocation_slots
        from elastrain.launcher.slurm_grow import grower_for, run_slurm

        env = os.environ if env is None else env
        slots = allocation_slots(env, nproc_per_node)
        counts = set(slots.values())
        self.slots_per_node = nproc_per_node or (counts.pop() if len(counts) == 1 else 1)
        self.job_id = env.get("SLURM_JOB_ID")
        self.runner = runner or run_slurm
        self._slots = dict(slots)
        self._last = Hostfile(tuple(Host(name, n) for name, n in slots.items()))
        self.grower = grower_for(env, self.slots_per_node, max_np, self._last.total_slots)
        if self.grower is not None:
            self.grower.runner = self.runner

    def read(self) -> Hostfile:
        if not self.job_id:
            return self._last
        from elastrain.launcher.slurm_grow import job_nodes

        nodes = job_nodes(self.job_id, self.runner)  # None while unreadable: keep the last list
        if nodes is not None and [h.name for h in self._last.hosts] != nodes:
            self._last = Hostfile(tuple(Host(n, self._slots.get(n, self.slots_per_node)) for n in nodes))
        return self._last

    def watch(self, on_change: Callable[[Hostfile], None], stop: threading.Event, interval_s: float) -> None:
        """Follow the job's NodeList (at most once a second); grow the allocation if allowed."""
        if not self.job_id:
            stop.wait()
            return
        if self.grower is not None:
            threading.Thread(
                target=self.grower.run,
                args=(lambda: [h.name for h in self._last.hosts], stop),
                name="elastrain-slurm-grow",
                daemon=True,
            ).start()
        super().watch(on_change, stop, max(interval_s, 1.0))


def make_host_source(
    host_list: str | None,
    hostfile: str | None,
    discovery: str | None,
    nproc_per_node: int | None,
    np: int | None,
    slurm: bool = False,
    max_np: int | None = None,
) -> HostSource:
    """Pick the host source from the launcher's flags (at most one of -H, --hostfile, discovery).

    Without any of them, inside a Slurm allocation (SLURM_JOB_ID set) or with `slurm`, the
    allocation's nodes are the hosts (watched; with `max_np` the allocation grows onto idle nodes of
    its partition); otherwise this machine alone.
    """
    given = [x for x in (host_list, hostfile, discovery) if x]
    if len(given) > 1:
        raise ConfigError("give only one of -H, --hostfile and --host-discovery-script")
    if slurm and given:
        raise ConfigError("--slurm takes the hosts from the allocation; drop -H/--hostfile/discovery")
    if slurm or (not given and os.environ.get("SLURM_JOB_ID")):
        return SlurmHosts(nproc_per_node=nproc_per_node, max_np=max_np)
    if host_list:
        hosts = parse_host_list(host_list)
        if nproc_per_node:
            hosts = parse_host_list(",".join(f"{h.name}:{nproc_per_node}" for h in hosts.hosts))
        return StaticHosts(hosts)
    if hostfile:
        return WatchedHostfile(Path(hostfile))
    if discovery:
        if not Path(discovery).exists():
            raise ConfigError(f"host discovery script {discovery} does not exist")
        return DiscoveryScript(discovery)
    slots = nproc_per_node or np or 1
    return StaticHosts(parse_host_list(f"127.0.0.1:{slots}"))
